"""The snapshots a simulation plans on, recorded for tests that replay them through
``plan()`` (with an incremental planner, a shortcut, a reordering) and compare the plans."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from edl_scheduler.core import Snapshot
from edl_scheduler.core.incremental import IncrementalPlanner
from simulations import engine as engine_module


def watch(monkeypatch: pytest.MonkeyPatch, seen: Callable[[Snapshot, float], None]) -> None:
    """Calls ``seen(snapshot, now)`` for every snapshot the engine hands ``plan()`` or its
    incremental planner (until the test's monkeypatches are undone)."""
    real, real_incremental = engine_module.plan, IncrementalPlanner.plan

    def recording(snap: Snapshot, pol: object, now: float) -> object:
        seen(snap, now)
        return real(snap, pol, now)  # type: ignore[arg-type]

    def recording_incremental(
        self: IncrementalPlanner, snap: Snapshot, now: float, *args: object
    ) -> object:
        seen(snap, now)
        return real_incremental(self, snap, now, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(engine_module, "plan", recording)
    monkeypatch.setattr(IncrementalPlanner, "plan", recording_incremental)


def recorded(
    monkeypatch: pytest.MonkeyPatch, simulating: Callable[[], object]
) -> list[tuple[Snapshot, float]]:
    """Every (snapshot, now) the engine plans on while ``simulating`` runs. Undoes the
    test's monkeypatches at the end (the recording is one of them)."""
    seen: list[tuple[Snapshot, float]] = []
    watch(monkeypatch, lambda snap, now: seen.append((snap, now)))
    try:
        simulating()
    finally:
        monkeypatch.undo()
    return seen
