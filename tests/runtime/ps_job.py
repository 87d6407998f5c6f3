"""A worker of the parameter-server tests and example (run as a script).

`--kind ledger`: the model is the ledger, a per-sample counter `c` whose gradient is one-hot;
SGD with rate 1 on the servers adds exactly 1 to `c[i]` each time sample i is trained, so
after the job `c` must equal the number of epochs everywhere. `--kind sparse-ledger`: the
same counter as an embedding table (a row per sample) declared sparse, so each step pulls
and pushes only its samples' rows. `--kind mlp`: a small float64
MLP with momentum, for the fixed-global-batch equivalence test.

At the end it writes `<out>/<worker>.pt` (final parameters) and `<out>/<worker>.json`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import TensorDataset

if not __package__:  # run as a script: the repository's root is where `tests` is found
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.runtime.torch_job import Counter, mlp, mlp_data
from trainer_runtime.ps.session import Consistency, PsConfig, ps_session


class SparseCounter(nn.Module):
    """The per-sample counter as an embedding table; `counts` is its one column."""

    def __init__(self, samples: int) -> None:
        super().__init__()
        self.table = nn.Embedding(samples, 1, dtype=torch.float64)
        nn.init.zeros_(self.table.weight)

    def forward(self, index: torch.Tensor) -> torch.Tensor:
        return self.table(index)[:, 0]

    def state_dict(self, *args: Any, **kwargs: Any) -> Any:
        return {"counts": self.table.weight.detach()[:, 0]}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--kind", choices=["ledger", "sparse-ledger", "mlp"], required=True)
    parser.add_argument("--samples", type=int, required=True)
    parser.add_argument("--global-batch", type=int, default=8)
    parser.add_argument("--consistency", choices=[c.value for c in Consistency], default="sync")
    parser.add_argument("--staleness", type=int, default=0)
    parser.add_argument("--snapshot-dir", type=Path, required=True)
    parser.add_argument("--snapshot-every", type=int, default=5)
    parser.add_argument("--step-sleep-s", type=float, default=0.0)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    torch.set_num_threads(1)
    worker = os.environ["EDL_WORKER_ID"]
    sparse = {}
    if args.kind in ("ledger", "sparse-ledger"):
        model: nn.Module = Counter(args.samples)
        if args.kind == "sparse-ledger":
            model = SparseCounter(args.samples)
            sparse = {"table.weight": lambda batch: batch[0]}
        dataset = TensorDataset(torch.arange(args.samples))
        lr, momentum = 1.0, 0.0
    else:
        model = mlp()
        dataset = mlp_data(args.samples)
        lr, momentum = 0.1, 0.9
    config = PsConfig(
        global_batch=args.global_batch,
        lr=lr,
        momentum=momentum,
        snapshot_dir=args.snapshot_dir,
        consistency=Consistency(args.consistency),
        staleness=args.staleness,
        snapshot_every=args.snapshot_every,
    )
    steps = 0
    worlds: set[int] = set()
    with ps_session(model, dataset, config, sparse=sparse) as s:
        for batch in s.batches():
            if args.kind != "mlp":
                (index,) = batch
                loss = (-float(s.window_size) * model(index)).mean()
            else:
                inputs, targets = batch
                loss = nn.functional.cross_entropy(model(inputs), targets)
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
            "pid": os.getpid(),
            "pulled": s.pulled,
        }
    args.out.mkdir(parents=True, exist_ok=True)
    torch.save(
        {k: v.detach().clone() for k, v in model.state_dict().items()}, args.out / f"{worker}.pt"
    )
    (args.out / f"{worker}.json").write_text(json.dumps(summary))


if __name__ == "__main__":
    main()
