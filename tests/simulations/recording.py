"""The snapshots a simulation plans on, recorded for tests that replay them through
``plan()`` (with and without a memo, a shortcut, a reordering) and compare the plans."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from edl_scheduler.core import Snapshot
from simulations import engine as engine_module


def recorded(
    monkeypatch: pytest.MonkeyPatch, simulating: Callable[[], object]
) -> list[tuple[Snapshot, float]]:
    """Every (snapshot, now) the engine hands ``plan()`` while ``simulating`` runs. Undoes
    the test's monkeypatches at the end (the recording is one of them)."""
    seen: list[tuple[Snapshot, float]] = []
    real = engine_module.plan

    def recording(snap: Snapshot, pol: object, now: float, **kw: object) -> object:
        seen.append((snap, now))
        return real(snap, pol, now, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(engine_module, "plan", recording)
    try:
        simulating()
    finally:
        monkeypatch.undo()
    return seen
