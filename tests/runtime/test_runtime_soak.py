"""The runtime soak benchmark (``benchmarks/runtime_soak.py``) at a small size, so that the
script cannot rot.

Aspects tested: three seeded SIGKILLs of random workers in one job, each replaced: the
script exits 0 and prints one JSON line with no violation, no sample lost or repeated, a
re-convergence time for every kill, within the goal.
"""

from __future__ import annotations

import json
import subprocess
import sys

from .harness import REPO


def test_the_soak_runs_and_finds_every_sample_trained_once() -> None:
    done = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "runtime_soak.py"), "--kills", "3",
         "--workers", "3", "--samples", "6000", "--seed", "4"],
        capture_output=True, text=True, timeout=120, cwd=REPO, check=False,
    )  # fmt: skip
    lines = done.stdout.strip().splitlines()
    assert len(lines) == 1, done.stdout + done.stderr[-3000:]
    result = json.loads(lines[0])
    assert done.returncode == 0, result
    assert result["kills"] == 3 and result["violations"] == 0, result
    assert result["samples_lost"] == 0 and result["samples_repeated"] == 0, result
    assert result["unknown_intents"] == 0, result
    assert 0 < result["reconverge_p50_s"] <= result["reconverge_p95_s"] <= 10, result
    assert result["reconverge_max_s"] >= result["reconverge_p95_s"], result
