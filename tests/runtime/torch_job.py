"""A worker of the runtime's multi-process tests and benchmarks (run as a script).

`--kind ledger`: the model is the ledger, a per-sample counter `c` whose gradient is
one-hot; SGD with rate 1 adds exactly 1 to `c[i]` each time sample i is trained, so after the
job `c` must equal the number of epochs everywhere, whatever resizes and failures happened.
`--kind mlp`: a small float64 MLP with SGD and momentum, for the fixed-global-batch
equivalence test and the benchmarks.

At the end it writes `<out>/<worker>.pt` (final parameters) and `<out>/<worker>.json`.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import time
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import TensorDataset

from trainer_runtime.torch import KeepGlobalBatch, session


class Counter(nn.Module):
    def __init__(self, samples: int) -> None:
        super().__init__()
        self.counts = nn.Parameter(torch.zeros(samples, dtype=torch.float64))

    def forward(self, index: torch.Tensor) -> torch.Tensor:
        return self.counts[index]


def mlp(width: int = 16) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, width), nn.Tanh(), nn.Linear(width, 2)).double()


def mlp_data(samples: int) -> TensorDataset:
    generator = torch.Generator().manual_seed(1)
    inputs = torch.randn(samples, 8, generator=generator, dtype=torch.float64)
    targets = (inputs[:, 0] > 0).long()
    return TensorDataset(inputs, targets)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--kind", choices=["ledger", "mlp"], required=True)
    parser.add_argument("--samples", type=int, required=True)
    parser.add_argument("--global-batch", type=int, default=8)
    parser.add_argument("--step-sleep-s", type=float, default=0.0)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument(
        "--trace", type=Path, help="append 'ready TIME WORKER' and 'step TIME gGEN WORLD PID'"
    )
    args = parser.parse_args()
    logging.basicConfig(level=os.environ.get("EDL_TEST_LOG_LEVEL", "WARNING"))
    torch.set_num_threads(1)
    worker = os.environ["EDL_WORKER_ID"]
    if args.kind == "ledger":
        model: nn.Module = Counter(args.samples)
        optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
        dataset = TensorDataset(torch.arange(args.samples))
    else:
        model = mlp()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        dataset = mlp_data(args.samples)
    steps = 0
    worlds: set[int] = set()
    trace = args.trace.open("a", buffering=1) if args.trace else None
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
    torch.save(
        {k: v.detach().clone() for k, v in model.state_dict().items()}, args.out / f"{worker}.pt"
    )
    (args.out / f"{worker}.json").write_text(json.dumps({**summary, "pid": os.getpid()}))


if __name__ == "__main__":
    main()
