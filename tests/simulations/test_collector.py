"""The collector kept out of a simulation's way (``simulations/collector.py``).

Aspects:
- inside ``quiet`` the objects alive when it began are frozen and young collections are
  rarer; after it, on return or on an exception, the thresholds and the frozen count are
  what they were, so a process running many simulations (the suite) keeps its collector;
- a caller that froze objects itself keeps them frozen (``quiet`` neither freezes nor
  unfreezes then), and a caller's higher young threshold is kept;
- a cycle made inside a run is still freed (collections run, only less often);
- ``Engine.run`` runs inside it: a simulation's records are the same either way.
"""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from edl_scheduler.core import preset
from simulations import collector, engine
from simulations.collector import YOUNG_THRESHOLD, quiet
from simulations.engine import Engine
from simulations.traces import load_cluster


@pytest.fixture
def default_collector() -> Iterator[None]:
    """Python's defaults around each test, whatever ran before it."""
    thresholds = gc.get_threshold()
    gc.unfreeze()
    gc.set_threshold(700, 10, 10)
    try:
        yield
    finally:
        gc.set_threshold(*thresholds)


def test_freezes_and_restores(default_collector: None) -> None:
    assert gc.get_freeze_count() == 0
    with quiet():
        assert gc.get_freeze_count() > 0
        assert gc.get_threshold() == (YOUNG_THRESHOLD, 10, 10)
    assert gc.get_freeze_count() == 0
    assert gc.get_threshold() == (700, 10, 10)


def test_restores_on_an_exception(default_collector: None) -> None:
    with pytest.raises(KeyError), quiet():
        raise KeyError("x")
    assert gc.get_freeze_count() == 0
    assert gc.get_threshold() == (700, 10, 10)


def test_a_callers_freeze_and_threshold_stay(default_collector: None) -> None:
    mine: list[list[int]] = [[]]  # a container the caller froze
    gc.freeze()
    gc.set_threshold(YOUNG_THRESHOLD * 2, 5, 5)
    try:
        with quiet():
            assert gc.get_threshold() == (YOUNG_THRESHOLD * 2, 5, 5)
        # Still frozen: the collector's generations (what get_objects lists) leave out the
        # frozen objects. (The frozen count is no measure: a frozen object may die.)
        assert all(o is not mine for o in gc.get_objects())
        assert gc.get_threshold() == (YOUNG_THRESHOLD * 2, 5, 5)
    finally:
        gc.unfreeze()
    assert any(o is mine for o in gc.get_objects())  # the check above can tell


class _Node:
    def __init__(self) -> None:
        self.other: _Node | None = None


def test_a_cycle_made_inside_is_freed(default_collector: None) -> None:
    with quiet():
        a, b = _Node(), _Node()
        a.other, b.other = b, a
        gone = weakref.ref(a)
        del a, b
        gc.collect()
        assert gone() is None


def test_the_engine_runs_inside_it(monkeypatch: pytest.MonkeyPatch) -> None:
    entered: list[bool] = []

    def spy() -> object:
        entered.append(True)
        return collector.quiet()

    monkeypatch.setattr(engine, "quiet", spy)
    Engine([], load_cluster("64x8"), preset("edl")).run()
    assert entered == [True]
