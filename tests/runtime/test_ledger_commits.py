"""Group commits in one cut per epoch (``Ledger.committing_windows``) against the reference
that checks and cuts one window at a time (``Ledger._committing_one_by_one``).

Aspects:
- on generated walks over every epoch, split into commits of any length and then spoiled
  or not (a window dropped, repeated, moved, given another epoch, one of its samples
  replaced, a range cut differently), the two accept the same commits, end in the same
  ledger, and refuse the others with the same message;
- a thousand windows of a ten-million-sample dataset commit in one cut, not a thousand.
"""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from trainer_runtime.coordinator.ledger import Ledger, LedgerError
from trainer_runtime.sharding import DatasetPlan, SampleRange, StepWindow, taking_window


def walk(plan: DatasetPlan, sizes: random.Random) -> list[StepWindow]:
    """Every window of every epoch, as a generation would cut them (sizes at random)."""
    windows: list[StepWindow] = []
    for epoch in range(plan.epochs):
        todo = plan.epoch_order(epoch)
        while todo:
            taken, todo = taking_window(todo, sizes.randint(1, 7))
            windows.append(StepWindow(len(windows) + 1, epoch, tuple(taken)))
    return windows


def spoiling(windows: list[StepWindow], how: int, rng: random.Random) -> list[StepWindow]:
    if not windows or how == 0:
        return windows
    out = list(windows)
    at = rng.randrange(len(out))
    w = out[at]
    if how == 1:
        del out[at]
    elif how == 2:
        out.insert(at, w)
    elif how == 3 and len(out) > 1:
        other = rng.randrange(len(out))
        out[at], out[other] = out[other], out[at]
    elif how == 4:
        out[at] = StepWindow(w.step, w.epoch + rng.choice((-1, 1)), w.ranges)
    elif how == 5:
        first = w.ranges[0]
        moved = SampleRange(first.start + 1, first.stop + 1)
        out[at] = StepWindow(w.step, w.epoch, (moved, *w.ranges[1:]))
    elif how == 6:  # the same samples, cut into ranges otherwise: still exact
        split = [
            SampleRange(i, i + 1) for r in w.ranges for i in range(r.start, r.stop)
        ]  # fmt: skip
        out[at] = StepWindow(w.step, w.epoch, tuple(split))
    return out


def outcome(ledger: Ledger, commits: list[list[StepWindow]], fast: bool) -> list[object]:
    seen: list[object] = []
    for commit in commits:
        try:
            if fast:
                ledger.committing_windows(commit)
            else:
                ledger.adopting(ledger._committing_one_by_one(commit))
            seen.append(ledger.to_dict())
        except LedgerError as error:
            seen.append(str(error))
    return seen


@settings(max_examples=300, deadline=None)
@given(
    samples=st.integers(1, 60),
    shard=st.integers(1, 9),
    epochs=st.integers(1, 3),
    seed=st.integers(0, 10**6),
    how=st.integers(0, 6),
)
def test_one_cut_per_epoch_commits_exactly_what_one_by_one_does(
    samples: int, shard: int, epochs: int, seed: int, how: int
) -> None:
    rng = random.Random(seed)
    plan = DatasetPlan(samples=samples, shard_size=shard, epochs=epochs, seed=seed)
    windows = spoiling(walk(plan, rng), how, rng)
    commits: list[list[StepWindow]] = []
    while windows:
        size = rng.randint(1, 12)
        commits.append(windows[:size])
        windows = windows[size:]
    fast = outcome(Ledger.starting(plan), commits, fast=True)
    reference = outcome(Ledger.starting(plan), commits, fast=False)
    assert fast == reference


def test_a_thousand_windows_of_a_large_dataset_take_one_cut(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import trainer_runtime.coordinator.ledger as ledger_module

    plan = DatasetPlan(samples=10_000_000, shard_size=1000, epochs=1, seed=1)
    ledger = Ledger.starting(plan)
    todo = list(ledger.todo)
    windows = []
    for step in range(1, 1025):
        taken, todo = taking_window(todo, 32)
        windows.append(StepWindow(step, 0, tuple(taken)))
    cuts = []
    real = ledger_module.taking_window

    def counted(*args, **kwargs):  # type: ignore[no-untyped-def]
        cuts.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(ledger_module, "taking_window", counted)
    ledger.committing_windows(windows)
    assert ledger.committed_step == 1024 and len(cuts) == 1
