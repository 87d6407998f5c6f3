"""The planning loop's own bookkeeping, without an API server.

Aspects:
- attained GPU-time writes of jobs started together are spread over time (each job's period
  is stretched by a fixed amount of its own) and a cycle grants at most
  ``ATTAINED_WRITES_PER_CYCLE`` of them; a deferred write counts the longer time;
- a job's coordinator counts as ready only while its pod is Running, not being deleted, and
  that very pod (uid) has answered;
- an ordinary change waits for ``min_period_s`` since the last cycle, a new TrainingJob
  (``mark_urgent``) starts the next cycle at once, and so do a coordinator's first answer
  (from the progress poller's thread) and a draining replica gone (``left_for_good``);
- a coordinator is told the job's size once after its first answer, and a replacement again;
- a coordinator that has not answered yet is probed apart from the progress rounds: a round
  held up by a slow coordinator does not hold its probe back;
- a coordinator whose pod is not Running is not asked: what answers at its address is
  another process, whose answer must not count for it nor its snapshot become the job's state;
- each step of a cycle is timed in ``edl_planner_cycle_phase_seconds``;
- a new coordinator is not given the port of a deleted job's coordinator pod that is still
  there (its job is gone from the watch, its pod not yet collected);
- ``edl_planner_quiet_cycles`` counts the cycles since the last one that wanted a move.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import threading
import time
from collections.abc import Awaitable, Callable
from types import SimpleNamespace
from typing import Any, cast

import pytest
from prometheus_client import generate_latest

from edl_scheduler.controller import looping
from edl_scheduler.controller.config import ControllerConfig
from edl_scheduler.controller.coordinating import CoordinatorCallError, Progress
from edl_scheduler.controller.kubeapi import Kube
from edl_scheduler.controller.looping import ATTAINED_WRITES_PER_CYCLE, PlanningLoop, World
from edl_scheduler.controller.metrics import Metrics
from edl_scheduler.controller.naming import ANNOTATION_DRAINING
from edl_scheduler.controller.podstate import group_pods, left_for_good
from edl_scheduler.controller.polling import Coordinated

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
    found = new_loop(config)
    yield found, clock
    found.actuator.close()


def due(loop: PlanningLoop, keys: list[str], budget: int = 10_000) -> dict[str, float]:
    loop._attained_left = budget
    return {k: e for k in keys if (e := loop._attained_due(k)) > 0}


def new_loop(config: ControllerConfig) -> PlanningLoop:
    return PlanningLoop(config, cast(Kube, None), lambda: World((), (), (), {}), Metrics())


def recording_loop() -> tuple[PlanningLoop, list[float]]:
    """A loop whose cycles only record when they started, with periods so long that within
    a test only an urgent mark (or the first change) starts one."""
    config = ControllerConfig(token_key=b"k" * 32, min_period_s=30.0, max_period_s=60.0)
    planning = new_loop(config)
    started: list[float] = []
    planning.cycle = lambda _world: started.append(time.monotonic())  # type: ignore[method-assign,assignment]
    return planning, started


async def started_at_least(started: list[float], count: int, within_s: float) -> bool:
    deadline = time.monotonic() + within_s
    while len(started) < count and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    return len(started) >= count


def running(planning: PlanningLoop, scenario: Callable[[], Awaitable[None]]) -> None:
    """Runs ``scenario`` while ``planning.run()`` runs; stops the loop however it ends."""

    async def whole() -> None:
        task = asyncio.create_task(planning.run())
        try:
            await scenario()
        finally:
            planning.stopping.set()
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    try:
        asyncio.run(whole())
    finally:
        planning.actuator.close()


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
    assert not planning.coordinators.ready("ns/j", coordinator("u1"))  # never answered
    planning.coordinators.answered["ns/j"] = "u1"
    assert planning.coordinators.ready("ns/j", coordinator("u1"))
    assert not planning.coordinators.ready("ns/j", coordinator("u1", phase="Pending"))
    assert not planning.coordinators.ready("ns/j", coordinator("u1", deleting=True))
    assert not planning.coordinators.ready(
        "ns/j", coordinator("u2")
    )  # a replacement must answer itself
    assert not planning.coordinators.ready("ns/j", None)


def test_a_coordinator_is_told_the_size_once_after_its_first_answer(loop: Any) -> None:
    from edl_scheduler.api import load_training_job
    from tests.controller.test_deciding import coordinator as coordinator_pod
    from tests.controller.test_deciding import job_body

    planning, _ = loop
    body = job_body()
    parsed = {"ns/j": load_training_job(body)}

    def due(uid: str) -> bool:
        pod = coordinator_pod()
        pod["metadata"]["uid"] = uid
        return planning._views([body], group_pods([pod]), parsed, {}, {})["ns/j"].target_due

    assert not due("u1")  # not answered yet: nothing is asked of it
    planning.coordinators.answered["ns/j"] = "u1"
    assert due("u1")
    planning.coordinators.told["ns/j"] = "u1"  # what a cycle records once its SetTarget succeeded
    assert not due("u1")
    planning.coordinators.answered["ns/j"] = "u2"  # a replacement is told again
    assert due("u2")


def test_a_new_job_starts_a_cycle_without_waiting_for_the_period() -> None:
    """An ordinary change waits for ``min_period_s`` since the last cycle; a new
    TrainingJob (``mark_urgent``) does not."""
    planning, started = recording_loop()

    async def scenario() -> None:
        planning.synced.set()
        planning.mark_dirty()
        assert await started_at_least(started, 1, 5.0)
        planning.mark_dirty()
        assert not await started_at_least(started, 2, 0.5), "an ordinary change waits"
        planning.mark_urgent()
        assert await started_at_least(started, 2, 5.0), "a new job does not"

    running(planning, scenario)


class AnsweringCoordinator:
    """A coordinator that answers ``progress`` and has no state to save."""

    def __init__(self) -> None:
        self.asked = 0

    def progress(self) -> Progress:
        self.asked += 1
        return Progress(0, 0, 1, 0, 0, 10, False, (), (), ())

    def snapshot(self) -> str:
        raise CoordinatorCallError("no state here")

    def drain(self, worker_id: str) -> None: ...

    def set_target(self, workers: int) -> None: ...

    def close(self) -> None: ...


def test_a_coordinators_first_answer_starts_a_cycle_at_once() -> None:
    """The job's workers wait for that answer: the cycle that creates them does not wait
    for ``min_period_s``; a later answer of the same pod is an ordinary change."""
    planning, started = recording_loop()
    answering = AnsweringCoordinator()
    tj = cast(Any, None)
    planning.coordinators.coordinated["ns/j"] = Coordinated(tj, "127.0.0.1:1", True, "u1")
    planning.coordinators.clients["ns/j"] = ("127.0.0.1:1", answering)

    async def scenario() -> None:
        planning.synced.set()
        planning.mark_dirty()
        assert await started_at_least(started, 1, 5.0)
        await asyncio.to_thread(planning.coordinators.polling_one, "ns/j")
        assert planning.coordinators.answered["ns/j"] == "u1"
        assert await started_at_least(started, 2, 5.0), "the first answer starts a cycle"
        planning.coordinators.progress.clear()  # so that a later answer would mark the world dirty
        await asyncio.to_thread(planning.coordinators.polling_one, "ns/j")
        assert not await started_at_least(started, 3, 0.5), "a later answer waits"
        assert answering.asked == 2

    running(planning, scenario)


class StatefulCoordinator(AnsweringCoordinator):
    def snapshot(self) -> str:
        return '{"format": "other"}'


def test_only_a_running_coordinator_pod_is_asked() -> None:
    """Its pod Pending (or Failed: its process could not listen), the job's coordinator is
    not there to answer: an answer at its address came from whatever held the port before
    it. Counted, it made the pod ready and its snapshot was kept as the job's saved state,
    from which every replacement then failed to start."""
    planning = new_loop(ControllerConfig(token_key=b"k" * 32, snapshot_period_s=0.0))
    saved: list[str] = []
    planning.actuator.save_state = lambda ns, name, manifest: saved.append(name)  # type: ignore[method-assign]
    other = StatefulCoordinator()
    tj = cast(Any, SimpleNamespace(metadata=SimpleNamespace(namespace="ns", name="j")))
    planning.coordinators.clients["ns/j"] = ("127.0.0.1:1", other)
    answered = planning.coordinators.answered
    try:
        for phase_running in (False, True):
            planning.coordinators.coordinated["ns/j"] = Coordinated(
                tj, "127.0.0.1:1", phase_running, "u1"
            )
            planning.coordinators.polling_one("ns/j")
            if not phase_running:
                assert other.asked == 0 and "ns/j" not in answered and not saved
        assert other.asked == 1 and answered["ns/j"] == "u1" and saved == ["j"]
    finally:
        planning.actuator.close()


def test_a_draining_replica_gone_is_what_an_admission_waits_for() -> None:
    def pod(phase: str, draining: bool) -> dict[str, Any]:
        annotations = {ANNOTATION_DRAINING: "true"} if draining else {}
        return {"metadata": {"name": "w", "annotations": annotations}, "status": {"phase": phase}}

    assert left_for_good(pod("Succeeded", draining=True), deleted=False)
    assert left_for_good(pod("Failed", draining=True), deleted=False)
    assert left_for_good(pod("Running", draining=True), deleted=True)
    assert not left_for_good(pod("Running", draining=True), deleted=False)
    assert not left_for_good(pod("Succeeded", draining=False), deleted=False)
    assert not left_for_good(pod("Running", draining=False), deleted=True)


def test_each_step_of_a_cycle_is_timed(loop: Any) -> None:
    planning, _ = loop
    planning.elector.is_leader = lambda: True
    planning._holds_loaded = True
    planning.store.save = lambda _reservations: None
    assert planning.cycle(World((), (), (), {})) is not None
    text = generate_latest(planning.metrics.registry).decode()
    for phase in ("lead", "observe", "plan", "decide", "act"):
        assert f'edl_planner_cycle_phase_seconds_count{{phase="{phase}"}} 1.0' in text


class SlowCoordinator(AnsweringCoordinator):
    def __init__(self, release: threading.Event) -> None:
        super().__init__()
        self.release = release
        self.entered = threading.Event()

    def progress(self) -> Progress:
        self.entered.set()
        self.release.wait(10)
        return super().progress()


def test_a_probe_is_not_held_back_by_a_slow_progress_round() -> None:
    config = ControllerConfig(
        token_key=b"k" * 32, progress_period_s=0.05, ready_probe_period_s=0.05
    )
    planning = new_loop(config)
    planning.cycle = lambda _world: None  # type: ignore[method-assign,assignment]
    planning.elector.is_leader = lambda: True  # type: ignore[method-assign]
    release = threading.Event()
    slow, new = SlowCoordinator(release), AnsweringCoordinator()
    tj = cast(Any, None)
    planning.coordinators.coordinated["ns/slow"] = Coordinated(tj, "127.0.0.1:1", True, "u1")
    planning.coordinators.clients["ns/slow"] = ("127.0.0.1:1", slow)
    planning.coordinators.answered["ns/slow"] = "u1"
    planning.coordinators.progress["ns/slow"] = AnsweringCoordinator().progress()

    async def scenario() -> None:
        assert await asyncio.to_thread(slow.entered.wait, 5.0), "a round is stuck on it"
        planning.coordinators.coordinated["ns/new"] = Coordinated(tj, "127.0.0.1:2", True, "u2")
        planning.coordinators.clients["ns/new"] = ("127.0.0.1:2", new)
        deadline = time.monotonic() + 2.0
        while "ns/new" not in planning.coordinators.answered and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        assert planning.coordinators.answered.get("ns/new") == "u2", (
            "the probe waited for the round"
        )
        assert slow.asked == 0, "the round is still waiting for the slow coordinator"
        release.set()  # before the loop stops: its round's thread ends, nothing waits for it

    try:
        running(planning, scenario)
    finally:
        release.set()


def test_quiet_cycles_count_the_cycles_since_the_last_move(
    loop: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``edl_planner_quiet_cycles``: status writes and Events are not moves; a pod deleted
    (or created, drained, ...) is, and starts the count again; so does a plan that wants a
    change no rule acted on yet; a standby's count is 0."""
    from edl_scheduler.controller.intents import Decisions, DeletePod, PatchStatus

    planning, _ = loop
    planning.elector.is_leader = lambda: True
    planning._holds_loaded = True
    planning.store.save = lambda _reservations: None
    planning.actuator.run = lambda _intents: None
    wanted: list[Any] = []
    monkeypatch.setattr(looping, "decide", lambda *_a, **_k: Decisions(intents=list(wanted)))

    def quiet() -> float:
        value = planning.metrics.registry.get_sample_value("edl_planner_quiet_cycles")
        assert value is not None
        return value

    planning.cycle(World((), (), (), {}))
    wanted.append(PatchStatus("ns", "j", {"phase": "Running"}))
    planning.cycle(World((), (), (), {}))
    assert quiet() == 2
    wanted.append(DeletePod("ns", "j-worker-1"))
    planning.cycle(World((), (), (), {}))
    assert quiet() == 0
    wanted.clear()
    planning.cycle(World((), (), (), {}))
    assert quiet() == 1
    # A change the plan wants but the rules defer (no intent yet) is not quiet either.
    real_plan = looping.plan

    def wanting_a_change(*args: Any, **kwargs: Any) -> Any:
        found = real_plan(*args, **kwargs)
        return dataclasses.replace(found, known_changes=(object(),))

    monkeypatch.setattr(looping, "plan", wanting_a_change)
    planning.cycle(World((), (), (), {}))
    assert quiet() == 0
    monkeypatch.setattr(looping, "plan", real_plan)
    planning.cycle(World((), (), (), {}))
    assert quiet() == 1
    # A standby vouches for nothing.
    planning.elector.is_leader = lambda: False
    planning.cycle(World((), (), (), {}))
    assert quiet() == 0


def test_a_deleted_jobs_lingering_coordinator_keeps_its_port(loop: Any) -> None:
    """A job deleted by its user leaves its pods to the garbage collector, and its
    coordinator listens until its pod is gone. A job placed meanwhile must not get that
    port: where coordinators share a network its own could not listen, and the old one,
    still answering there, was taken for it (its snapshot kept as the new job's state)."""
    from edl_scheduler.controller.config import PortRange
    from edl_scheduler.controller.intents import CreateCoordinator
    from tests.controller.test_deciding import coordinator as coordinator_pod
    from tests.controller.test_deciding import job_body

    planning, clock = loop
    planning.config = dataclasses.replace(
        planning.config, coordinator_host="127.0.0.1", coordinator_ports=PortRange(21000, 21010)
    )
    planning.elector.is_leader = lambda: True
    planning._holds_loaded = True
    planning.store.save = lambda _reservations: None
    acted: list[Any] = []
    planning.actuator.run = acted.extend
    clock.now = 1_800_000_000.0
    node = {
        "metadata": {"name": "n0"},
        "spec": {},
        "status": {
            "allocatable": {"nvidia.com/gpu": "4"},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }
    lingering = coordinator_pod("gone", port=21000)
    lingering["metadata"]["deletionTimestamp"] = "2027-01-01T00:00:05Z"
    planning.cycle(World((node,), (lingering,), (job_body("new"),), {}))
    created = [i for i in acted if isinstance(i, CreateCoordinator)]
    assert [c.job.metadata.name for c in created] == ["new"]
    assert created[0].port == 21001
