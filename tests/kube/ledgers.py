"""The framework-free worker under the kubelet in miniature, and its ledger files read
back: each worker appends the samples of each commit before it sends it ("intent") and the
commits the coordinator acknowledged ("done"), so a test can tell, without trusting the
controller's status, whether every sample of the epoch was trained exactly once and how many
the coordinator acknowledged.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path


def plain_worker(ledgers: Path, step_time_s: float = 0.05) -> list[str]:
    """The framework-free worker, appending what it trained to ``<ledgers>/<pod>.ledger``."""
    return [
        "python", "-m", "trainer_runtime.plain_worker", "--step-time-s", str(step_time_s),
        "--ledger-file", f"{ledgers}/$(EDL_WORKER_ID).ledger",
    ]  # fmt: skip


def _ledgers(ledgers: Path) -> tuple[dict[tuple[str, int], range], set[tuple[str, int]]]:
    """The workers' ledger files: each commit's samples by (worker, lease), and the
    commits the coordinator acknowledged."""
    intents: dict[tuple[str, int], range] = {}
    acked: set[tuple[str, int]] = set()
    for path in ledgers.glob("*.ledger"):
        for line in path.read_text().splitlines():
            kind, lease, *rest = line.split()
            if kind == "intent":
                intents[(path.stem, int(lease))] = range(int(rest[1]), int(rest[2]))
            elif kind == "done":
                acked.add((path.stem, int(lease)))
    return intents, acked


def acknowledged(ledgers: Path) -> int:
    """How many samples the coordinator acknowledged to the workers (their ledger files):
    once no worker runs, the least its ``samplesDone`` is."""
    intents, acked = _ledgers(ledgers)
    return sum(len(intents[key]) for key in acked)


def trained(ledgers: Path) -> Counter[int]:
    """How often each sample was trained (one epoch), from the workers' ledger files: the
    commits the coordinator acknowledged, plus unacknowledged ones (a worker stopped between
    its commit and the answer) that no one trained again."""
    intents, acked = _ledgers(ledgers)
    counts: Counter[int] = Counter()
    for key in acked:
        counts.update(intents[key])
    for key, samples in intents.items():
        if key not in acked and all(counts[i] == 0 for i in samples):
            counts.update(samples)
    return counts


def assert_exactly_once(ledgers: Path, samples: int) -> None:
    counts = trained(ledgers)
    assert set(counts) == set(range(samples)), f"{samples - len(counts)} samples never trained"
    assert max(counts.values()) == 1, "some samples were trained twice"
