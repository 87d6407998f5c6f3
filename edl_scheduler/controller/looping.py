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
import hashlib
import logging
import secrets
import threading
import time
import zlib
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from edl_scheduler.api import JobPhase, TrainingJob, TrainingJobError, load_training_job
from edl_scheduler.controller.actuating import Actuator
from edl_scheduler.controller.config import ControllerConfig
from edl_scheduler.controller.coordinating import (
    CoordinatorCallError,
    CoordinatorPort,
    GrpcCoordinator,
    Progress,
)
from edl_scheduler.controller.deciding import NodeStates, QuietJobs, decide
from edl_scheduler.controller.intents import Emit, JobView, PatchStatus
from edl_scheduler.controller.kubeapi import Kube, KubeError
from edl_scheduler.controller.leading import LeaderElector
from edl_scheduler.controller.leaving import orphans
from edl_scheduler.controller.metrics import Metrics
from edl_scheduler.controller.observing import Memo, observe, pod_requests, replica_of
from edl_scheduler.controller.podstate import coordinator_port_of, group_pods, key_of
from edl_scheduler.controller.reserving import ReservationStore
from edl_scheduler.controller.shaping import coordinator_address, state_config_map
from edl_scheduler.core import ClusterError, Node, Plan, Reason, Reservation, Resources, plan

log = logging.getLogger("edl.controller.loop")

Obj = Mapping[str, Any]
#: The progress rounds ask at most this many coordinators a second (the round's period
#: grows with the number of jobs beyond ``progress_period_s``).
PROGRESS_CALLS_PER_S = 50
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


@dataclass(slots=True)
class _Coordinated:
    tj: TrainingJob
    address: str
    running: bool
    #: The coordinator pod's uid: an answer counts for this pod only.
    uid: str


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
        self._clients: dict[str, tuple[str, CoordinatorPort]] = {}
        self._clients_lock = threading.Lock()
        self._progress: dict[str, Progress] = {}
        #: job key -> uid of the coordinator pod that last answered: a job's workers are
        #: created once its coordinator answers (``JobView.coordinator_ready``).
        self._answered: dict[str, str] = {}
        #: job key -> uid of the coordinator pod last told the job's size (``target_due``).
        self._told: dict[str, str] = {}
        self._coordinated: dict[str, _Coordinated] = {}
        self._snapshots: dict[str, float] = {}
        #: job key -> digest of the coordinator state last written to its ConfigMap
        self._saved: dict[str, bytes] = {}
        self._attained: dict[str, float] = {}
        self._attained_left = ATTAINED_WRITES_PER_CYCLE
        self.actuator = Actuator(kube, config, self._client_of)
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

    # ----- the loop -----

    async def run(self) -> None:
        self._loop = asyncio.get_running_loop()
        poller = threading.Thread(target=self._poll_forever, name="progress", daemon=True)
        poller.start()
        prober = threading.Thread(target=self._probe_forever, name="ready-probe", daemon=True)
        prober.start()
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
        for key in self.actuator.targets_set:
            if key in self._answered:
                self._told[key] = self._answered[key]
        for key in decisions.attained_written:
            self._attained[key] = now
        self._remember_coordinators(views)
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
                self._progress.get(key),
                priorities.get(key),
                coordinator_ready=(ready := self._ready(key, coordinator)),
                target_due=ready and self._told.get(key) != self._answered.get(key),
                status_unseen=self.actuator.expectations.status_unseen(key),
            )
        return views

    def _ready(self, key: str, coordinator: Obj | None) -> bool:
        """The job's coordinator pod is Running, not being deleted, and has answered."""
        if coordinator is None:
            return False
        meta = coordinator.get("metadata", {})
        return (
            not meta.get("deletionTimestamp")
            and coordinator.get("status", {}).get("phase") == "Running"
            and bool(meta.get("uid"))
            and self._answered.get(key) == meta.get("uid")
        )

    # ----- coordinators -----

    def _remember_coordinators(self, views: Mapping[str, JobView]) -> None:
        known: dict[str, _Coordinated] = {}
        for key, view in views.items():
            port = coordinator_port_of(view.coordinator)
            if view.tj is None or port is None or view.coordinator is None:
                continue
            if JobPhase(view.body.get("status", {}).get("phase", "Pending")).final:
                continue
            meta = view.coordinator.get("metadata", {})
            if meta.get("deletionTimestamp"):
                continue
            running = view.coordinator.get("status", {}).get("phase") == "Running"
            address = coordinator_address(view.tj, port, self.config)
            known[key] = _Coordinated(view.tj, address, running, str(meta.get("uid", "")))
        self._coordinated = known
        with self._clients_lock:
            for key in [k for k in self._clients if k not in known]:
                self._clients.pop(key)[1].close()
                self._progress.pop(key, None)
                self._saved.pop(key, None)
            for key in [k for k in self._answered if k not in known]:
                del self._answered[key]
            for key in [k for k in self._told if k not in known]:
                del self._told[key]

    def _client_of(self, key: str) -> CoordinatorPort | None:
        found = self._coordinated.get(key)
        if found is None:
            return None
        with self._clients_lock:
            have = self._clients.get(key)
            if have is not None and have[0] == found.address:
                return have[1]
            if have is not None:
                have[1].close()
            meta = found.tj.metadata
            token = self.config.credentials_for(meta.namespace, meta.name, meta.uid or "")
            tls = self.config.tls_for(meta.uid or "")
            client = GrpcCoordinator(
                found.address,
                token.controller(),
                self.config.coordinator_timeout_s,
                tls.for_clients() if tls is not None else None,
            )
            self._clients[key] = (found.address, client)
            return client

    def _poll_forever(self) -> None:
        """Asks every coordinator that has answered for its progress each
        ``progress_period_s`` (or less often, so that the rounds make at most
        ``PROGRESS_CALLS_PER_S`` calls a second: at 200 jobs, one call per job and second took
        most of this process's CPU and slowed the planning cycle threefold)."""
        pool = ThreadPoolExecutor(max_workers=16, thread_name_prefix="progress")
        period = self.config.progress_period_s
        try:
            while not self.stopping.wait(period):
                if not self.elector.is_leader():
                    continue
                started = time.monotonic()
                jobs = [
                    k
                    for k, c in dict(self._coordinated).items()
                    if c.running and self._answered.get(k) == c.uid
                ]
                list(pool.map(self._poll_one, jobs))
                spent = time.monotonic() - started
                wanted = max(self.config.progress_period_s, len(jobs) / PROGRESS_CALLS_PER_S)
                period = max(0.0, wanted - spent)
        finally:
            pool.shutdown(wait=False)

    def _probe_forever(self) -> None:
        """Asks each coordinator that has not answered yet (its pod just created or replaced)
        every ``ready_probe_period_s`` once its pod is Running, on threads of its own: its
        first answer starts a cycle at once, which creates the job's waiting workers. Apart
        from the progress rounds, so that a round over hundreds of jobs never holds a probe
        back."""
        pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="ready-probe")
        try:
            while not self.stopping.wait(self.config.ready_probe_period_s):
                if not self.elector.is_leader():
                    continue
                jobs = [
                    k
                    for k, c in dict(self._coordinated).items()
                    if c.running and self._answered.get(k) != c.uid
                ]
                list(pool.map(self._poll_one, jobs))
        finally:
            pool.shutdown(wait=False)

    def _poll_one(self, key: str) -> None:
        asked = self._coordinated.get(key)
        if asked is None or not asked.running:
            # A pod not Running has no process yet: whatever answers at its address is
            # another (one that held the port before it), and its answer must not count
            # for this pod, nor its snapshot be kept as this job's state.
            return
        client = self._client_of(key)
        if client is None:
            return
        try:
            progress = client.progress()
        except CoordinatorCallError as error:
            log.debug("no progress from %s: %s", key, error)
            return
        if self._answered.get(key) != asked.uid:
            self._answered[key] = asked.uid
            log.info("%s: coordinator %s answers", key, asked.address)
            self.mark_urgent()  # the job's workers wait for exactly this answer
        before = self._progress.get(key)
        self._progress[key] = progress
        if before is None or (
            before.finished != progress.finished
            or before.members != progress.members
            or before.generation != progress.generation
        ):
            self._mark_dirty_threadsafe()
        now = time.monotonic()
        if now - self._snapshots.get(key, 0.0) >= self.config.snapshot_period_s:
            self._snapshots[key] = now
            found = self._coordinated.get(key)
            if found is None:
                return
            try:
                state = client.snapshot()
                digest = hashlib.sha256(state.encode()).digest()
                if self._saved.get(key) == digest:
                    return  # unchanged: no write
                tj = found.tj
                self.actuator.save_state(
                    tj.metadata.namespace,
                    tj.metadata.name,
                    lambda: state_config_map(tj, state),
                )
                self._saved[key] = digest
            except Exception as error:
                log.info("could not keep the state of %s: %s", key, error)


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
