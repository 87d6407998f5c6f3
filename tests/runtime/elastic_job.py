"""What the runtime's data-parallel test workers share, whatever their framework: their
command line and their training loop (`torch_job.py` and `paddle_job.py` run it).

`--kind ledger`: the model is the ledger, a per-sample counter `c` whose gradient is
one-hot; SGD with rate 1 adds exactly 1 to `c[i]` each time sample i is trained, so after the
job `c` must equal the number of epochs everywhere, whatever resizes and failures happened.
`--kind mlp`: a small float64 MLP, for the fixed-global-batch equivalence tests and the
benchmarks. Each framework's script builds the model, the optimizer and the data; the loop,
the trace and the summary are written here once, so the two frameworks are tested alike.
`--max-local N`: `KeepGlobalBatch(global_batch, max_local=N)`, so that each rank runs its
slice of a step as micro-batches of at most N samples (gradient accumulation); the loop is
the same, one `s.step` per batch, and `--step-sleep-s` paces optimizer steps, not batches.
`--batch-cycle B1,B2,...`: an adaptive policy whose batch goes through those global batches
(`cycling`), at each formation and every few steps inside a generation.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

from edl_gradients.goodput import shaping
from trainer_runtime.adaptive import AdaptiveBatch, Decision, LrScaling
from trainer_runtime.batching import KeepGlobalBatch


def arguments() -> argparse.ArgumentParser:
    """The options every worker takes (a framework's script may add its own)."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--kind", choices=["ledger", "mlp"], required=True)
    parser.add_argument("--samples", type=int, required=True)
    parser.add_argument("--global-batch", type=int, default=8)
    parser.add_argument(
        "--max-local", type=int, help="the most samples a rank holds at once (accumulation)"
    )
    parser.add_argument(
        "--batch-cycle", help="global batches, comma-separated, the batch goes through (ledger)"
    )
    parser.add_argument("--step-sleep-s", type=float, default=0.0)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument(
        "--trace", type=Path, help="append 'ready TIME WORKER' and 'step TIME gGEN WORLD PID'"
    )
    parser.add_argument(
        "--gate",
        type=Path,
        help="wait (up to 300 s) for this file before joining: a test starts a newcomer "
        "early, so that its imports are paid before the moment it joins",
    )
    return parser


def waiting_for_gate(args: argparse.Namespace) -> None:
    """With `--gate`, return once the file exists (a test's signal to join)."""
    if not args.gate:
        return
    deadline = time.monotonic() + 300
    while not args.gate.exists():
        if time.monotonic() > deadline:
            raise SystemExit(f"{args.gate} did not appear within 300 s")
        time.sleep(0.02)


def policy(args: argparse.Namespace, adaptive: type[AdaptiveBatch[Any]]) -> Any:
    """The job's batch policy: the global batch, kept through resizes; with
    `--batch-cycle`, a policy of the framework's `adaptive` class whose batch goes through
    the cycle (`cycling`)."""
    if not args.batch_cycle:
        return KeepGlobalBatch(args.global_batch, max_local=args.max_local)
    batches = [int(b) for b in args.batch_cycle.split(",")]
    return cycling(adaptive)(
        initial_batch=min(batches),
        max_batch=max(batches),
        max_local=args.max_local or max(batches),
        base_lr=1.0,  # the ledger adds exactly 1 per sample at rate 1: factors stay 1
        lr=LrScaling.LINEAR,
        cycle=batches,
    )


def cycling(adaptive: type[AdaptiveBatch[Any]]) -> Any:
    """An adaptive policy whose rank 0 goes through a cycle of global batches instead of
    deciding by goodput: one at every generation's formation (`best`), and the next every
    `CYCLE_EVERY` step boundaries inside a generation (`proposing`), so the batch changes
    at and between resizes through the runtime's own paths (the state sent with the model,
    the step's vote). The rate stays `base_lr` (factor 1)."""

    class CyclingBatch(adaptive):  # type: ignore[valid-type,misc]
        def __init__(self, cycle: list[int], **options: Any) -> None:
            super().__init__(**options)
            self.cycle, self.turn, self.boundaries = cycle, 0, 0

        def best(self, world_size: int, noise: Any) -> Decision:
            batch = self.cycle[self.turn % len(self.cycle)]
            self.turn += 1
            local, steps = shaping(batch / world_size, self.limits)
            return Decision(local, steps, 1.0)

        def proposing(self, world_size: int, noise: Any, now: float) -> Decision | None:
            self.boundaries += 1
            if self.boundaries % CYCLE_EVERY:
                return None
            return self.best(world_size, noise)

    return CyclingBatch


#: Step boundaries between two batches of a `--batch-cycle` inside a generation.
CYCLE_EVERY = 4


def training(
    s: Any,
    args: argparse.Namespace,
    cross_entropy: Callable[[Any, Any], Any],
    trace: TextIO | None,
) -> dict[str, Any]:
    """Train through session `s` until the job ends or the worker is drained; what it did
    (`steps`: the batches it stepped on, micro-batches included and a step a re-formation
    discarded counted again; `began`: the job's step count at its first batch, the step its
    state came from, a checkpoint's or the group's). The ledger's loss is
    `-window_size * c[i]` averaged over the rank's batch, so that the session's averaging
    over the step's window leaves a gradient of exactly -1 per sample."""
    worker = os.environ["EDL_WORKER_ID"]
    steps = 0
    began: int | None = None
    worlds: set[int] = set()
    windows: set[int] = set()
    if trace:
        trace.write(f"ready {time.time()} {worker}\n")
    for batch in s.batches():
        if args.kind == "ledger":
            (index,) = batch
            loss = (-float(s.window_size) * s.model(index)).mean()
        else:
            inputs, targets = batch
            loss = cross_entropy(s.model(inputs), targets)
        if began is None:
            began = s.step_count
        s.step(loss)
        steps += 1
        worlds.add(s.world_size)
        windows.add(s.window_size)
        if trace:
            trace.write(f"step {time.time()} g{s.generation} {s.world_size} {os.getpid()}\n")
        if args.step_sleep_s:
            time.sleep(args.step_sleep_s / s.micro_batches)
    return {
        "steps": steps,
        "began": began,
        "step": s.step_count,
        "generations": s.generations_formed,
        "worlds": sorted(worlds),
        "windows": sorted(windows),
    }
