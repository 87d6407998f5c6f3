"""What cutting a step's window costs a worker, per step, as the dataset grows.

Every rank cuts each step's window from the walk (`trainer_runtime.sharding.Walk`) and its
own slice of it (`generations.micro_slicing`), in Python, on the training thread; on a GPU
that time adds to a step the device could otherwise run. Measured on datasets of 16,000
samples (the GPU check's), 200,000 and 1,281,167 (ImageNet's training set), in shards of 10
(the runtime tests') and 64 (the coordinator's default), a global batch of 32 and one rank:
the best of 5 runs of 5,000 steps each.

Run: `python benchmarks/walk_cost.py`. One JSON line per setting:
`{"samples": N, "shard": S, "us_per_step": T}`.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from trainer_runtime.generations import micro_slicing
from trainer_runtime.sharding import DatasetPlan, Walk

STEPS, RUNS, BATCH = 5000, 5, 32


def cost(samples: int, shard: int) -> float:
    """Microseconds per step to cut the window and one rank's slice, best of `RUNS`."""
    plan = DatasetPlan(samples, shard, 1, 0)
    best = float("inf")
    for _ in range(RUNS):
        walk = Walk(plan, 0, 0, plan.epoch_order(0))
        started, steps = time.perf_counter(), 0
        while steps < STEPS and (window := walk.next_window(BATCH)) is not None:
            micro_slicing(window, 1, 0, 1)
            steps += 1
        best = min(best, (time.perf_counter() - started) / steps * 1e6)
    return best


def main() -> None:
    for samples in (16_000, 200_000, 1_281_167):
        for shard in (10, 64):
            line = {
                "samples": samples,
                "shard": shard,
                "us_per_step": round(cost(samples, shard), 2),
            }
            print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
