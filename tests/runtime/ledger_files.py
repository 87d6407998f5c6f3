"""What framework-free workers trained, read from their ledger files (`plain_worker
--ledger-file` / `--ledger-dir`), to check exactly-once apart from the coordinator's own count.

A worker writes `intent LEASE EPOCH START STOP` before each commit and `done LEASE` once the
coordinator accepted it. An intent with no `done` is a commit whose answer the worker never
saw: killed, partitioned or fenced in between. The coordinator either kept that commit (the
samples count, and no one else may train them) or refused it (they went back to todo, and
another worker trains them). Where the caller knows which (``kept``: from the
coordinator's record, read right after the worker died), that decides; otherwise such an
intent counts only if no one else trained those samples (a test that kills rarely enough).

What must stay true: a sample counted twice in an epoch is a repeat, and one never counted
is lost; nothing here forgives either, except the unknown intents' rule above.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

Intent = tuple[str, int]  # (worker id: the file's stem, lease id)


@dataclass(frozen=True, slots=True)
class Exactness:
    """How far an epoch-by-epoch count is from every sample exactly once."""

    lost: int  # (epoch, sample) pairs never trained
    repeated: int  # trainings beyond the first of a pair
    unknown: int  # unanswered intents no record decided (the fallback rule was used)


def reading(paths: Iterable[Path]) -> tuple[dict[Intent, tuple[int, int, int]], set[Intent]]:
    """Every intent (epoch, start, stop) by (worker, lease), and the intents acknowledged."""
    intents: dict[Intent, tuple[int, int, int]] = {}
    done: set[Intent] = set()
    for path in paths:
        for line in path.read_text().splitlines():
            parts = line.split()
            if not parts:
                continue
            if parts[0] == "intent" and len(parts) == 5:
                key = (path.stem, int(parts[1]))
                intents[key] = (int(parts[2]), int(parts[3]), int(parts[4]))
            elif parts[0] == "done" and len(parts) == 2:
                done.add((path.stem, int(parts[1])))
    return intents, done


def unanswered(path: Path) -> list[int]:
    """The leases of one worker's file whose commit it saw no answer to."""
    intents, done = reading([path])
    return sorted(lease for (_, lease) in intents if (path.stem, lease) not in done)


def counting_trained(
    root: Path, epochs: int, kept: Mapping[Intent, bool] | None = None
) -> tuple[dict[int, Counter[int]], int]:
    """Trainings per sample per epoch from every `*.ledger` under `root` (not recursive),
    and how many unanswered intents the fallback rule decided."""
    intents, done = reading(sorted(root.glob("*.ledger")))
    counts: dict[int, Counter[int]] = {epoch: Counter() for epoch in range(epochs)}
    for key in done & intents.keys():
        epoch, start, stop = intents[key]
        counts[epoch].update(range(start, stop))
    unknown = 0
    for key in sorted(intents.keys() - done):
        epoch, start, stop = intents[key]
        if kept is not None and key in kept:
            if kept[key]:
                counts[epoch].update(range(start, stop))
            continue
        unknown += 1
        if all(counts[epoch][i] == 0 for i in range(start, stop)):
            counts[epoch].update(range(start, stop))
    return counts, unknown


def exactness(counts: Mapping[int, Counter[int]], samples: int, unknown: int = 0) -> Exactness:
    lost = repeated = 0
    for counter in counts.values():
        lost += sum(1 for i in range(samples) if counter[i] == 0)
        repeated += sum(n - 1 for n in counter.values() if n > 1)
    return Exactness(lost, repeated, unknown)


def checking_exactly_once(root: Path, samples: int, epochs: int) -> None:
    """Assert (a test's check) that every sample of every epoch was trained exactly once."""
    counts, _ = counting_trained(root, epochs)
    for epoch in range(epochs):
        assert set(counts[epoch]) == set(range(samples)), f"epoch {epoch} lost samples"
        assert max(counts[epoch].values()) == 1, f"epoch {epoch} repeated samples"
