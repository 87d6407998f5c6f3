"""A Paddle worker of the runtime's multi-process tests and benchmarks (run as a script).

`--kind ledger`: the model is the ledger, a per-sample counter `c` whose gradient is
one-hot; SGD with rate 1 adds exactly 1 to `c[i]` each time sample i is trained, so after
the job `c` must equal the number of epochs everywhere, whatever resizes and failures
happened. `--kind mlp`: a small float64 MLP with Momentum, for the fixed-global-batch
equivalence test and the benchmarks.

At the end it writes `<out>/<worker>.npz` (final parameters) and `<out>/<worker>.json`.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np
import paddle
from paddle import nn

from trainer_runtime.paddle import KeepGlobalBatch, session


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
    parser = argparse.ArgumentParser()
    parser.add_argument("--kind", choices=["ledger", "mlp"], required=True)
    parser.add_argument("--samples", type=int, required=True)
    parser.add_argument("--global-batch", type=int, default=8)
    parser.add_argument("--step-sleep-s", type=float, default=0.0)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument(
        "--gate",
        type=Path,
        help="wait (up to 300 s) for this file before joining: a test starts a newcomer "
        "early, so that its imports are paid before the moment it joins",
    )
    parser.add_argument(
        "--trace", type=Path, help="append 'ready TIME WORKER' and 'step TIME gGEN WORLD PID'"
    )
    args = parser.parse_args()
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
    steps = 0
    worlds: set[int] = set()
    trace = args.trace.open("a", buffering=1) if args.trace else None
    if args.gate:
        deadline = time.monotonic() + 300
        while not args.gate.exists():
            if time.monotonic() > deadline:
                raise SystemExit(f"{args.gate} did not appear within 300 s")
            time.sleep(0.02)
    with session(model, optimizer, dataset, KeepGlobalBatch(args.global_batch)) as s:
        if trace:
            trace.write(f"ready {time.time()} {worker}\n")
        for batch in s.batches():
            if args.kind == "ledger":
                (index,) = batch
                loss = (-float(s.window_size) * s.model(index)).mean()
            else:
                inputs, targets = batch
                loss = nn.functional.cross_entropy(s.model(inputs), targets)
            s.step(loss)
            steps += 1
            worlds.add(s.world_size)
            if trace:
                trace.write(f"step {time.time()} g{s.generation} {s.world_size} {os.getpid()}\n")
            if args.step_sleep_s:
                time.sleep(args.step_sleep_s)
        summary = {
            "steps": steps,
            "step": s.step_count,
            "generations": s.generations_formed,
            "worlds": sorted(worlds),
        }
    args.out.mkdir(parents=True, exist_ok=True)
    arrays = {key: value.numpy() for key, value in model.state_dict().items()}
    np.savez(args.out / f"{worker}.npz", **arrays)  # type: ignore[arg-type]
    (args.out / f"{worker}.json").write_text(json.dumps({**summary, "pid": os.getpid()}))


if __name__ == "__main__":
    main()
