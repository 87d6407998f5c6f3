"""A Paddle parameter-server worker of the runtime tests (run as a script).

`--kind ledger`: the model is the ledger, one embedding table with a row per sample (the
sample's id is its row), declared sparse: each step pulls and pushes only the rows of its
samples; the loss gives each of them a gradient of -1 after the window's mean, and SGD at
rate 1 on the servers adds exactly 1 to a row each time its sample is trained, so after the
job every row must equal the number of epochs. `--kind ctr`: a small click-through-rate
model in float64 (two categorical fields looked up in a sparse embedding table, beside dense
features, then an MLP), trained with momentum (lazy on the table's rows).

With `--gate FILE` it starts training once the file exists. At the end it writes
`<out>/<worker>.npz` (final parameters) and `<out>/<worker>.json`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import paddle
from paddle import nn

if not __package__:  # run as a script: the repository's root is where `tests` is found
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.runtime.elastic_job import waiting_for_gate
from trainer_runtime.paddle.ps import Consistency, PsConfig, ps_session

VOCABULARY, WIDTH, FIELDS, FEATURES = 40, 4, 2, 3


class Ledger(nn.Layer):
    def __init__(self, samples: int) -> None:
        super().__init__()
        self.counts = nn.Embedding(
            samples, 1, weight_attr=nn.initializer.Constant(0.0), sparse=False
        )

    def forward(self, index: paddle.Tensor) -> paddle.Tensor:
        return self.counts(index)


class Ctr(nn.Layer):
    def __init__(self) -> None:
        super().__init__()
        self.embedding = nn.Embedding(VOCABULARY, WIDTH)
        self.hidden = nn.Linear(FIELDS * WIDTH + FEATURES, 8)
        self.out = nn.Linear(8, 1)

    def forward(self, ids: paddle.Tensor, dense: paddle.Tensor) -> paddle.Tensor:
        looked = self.embedding(ids).reshape([ids.shape[0], FIELDS * WIDTH])
        hidden = paddle.tanh(self.hidden(paddle.concat([looked, dense], axis=1)))
        return self.out(hidden).reshape([-1])


def ctr() -> Ctr:
    paddle.seed(0)
    paddle.set_default_dtype("float64")
    return Ctr()


def ctr_arrays(samples: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(3)
    ids = rng.integers(0, VOCABULARY, size=(samples, FIELDS))
    dense = rng.standard_normal((samples, FEATURES))
    clicks = ((ids[:, 0] % 3 == 0) ^ (dense[:, 0] > 0.5)).astype(np.float64)
    return ids, dense, clicks


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--kind", choices=["ledger", "ctr"], required=True)
    parser.add_argument("--samples", type=int, required=True)
    parser.add_argument("--global-batch", type=int, default=8)
    parser.add_argument("--consistency", choices=[c.value for c in Consistency], default="sync")
    parser.add_argument("--snapshot-dir", type=Path, required=True)
    parser.add_argument("--snapshot-every", type=int, default=5)
    parser.add_argument("--step-sleep-s", type=float, default=0.0)
    parser.add_argument("--gate", type=Path)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    paddle.set_device("cpu")
    worker = os.environ["EDL_WORKER_ID"]
    model: nn.Layer
    if args.kind == "ledger":
        model = Ledger(args.samples)
        dataset = paddle.io.TensorDataset([paddle.arange(args.samples, dtype="int64")])
        sparse = {"counts.weight": lambda batch: batch[0]}
        lr, momentum = 1.0, 0.0
    else:
        model = ctr()
        dataset = paddle.io.TensorDataset([paddle.to_tensor(a) for a in ctr_arrays(args.samples)])
        sparse = {"embedding.weight": lambda batch: batch[0]}
        lr, momentum = 0.1, 0.9
    config = PsConfig(
        global_batch=args.global_batch,
        lr=lr,
        momentum=momentum,
        snapshot_dir=args.snapshot_dir,
        consistency=Consistency(args.consistency),
        snapshot_every=args.snapshot_every,
    )
    waiting_for_gate(args)
    steps = 0
    worlds: set[int] = set()
    with ps_session(model, dataset, config, sparse=sparse) as s:
        for batch in s.batches():
            if args.kind == "ledger":
                (index,) = batch
                loss = -float(s.window_size) * model(index).mean()
            else:
                ids, dense, clicks = batch
                logits = model(ids, dense)
                loss = nn.functional.binary_cross_entropy_with_logits(logits, clicks)
            s.step(loss)
            steps += 1
            worlds.add(s.place.world if s.place else 0)
            if args.step_sleep_s:
                time.sleep(args.step_sleep_s)
        summary = {
            "steps": steps,
            "generations": s.generations_formed,
            "rolled_back": s.rolled_back,
            "worlds": sorted(worlds),
            "pulled": s.pulled,
        }
    args.out.mkdir(parents=True, exist_ok=True)
    arrays = {key: value.numpy() for key, value in model.state_dict().items()}
    np.savez(args.out / f"{worker}.npz", **arrays)  # type: ignore[arg-type]
    (args.out / f"{worker}.json").write_text(json.dumps(summary))


if __name__ == "__main__":
    main()
