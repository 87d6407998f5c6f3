"""A Paddle worker of the runtime's multi-process tests and benchmarks (run as a script).

`--kind ledger` (the per-sample counter) or `--kind mlp` (a small float64 MLP with
Momentum): see `elastic_job.py`, whose loop it runs.

At the end it writes `<out>/<worker>.npz` (final parameters) and `<out>/<worker>.json`.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np
import paddle
from paddle import nn

if not __package__:  # run as a script: the repository's root is where `tests` is found
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.runtime.elastic_job import arguments, policy, training, waiting_for_gate
from trainer_runtime.paddle import AdaptiveBatch, session


class Counter(nn.Layer):
    def __init__(self, samples: int) -> None:
        super().__init__()
        self.counts = self.create_parameter(
            [samples], dtype="float64", default_initializer=nn.initializer.Constant(0.0)
        )

    def forward(self, index: paddle.Tensor) -> paddle.Tensor:
        return paddle.gather(self.counts, index)


def mlp(width: int = 16) -> nn.Layer:
    paddle.seed(0)
    paddle.set_default_dtype("float64")
    return nn.Sequential(nn.Linear(8, width), nn.Tanh(), nn.Linear(width, 2))


def mlp_arrays(samples: int) -> tuple[np.ndarray, np.ndarray]:
    inputs = np.random.default_rng(1).standard_normal((samples, 8))
    return inputs, (inputs[:, 0] > 0).astype(np.int64)


def mlp_data(samples: int) -> paddle.io.TensorDataset:
    inputs, targets = mlp_arrays(samples)
    return paddle.io.TensorDataset([paddle.to_tensor(inputs), paddle.to_tensor(targets)])


def momentum(model: nn.Layer) -> paddle.optimizer.Momentum:
    return paddle.optimizer.Momentum(learning_rate=0.1, momentum=0.9, parameters=model.parameters())


def main() -> None:
    args = arguments().parse_args()
    paddle.set_device("cpu")
    worker = os.environ["EDL_WORKER_ID"]
    model: nn.Layer
    if args.kind == "ledger":
        model = Counter(args.samples)
        optimizer: paddle.optimizer.Optimizer = paddle.optimizer.SGD(
            learning_rate=1.0, parameters=model.parameters()
        )
        dataset = paddle.io.TensorDataset([paddle.arange(args.samples, dtype="int64")])
    else:
        model = mlp()
        optimizer = momentum(model)
        dataset = mlp_data(args.samples)
    trace = args.trace.open("a", buffering=1) if args.trace else None
    waiting_for_gate(args)
    with session(model, optimizer, dataset, policy(args, AdaptiveBatch)) as s:
        summary = training(s, args, nn.functional.cross_entropy, trace)
        summary["states_sent"] = [[generation, sent] for generation, sent in s.states_sent]
    args.out.mkdir(parents=True, exist_ok=True)
    arrays = {key: value.numpy() for key, value in model.state_dict().items()}
    np.savez(args.out / f"{worker}.npz", **arrays)  # type: ignore[arg-type]
    (args.out / f"{worker}.json").write_text(json.dumps({**summary, "pid": os.getpid()}))


if __name__ == "__main__":
    main()
