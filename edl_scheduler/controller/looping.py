"""The planning loop: one cycle at a time, when the world changed, within a min and max period.

A cycle, in numbered steps:
1. Leader check: only the holder of the Lease goes on (``leading``; the Lease is taken and
   renewed by a thread of its own, the check calls no API).
2. Copy the watched objects (taken on the event loop, where kopf keeps its indexes up to
   date) and lay over them what this process wrote and the watch has not shown yet.
3. observe -> Snapshot (pure), plan (pure), decide -> intents (pure).
4. Act (``actuating``): pods, coordinator calls, statuses, Events.
5. Metrics.

Events mark the world dirty; a cycle starts at most every ``min_period_s`` and at least every
``max_period_s``, except that what an admission waits for starts one as soon as the cycle
in progress (if any) ends (``mark_urgent``): a new TrainingJob, a coordinator's first answer
(its job's workers wait for it), a leaving replica gone (its room is free). A background
thread asks each coordinator for its progress (and copies its state into the job's
ConfigMap); a change that matters (finished, members) marks the world dirty too.

What must stay true: nothing is remembered across cycles that the API does not hold, except
short-lived expectations of our own writes and caches that only spare work (``Memo``,
``QuietJobs``); a restarted controller rebuilds everything from the API. The planner's
reservations are stored (``reserving``) before the plan that made them is acted on, and a
replica that becomes leader reads them before it plans.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import threading
import time
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from edl_scheduler.api import TrainingJob, TrainingJobError, load_training_job
from edl_scheduler.controller.actuating import Actuator
from edl_scheduler.controller.config import ControllerConfig
from edl_scheduler.controller.deciding import NodeStates, QuietJobs, decide
from edl_scheduler.controller.intents import Emit, JobView, PatchStatus
from edl_scheduler.controller.kubeapi import Kube, KubeError
from edl_scheduler.controller.leading import LeaderElector
from edl_scheduler.controller.leaving import orphans
from edl_scheduler.controller.metrics import Metrics
from edl_scheduler.controller.observing import Memo, observe, pod_requests, replica_of
from edl_scheduler.controller.podstate import coordinator_port_of, group_pods, key_of
from edl_scheduler.controller.polling import Coordinators
from edl_scheduler.controller.reserving import ReservationStore
from edl_scheduler.core import ClusterError, Node, Plan, Reason, Reservation, Resources, plan

log = logging.getLogger("edl.controller.loop")

Obj = Mapping[str, Any]
#: At most this many jobs get a status write for their attained GPU-time alone per cycle.
ATTAINED_WRITES_PER_CYCLE = 16


@dataclass(frozen=True, slots=True)
class World:
    """The watched objects at one instant (copied from kopf's indexes)."""

    nodes: Sequence[Obj]
    pods: Sequence[Obj]
    jobs: Sequence[Obj]
    priority_classes: Mapping[str, int]


def new_name(job: str, role: str) -> str:
    return f"{job}-{role}-{secrets.token_hex(3)}"


class PlanningLoop:
    def __init__(
        self,
        config: ControllerConfig,
        kube: Kube,
        world: Callable[[], World],
        metrics: Metrics,
    ) -> None:
        self.config = config
        self.kube = kube
        self.world = world
        self.metrics = metrics
        self.elector = LeaderElector(
            kube,
            config.lease_name,
            config.lease_namespace,
            config.identity,
            config.lease_duration_s,
        )
        self.coordinators = Coordinators(
            config,
            lambda: self.elector.is_leader(),
            self._keeping_state,
            self.mark_urgent,
            self._mark_dirty_threadsafe,
        )
        self._attained: dict[str, float] = {}
        self._attained_left = ATTAINED_WRITES_PER_CYCLE
        self.actuator = Actuator(kube, config, self.coordinators.client_of)
        self.reservations: tuple[Reservation, ...] = ()
        self.store = ReservationStore(kube, config.lease_namespace, config.lease_name)
        #: Whether ``reservations`` were read from the store since this replica last led.
        self._holds_loaded = False
        self.memo = Memo()
        self.quiet = QuietJobs(self._attained_pending)
        self.synced = asyncio.Event()
        self.dirty = asyncio.Event()
        self.urgent = asyncio.Event()
        self.stopping = threading.Event()
        self.last_plan: Plan | None = None
        self.cycles = 0
        #: Job -> the message of the SetAside decision last logged for it.
        self._aside: dict[str, str] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lease_thread: threading.Thread | None = None

    # ----- triggers -----

    def mark_dirty(self) -> None:
        self.dirty.set()

    def mark_urgent(self) -> None:
        """A change that an admission waits for (a new TrainingJob, a coordinator's first
        answer, a victim gone): the next cycle starts as soon as the one in progress ends,
        without waiting for ``min_period_s``. Safe from any thread (kopf runs synchronous
        handlers in its executor; the progress poller has threads of its own)."""
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._set_urgent)

    def _set_urgent(self) -> None:
        self.urgent.set()
        self.dirty.set()

    def _elected(self) -> None:
        log.info("leading: the Lease %s/%s is ours", self.config.lease_namespace,
                 self.config.lease_name)  # fmt: skip
        self._mark_dirty_threadsafe()

    def _mark_dirty_threadsafe(self) -> None:
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self.dirty.set)

    def stop(self) -> None:
        """Asks the loop and its threads to stop; the cycle in flight, if any, finishes."""
        self.stopping.set()
        self.mark_urgent()

    def release_lease(self, timeout_s: float) -> bool:
        """At a graceful stop, once ``run`` has returned (no cycle in flight): waits for the
        lease thread to end, then gives the Lease up so that a standby leads at once."""
        thread = self._lease_thread
        if thread is not None:
            thread.join(timeout_s)
            if thread.is_alive():
                log.warning("the lease thread did not stop: the Lease is left to lapse")
                return False
        return self.elector.release()

    def _keeping_state(self, namespace: str, name: str, manifest: Callable[[], Obj]) -> None:
        self.actuator.save_state(namespace, name, manifest)

    # ----- the loop -----

    async def run(self) -> None:
        self._loop = asyncio.get_running_loop()
        for name, asking in (
            ("progress", self.coordinators.polling_forever),
            ("ready-probe", self.coordinators.probing_forever),
        ):
            threading.Thread(target=asking, args=(self.stopping,), name=name, daemon=True).start()
        self._lease_thread = threading.Thread(
            target=self.elector.renewing,
            args=(self.stopping, self._elected),
            name="lease",
            daemon=True,
        )
        self._lease_thread.start()
        await self.synced.wait()
        # What a restart's first cycle waited for, read in the log (benchmarks/
        # controller_recovery.py): the initial listing of every watched object, the Lease.
        log.info("every watched object listed: planning may start")
        last = 0.0
        while not self.stopping.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.dirty.wait(), timeout=self.config.max_period_s)
            wait = self.config.min_period_s - (time.monotonic() - last)
            if wait > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.urgent.wait(), timeout=wait)
            if self.stopping.is_set():
                break  # woken to stop: no cycle starts after a graceful stop began
            self.dirty.clear()
            self.urgent.clear()
            last = time.monotonic()
            world = self.world()  # 2: on the event loop, where the indexes change
            try:
                await asyncio.to_thread(self.cycle, world)
            except ClusterError as error:
                self.metrics.cycle_failures.labels(cause="cluster").inc()
                log.error(
                    "PLANNING STOPPED for every job: %s (edl_planner_cycle_failures_total"
                    '{cause="cluster"}); the next cycle tries again',
                    error,
                )
            except Exception:
                self.metrics.cycle_failures.labels(cause="error").inc()
                log.exception(
                    "PLANNING STOPPED for every job by a bug (edl_planner_cycle_failures_total"
                    '{cause="error"}); the next cycle starts from the API again'
                )

    def cycle(self, world: World) -> Plan | None:
        started = time.monotonic()
        phases = _PhaseClock(self.metrics, started)
        leader = self.elector.is_leader()  # 1
        self.metrics.leader.set(1 if leader else 0)
        if not leader:
            self._holds_loaded = False  # another leader may change them meanwhile
            self.metrics.quiet_cycles.set(0)  # a standby vouches for nothing
            self.metrics.last_cycle = time.monotonic()
            return None
        if not self._holds_loaded:
            try:
                self.reservations = self.store.load()
            except KubeError as error:
                log.warning("cannot read the stored reservations (%s); planning waits", error)
                self.metrics.last_cycle = time.monotonic()
                return None
            self._holds_loaded = True
            if self.reservations:
                log.info("leading with %d stored reservations", len(self.reservations))
        phases.done("lead")
        now = time.time()
        pods = self.actuator.expectations.overlay_pods(world.pods, time.monotonic())
        bodies = [self.actuator.expectations.overlay_job(b) for b in world.jobs]
        observation = observe(
            world.nodes,
            pods,
            bodies,
            world.priority_classes,
            self.reservations,
            self.memo,
            self.config.allowed_pod_fields,
        )  # 3
        phases.done("observe")
        result = plan(observation.snapshot, self.config.policy, now)
        phases.done("plan")
        aside = {d.job: d for d in result.decisions if d.reason is Reason.SET_ASIDE}
        self.metrics.jobs_set_aside.set(len(aside))
        for name, decision in aside.items():
            if self._aside.get(name) != decision.message:  # said once, not every cycle
                log.warning("plan: %s", decision)
        self._aside = {name: d.message for name, d in aside.items()}
        self.reservations = result.reservations
        for change in result.changes:
            log.info("plan: %s", change)
        priorities = {j.name: j.priority for j in observation.snapshot.jobs}
        grouped = group_pods(pods)
        views = self._views(bodies, grouped, observation.jobs, observation.rejected, priorities)
        # Coordinators of jobs gone (deleted, their pods not yet collected) keep their ports.
        held = [
            port
            for key, (_, pod) in grouped.items()
            if key not in views and (port := coordinator_port_of(pod)) is not None
        ]
        usage = _replica_usage(pods, self.memo)
        node_states = NodeStates(
            frozenset(n.name for n in observation.snapshot.nodes),
            frozenset(n.name for n in observation.snapshot.nodes if not n.schedulable),
            _free(observation.snapshot.nodes, usage),
        )
        self._attained_left = ATTAINED_WRITES_PER_CYCLE
        decisions = decide(
            views,
            result,
            self.config,
            now,
            new_name,
            self._attained_due,
            node_states,
            self.quiet,
            held,
        )
        phases.done("decide")
        listed = {key_of(b) for b in world.jobs}
        decisions.intents.extend(orphans(pods, listed, self.config.namespaces.serves))
        if not self.elector.is_leader():
            return None  # the Lease lapsed while planning: act on nothing
        self.store.save(result.reservations)  # before the drains that free their room
        self.actuator.run(decisions.intents)  # 4
        phases.done("act")
        # Quiet: the plan wants no change and the cycle made no move. A change the rules
        # defer (new replicas waiting for victims to leave or for their coordinator) emits no
        # intent, but the cluster does not match the plan yet.
        if result.changes or any(not isinstance(i, PatchStatus | Emit) for i in decisions.intents):
            self.metrics.quiet_cycles.set(0)
        else:
            self.metrics.quiet_cycles.inc()
        self.coordinators.telling(self.actuator.targets_set)
        for key in decisions.attained_written:
            self._attained[key] = now
        self.coordinators.remembering(views)
        c = decisions.counts  # 5
        self.metrics.count(c.resizes, c.preemptions, c.waited_s, c.completed_s)
        self.metrics.set_jobs(str((b.get("status") or {}).get("phase", "Pending")) for b in bodies)
        capacity = sum(n.allocatable.gpu for n in observation.snapshot.nodes if n.schedulable)
        self.metrics.gpus_capacity.set(capacity)
        self.metrics.gpus_allocated.set(sum(r.gpu for r in usage.values()))
        self.metrics.cycle_seconds.observe(time.monotonic() - started)
        self.metrics.last_cycle = time.monotonic()
        self.last_plan = result
        if self.cycles == 0:
            log.info("first cycle as leader done in %.3f s", time.monotonic() - started)
        self.cycles += 1
        return result

    def _attained_period(self, key: str) -> float:
        stretch = (zlib.crc32(key.encode()) % 1000) / 2000
        return self.config.attained_period_s * (1 + stretch)

    def _attained_pending(self, key: str) -> bool:
        """Whether ``key``'s attained GPU-time is due (``_attained_due`` without granting a
        write): such a job is decided this cycle even if nothing else of it changed."""
        last = self._attained.get(key)
        return last is None or time.time() - last >= self._attained_period(key)

    def _attained_due(self, key: str) -> float:
        """The time since ``key``'s attained GPU-time was last written, once it is due.

        Each job's period is ``attained_period_s`` stretched by up to half again, by a fixed
        amount per job, and a cycle grants at most ``ATTAINED_WRITES_PER_CYCLE`` of these
        writes (the others wait for the next cycle and then count the longer time): jobs
        started together would otherwise all be due in one cycle, hundreds of status
        writes that the next cycle, and an admission waiting on it, sat behind."""
        now = time.time()
        last = self._attained.setdefault(key, now)
        elapsed = now - last
        if elapsed < self._attained_period(key) or self._attained_left <= 0:
            return 0.0
        self._attained_left -= 1
        return elapsed

    def _views(
        self,
        bodies: Sequence[Obj],
        grouped: Mapping[str, tuple[list[Obj], Obj | None]],
        parsed: Mapping[str, TrainingJob],
        rejected: Mapping[str, str],
        priorities: Mapping[str, int],
    ) -> dict[str, JobView]:
        views: dict[str, JobView] = {}
        for body in bodies:
            key = key_of(body)
            replicas, coordinator = grouped.get(key, ([], None))
            tj = parsed.get(key)
            if tj is None and key not in rejected:
                try:  # a job in a final phase: observe leaves it out of the snapshot
                    tj = self.memo.get("job", body, lambda o: load_training_job(dict(o)))
                except TrainingJobError:
                    continue
            views[key] = JobView(
                body,
                tj,
                rejected.get(key),
                tuple(replicas),
                coordinator,
                self.coordinators.progress.get(key),
                priorities.get(key),
                coordinator_ready=(ready := self.coordinators.ready(key, coordinator)),
                target_due=ready and self.coordinators.target_due(key),
                status_unseen=self.actuator.expectations.status_unseen(key),
            )
        return views


class _PhaseClock:
    """Observes how long each step of a cycle took (``edl_planner_cycle_phase_seconds``)."""

    def __init__(self, metrics: Metrics, started: float) -> None:
        self.metrics = metrics
        self.last = started

    def done(self, phase: str) -> None:
        now = time.monotonic()
        self.metrics.cycle_phase_seconds.labels(phase=phase).observe(now - self.last)
        self.last = now


def _replica_usage(pods: Sequence[Obj], memo: Memo) -> dict[str, Resources]:
    """What our replicas take from each node, leaving ones too. Parsed once per pod version
    (``memo``): at a thousand pods, parsing every pod's requests again each cycle was a third
    of the cycle."""
    ours: dict[str, Resources] = {}
    for pod in pods:
        found = memo.get("replica", pod, replica_of)
        if found is not None:
            node = found[1].node
            ours[node] = ours.get(node, Resources()) + memo.get("requests", pod, pod_requests)
    return ours


def _free(nodes: Sequence[Node], ours: Mapping[str, Resources]) -> dict[str, Resources]:
    """What each node has free now: every replica still on it counts, leaving ones too."""
    return {n.name: n.allocatable - n.used_by_others - ours.get(n.name, Resources()) for n in nodes}
