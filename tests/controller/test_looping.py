"""The planning loop's own bookkeeping, without an API server.

Aspects:
- attained GPU-time writes of jobs started together are spread over time (each job's period
  is stretched by a fixed amount of its own) and a cycle grants at most
  ``ATTAINED_WRITES_PER_CYCLE`` of them; a deferred write counts the longer time;
- a job's coordinator counts as ready only while its pod is Running, not being deleted, and
  that very pod (uid) has answered;
- an ordinary change waits for ``min_period_s`` since the last cycle, a new TrainingJob
  (``mark_urgent``) starts the next cycle at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any, cast

import pytest

from edl_scheduler.controller import looping
from edl_scheduler.controller.config import ControllerConfig
from edl_scheduler.controller.kubeapi import Kube
from edl_scheduler.controller.looping import ATTAINED_WRITES_PER_CYCLE, PlanningLoop, World
from edl_scheduler.controller.metrics import Metrics

PERIOD = 15.0


class Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def loop(monkeypatch: pytest.MonkeyPatch) -> Any:
    clock = Clock()
    monkeypatch.setattr(looping.time, "time", clock)
    config = ControllerConfig(token_key=b"k" * 32, attained_period_s=PERIOD)
    found = PlanningLoop(config, cast(Kube, None), lambda: World((), (), (), {}), Metrics())
    yield found, clock
    found.actuator.close()


def due(loop: PlanningLoop, keys: list[str], budget: int = 10_000) -> dict[str, float]:
    loop._attained_left = budget
    return {k: e for k in keys if (e := loop._attained_due(k)) > 0}


def test_attained_writes_are_spread_and_capped_per_cycle(loop: Any) -> None:
    planning, clock = loop
    keys = [f"ns/job-{i}" for i in range(200)]
    assert due(planning, keys) == {}  # first seen: nothing to write yet
    clock.now += PERIOD * 1.25
    some = due(planning, keys)
    assert 40 < len(some) < 160, "jobs started together are not all due at once"
    clock.now += PERIOD * 0.25
    capped = due(planning, keys, budget=ATTAINED_WRITES_PER_CYCLE)
    assert len(capped) == ATTAINED_WRITES_PER_CYCLE
    assert all(e == pytest.approx(PERIOD * 1.5) for e in capped.values())
    for key in capped:  # the loop records a write once it is decided
        planning._attained[key] = clock.now
    clock.now += 1.0
    later = due(planning, keys)
    assert not set(later) & set(capped)
    assert len(later) == len(keys) - ATTAINED_WRITES_PER_CYCLE
    assert all(e == pytest.approx(PERIOD * 1.5 + 1.0) for e in later.values())


def coordinator(uid: str, phase: str = "Running", deleting: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "j-coordinator", "uid": uid}
    if deleting:
        meta["deletionTimestamp"] = "2027-01-01T00:00:00Z"
    return {"metadata": meta, "status": {"phase": phase}}


def test_a_coordinator_is_ready_when_that_pod_runs_and_answered(loop: Any) -> None:
    planning, _ = loop
    assert not planning._ready("ns/j", coordinator("u1"))  # never answered
    planning._answered["ns/j"] = "u1"
    assert planning._ready("ns/j", coordinator("u1"))
    assert not planning._ready("ns/j", coordinator("u1", phase="Pending"))
    assert not planning._ready("ns/j", coordinator("u1", deleting=True))
    assert not planning._ready("ns/j", coordinator("u2"))  # a replacement must answer itself
    assert not planning._ready("ns/j", None)


def test_a_new_job_starts_a_cycle_without_waiting_for_the_period() -> None:
    """An ordinary change waits for ``min_period_s`` since the last cycle; a new
    TrainingJob (``mark_urgent``) does not."""
    config = ControllerConfig(token_key=b"k" * 32, min_period_s=30.0, max_period_s=60.0)
    planning = PlanningLoop(config, cast(Kube, None), lambda: World((), (), (), {}), Metrics())
    started: list[float] = []
    planning.cycle = lambda _world: started.append(time.monotonic())  # type: ignore[method-assign,assignment]

    async def cycles(count: int, within_s: float) -> bool:
        deadline = time.monotonic() + within_s
        while len(started) < count and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        return len(started) >= count

    async def scenario() -> None:
        task = asyncio.create_task(planning.run())
        planning.synced.set()
        planning.mark_dirty()
        assert await cycles(1, 5.0)
        planning.mark_dirty()
        assert not await cycles(2, 0.5), "an ordinary change waits for the period"
        planning.mark_urgent()
        assert await cycles(2, 5.0), "a new job does not"
        planning.stopping.set()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    try:
        asyncio.run(scenario())
    finally:
        planning.actuator.close()
