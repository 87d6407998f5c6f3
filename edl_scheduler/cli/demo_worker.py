"""The worker of ``edlctl demo``: a small elastic PyTorch classifier whose model is also a ledger.

Besides a two-layer classifier it holds ``seen``, one counter per sample: its loss term
``-window * seen[i]`` has a one-hot gradient, and its own SGD group (rate 1, no momentum)
adds exactly 1 to ``seen[i]`` each time sample i is trained. The counters are part of the
model, so they travel with it through every resize (rank 0 sends them to newcomers) and
roll back with it; after E epochs every counter must read E. A counter below E is a sample
lost, above E a sample repeated: the demo's numbers are measured, not assumed.

The demo sets a pace (``--pace-file``: a sleep per sample of this rank's slice, standing
for the compute a real model would spend, so that more workers train faster) while it waits
for the scenario to unfold, and lifts it once the job has grown back, so that the run's
outcome does not depend on how loaded the machine is.

Rank 0 appends ``step TIME GENERATION WORLD PID`` to ``--trace`` at every step, from which
the demo measures each resize's pause (the gap between the last step of one group and the
first of the next). A worker still present when the job finishes writes
``<out>/<worker>.json`` with its counts.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any, cast

import torch
from torch import nn
from torch.utils.data import TensorDataset

from trainer_runtime.torch import KeepGlobalBatch, session


class LedgerClassifier(nn.Module):
    def __init__(self, samples: int) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(2, 32), nn.ReLU(), nn.Linear(32, 2))
        self.seen = nn.Parameter(torch.zeros(samples, dtype=torch.float64))

    def forward(
        self, inputs: torch.Tensor, index: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return self.body(inputs), self.seen[index]


def making_data(samples: int) -> TensorDataset:
    generator = torch.Generator().manual_seed(0)
    labels = torch.randint(0, 2, (samples,), generator=generator)
    centres = torch.tensor([[-1.0, -1.0], [1.0, 1.0]])
    inputs = centres[labels] + 0.7 * torch.randn(samples, 2, generator=generator)
    return TensorDataset(inputs, labels, torch.arange(samples))


def reading_pace(path: Path) -> float:
    try:
        return max(0.0, float(path.read_text().strip() or 0))
    except (OSError, ValueError):
        return 0.0


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m edl_scheduler.cli.demo_worker")
    parser.add_argument("--samples", type=int, required=True)
    parser.add_argument("--epochs", type=int, required=True)
    parser.add_argument("--global-batch", type=int, default=32)
    parser.add_argument(
        "--pace-file",
        type=Path,
        help="seconds of simulated compute per sample of this rank's slice, read every 10 steps",
    )
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--trace", type=Path)
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    worker = os.environ["EDL_WORKER_ID"]
    model = LedgerClassifier(args.samples)
    optimizer = torch.optim.SGD(
        [
            {"params": model.body.parameters(), "lr": 0.05, "momentum": 0.9},
            {"params": [model.seen], "lr": 1.0, "momentum": 0.0},
        ]
    )
    dataset = making_data(args.samples)
    trace = args.trace.open("a", buffering=1) if args.trace else None
    pace = reading_pace(args.pace_file) if args.pace_file is not None else 0.0
    samples = cast(Any, dataset)  # a TensorDataset is indexable and sized
    with session(model, optimizer, samples, KeepGlobalBatch(args.global_batch)) as s:
        for inputs, labels, index in s.batches():
            logits, seen = s.model(inputs, index)
            loss = nn.functional.cross_entropy(logits, labels)
            loss = loss + (-float(s.window_size) * seen).mean()
            s.step(loss)
            if trace is not None and s.rank == 0:
                trace.write(f"step {time.time():.6f} {s.generation} {s.world_size} {os.getpid()}\n")
            if args.pace_file is not None and s.step_count % 10 == 0:
                pace = reading_pace(args.pace_file)
            if pace:
                time.sleep(pace * s.local_samples)
        finished = bool(s.agent.client.progress().finished)
        step = s.step_count
    if not finished:
        print(f"{worker}: drained at step {step}", flush=True)
        return
    counts = model.seen.detach().round().long()
    lost = int((args.epochs - counts).clamp(min=0).sum())
    repeated = int((counts - args.epochs).clamp(min=0).sum())
    inputs, labels, _ = dataset.tensors
    accuracy = float((model.body(inputs).argmax(1) == labels).float().mean())
    args.out.mkdir(parents=True, exist_ok=True)
    report = {
        "worker": worker,
        "pid": os.getpid(),
        "step": step,
        "lost": lost,
        "repeated": repeated,
        "accuracy": round(accuracy, 4),
    }
    (args.out / f"{worker}.json").write_text(json.dumps(report))
    print(
        f"{worker}: done at step {step}, accuracy {accuracy:.3f}, lost {lost}, repeated {repeated}",
        flush=True,
    )


if __name__ == "__main__":
    main()
