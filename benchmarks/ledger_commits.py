"""How fast the coordinator's ledger commits step windows: one `Commit` of `--windows`
windows of `--batch` samples each, on datasets of `--samples` (comma-separated) samples in
shards of `--shard` (so one todo range per shard), through `Ledger.committing_windows` and
through the one-window-at-a-time reference beside it. A rank 0 that steps faster than the
coordinator commits runs ahead of it (`trainer_runtime/committing.py`).

Prints one JSON line per dataset size: `{"samples", "ranges", "windows_per_s",
"reference_windows_per_s", "ratio"}`.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from trainer_runtime.coordinator.ledger import Ledger
from trainer_runtime.sharding import DatasetPlan, StepWindow, taking_window


def rate(samples: int, shard: int, windows: int, batch: int) -> dict[str, float]:
    plan = DatasetPlan(samples=samples, shard_size=shard, epochs=1, seed=1)
    todo = plan.epoch_order(0)
    ranges = len(todo)
    walked = []
    for step in range(1, windows + 1):
        taken, todo = taking_window(todo, batch)
        walked.append(StepWindow(step, 0, tuple(taken)))
    ledger = Ledger.starting(plan)
    started = time.perf_counter()
    ledger.committing_windows(walked)
    fast = time.perf_counter() - started
    reference = Ledger.starting(plan)
    started = time.perf_counter()
    reference.adopting(reference._committing_one_by_one(walked))
    slow = time.perf_counter() - started
    assert ledger.to_dict() == reference.to_dict()
    return {
        "samples": samples,
        "ranges": ranges,
        "windows_per_s": round(windows / fast),
        "reference_windows_per_s": round(windows / slow),
        "ratio": round(slow / fast, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", default="1281167,10000000")
    parser.add_argument("--shard", type=int, default=1000)
    parser.add_argument("--windows", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=32)
    args = parser.parse_args()
    for samples in (int(s) for s in args.samples.split(",")):
        print(json.dumps(rate(samples, args.shard, args.windows, args.batch)), flush=True)


if __name__ == "__main__":
    main()
