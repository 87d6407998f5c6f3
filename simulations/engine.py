"""The discrete-event engine: replays a workload through ``plan()`` and carries out each plan
the way a driver would, charging the costs a real cluster charges.

The cycle, in order, at each instant something happens:

1. Completions: a job whose work is done leaves and frees its GPUs.
2. Ends of pauses: a resized job resumes training (only the useful-GPU tally changes).
3. Arrivals: submitted jobs join the snapshot.
4. Plan, if this instant asks for it: with ``plan_on_events``, after any arrival or
   completion; at every planning tick (``tick_s``); and at the next instant when a
   time-based rule of the policy could change the plan (a cool-down or minimum run ending,
   a reservation expiring, a running job's attained GPU-time crossing a queue threshold).
   A tick at which nothing changed and no such rule fell due is skipped: the planner is
   idempotent (invariant 6), so the plan there would be empty. So is a plan that provably
   changes nothing (``pruning.settled``: a rigid policy where no waiting job can start).
5. Apply the plan's changes: started, grown and shrunk jobs pause (``start_delay_s`` for a
   first start, plus ``restart_pause_s`` for a job resumed after suspension,
   ``resize_pause_s`` for a resize); a suspended job keeps its progress and its attained
   GPU-time.

What must stay true: time never goes back; a job runs at its trace duration when it runs at
its requested size without pauses; the same workload, config and policy give the same
result (no clock, no unseeded randomness, no dependence on dict or set order).

Progress is kept lazily (``runs``): an instant costs time in the number of jobs it touches,
not in the number running.
"""

from __future__ import annotations

import gc
import heapq
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from edl_scheduler.core import (
    Action,
    Admission,
    Job,
    JobDecision,
    Node,
    Plan,
    Policy,
    Replica,
    Reservation,
    Resources,
    Role,
    RoleSpec,
    Snapshot,
    ThroughputSample,
    plan,
)
from edl_scheduler.core.incremental import IncrementalPlanner
from edl_scheduler.core.incremental.unchangeable import applies
from edl_scheduler.core.ordering import (
    key_varies,
    queue_band,
    queue_of,
    ranks_by_queue,
    ranks_continuously,
    sort_key,
    starvation_end,
)
from edl_scheduler.core.snapshot import Efficiency
from simulations.active import Active
from simulations.collector import quiet
from simulations.hiding import split
from simulations.instant import arrivals_settled, collect, narrow, plainly
from simulations.listed import Listed
from simulations.runs import JobRecord, Run
from simulations.wakes import GrowthWakes
from simulations.workload import ClusterSpec, SimJob

_INF = math.inf
#: Remaining work below this many seconds counts as done (floating-point slack).
_EPS = 1e-6
_WORKER = Resources(gpu=1)


@dataclass(frozen=True, slots=True)
class SimConfig:
    """How the simulated cluster behaves; times in seconds. ``tick_s = 0`` turns ticks off."""

    tick_s: float = 60.0
    plan_on_events: bool = True
    resize_pause_s: float = 10.0
    restart_pause_s: float = 30.0
    start_delay_s: float = 0.0
    #: Give the planner the throughput each job measured at the sizes it has run.
    report_throughput: bool = True
    #: Leave out of the snapshot waiting jobs that the policy provably cannot start now,
    #: and leave out a plan that provably changes nothing (``pruning.settled``: a policy
    #: that only starts rigid jobs, and no job below its size can start); results are
    #: identical, only faster.
    prune: bool = True
    #: Plan through an ``IncrementalPlanner`` (it keeps its per-job derivations from plan
    #: to plan and returns only changes) and, under LAS queues, keep a running job's
    #: snapshot Job until its queue changes; results are identical, only faster (False:
    #: ``plan()`` itself, the reference path, for tests).
    incremental: bool = True
    #: Leave out of the snapshot running jobs ranked above every job below its size, where
    #: no plan could change them (``hiding``); results are identical, only faster. Off by
    #: default: each snapshot then lacks those jobs (the plan gets their capacity apart),
    #: so a tool that records snapshots to replay them would replay partial ones
    #: (``edl-sim run`` records none and turns it on).
    hide: bool = False


@dataclass(frozen=True, slots=True)
class SimResult:
    policy: str
    cluster: ClusterSpec
    jobs: tuple[JobRecord, ...]
    #: (time, allocated GPUs, useful GPUs) at every change, a step function.
    timeline: tuple[tuple[float, int, float], ...]
    plans: int
    wall_s: float
    plan_wall_s: float


# Event kinds, in the order they are handled at one instant.
_COMPLETE, _PAUSE_END = 0, 1


class Engine:
    """One run of one policy over one workload. Call ``run()`` once."""

    def __init__(
        self,
        jobs: Sequence[SimJob],
        cluster: ClusterSpec,
        policy: Policy,
        config: SimConfig = SimConfig(),
        *,
        label: str | None = None,
        progress: Callable[[int, int], None] | None = None,
    ) -> None:
        self.jobs = sorted(jobs, key=lambda j: (j.submit_time, j.name))
        self.cluster = cluster
        self.policy = policy
        self.config = config
        self.label = label or policy.name
        self.progress = progress
        self.nodes = tuple(
            Node(f"node-{i}", Resources(gpu=cluster.gpus_per_node)) for i in range(cluster.nodes)
        )
        self.node_of = {n.name: i for i, n in enumerate(self.nodes)}
        self.active: dict[str, Run] = {}
        self.running: dict[str, Run] = {}
        self.records: list[JobRecord] = []
        self.events: list[tuple[float, int, int, int, str]] = []
        self.seq = 0
        self.reservations: tuple[Reservation, ...] = ()
        self.allocated = 0
        #: [gpu, cpu, memory] that live workers take per node (``hiding.split`` reads it).
        self.node_used = [[0, 0, 0] for _ in self.nodes]
        self.useful = 0.0
        self.timeline: list[tuple[float, int, float]] = []
        self.plans = 0
        #: Plans left out because only jobs that cannot start had arrived.
        self.skipped = 0
        self.plan_wall = 0.0
        self.fresh_attained = ranks_by_queue(policy) or ranks_continuously(policy)
        #: Under LAS queues the planner reads attained GPU-time only through the job's queue
        #: (``ordering.sort_key``), so a running job's Job is rebuilt only when its queue
        #: changes; its attained GPU-time in the snapshot may lag until then.
        self.queue_only = config.incremental and ranks_by_queue(policy)
        self.planner = IncrementalPlanner(policy) if config.incremental else None
        #: The policy's rank key where it does not depend on ``now``: kept per snapshot Job
        #: (``Run.rank_key``) for pruning, on the incremental path.
        self.fixed_key = (
            sort_key(policy, 0.0) if config.incremental and not key_varies(policy) else None
        )
        #: Whether any job's speed comes from a measured profile (its rate changes by epoch).
        self.profiled = any(j.profile is not None for j in self.jobs)
        #: Whether plans that provably change nothing are left out (``pruning.settled``); not
        #: where jobs measure a speed that changes by epoch: each plan shows it to the planner.
        self.settles = config.prune and not (self.profiled and config.report_throughput)
        #: Whether the last instant that asked for a plan was proven settled.
        self.settled = False
        #: Running jobs' Jobs rebuilt for attained time: in all, and as of the last plan made.
        self.rekeyed = self.rekeyed_seen = 0
        self.least_attained = ranks_continuously(policy)
        #: Whether running jobs no plan could change are left out of the snapshot.
        self.hides = config.hide and self.settles and self.fixed_key is not None and applies(policy)
        #: The active jobs kept as running and waiting (``active``), where ``narrow`` serves.
        narrows = self.hides and policy.admission is not Admission.HEAD_OF_LINE
        self.kept = Active(policy.elastic) if narrows else None
        #: The active jobs' snapshot lists kept between plans, where a job's Job changes
        #: only where the engine drops it (``listed``); else listed afresh (``collect``).
        plain_keys = self.fixed_key is not None and not self.fresh_attained
        self.listed = Listed(policy.elastic) if plain_keys and self.kept is None else None
        #: Whether each snapshot shows every active job, the waiting ones that cannot start
        #: included (pruning then only decides whether a plan is left out). Under an
        #: elastic policy what the running jobs could give (all but their minimums) moves
        #: whenever a job starts or ends, and with it which waiting jobs can start: left
        #: out and shown again, about 33 of 288 jobs a plan came and went (first 20,000
        #: Philly jobs under ``edl``), each a removal and an insertion in the planner's
        #: kept ranking, which cost more than the planner spends on a waiting job it cannot
        #: start. The plans are the same either way.
        self.shows_all = self.listed is not None and policy.elastic
        #: Whether a running job's cool-down and minimum run time fall due (``_next_wake``).
        self.grows = policy.grows
        #: When running jobs' cool-downs and minimum run times end (``wakes``), pushed
        #: where ``_apply`` sets them.
        self.wakes = GrowthWakes(policy)

    # -- events -----------------------------------------------------------------------------

    def _push(self, at: float, kind: int, run: Run) -> None:
        self.seq += 1
        heapq.heappush(self.events, (at, kind, self.seq, run.version, run.job.name))

    def _schedule_completion(self, run: Run) -> None:
        run.version += 1
        at = run.finish_time()
        if at < _INF:
            self._push(at, _COMPLETE, run)

    def _set_useful(self, run: Run, value: float) -> None:
        self.useful += value - run.useful
        run.useful = value

    # -- the loop ---------------------------------------------------------------------------

    def run(self) -> SimResult:
        # The trace and the workload, alive already, leave the collector's walks; young
        # collections come rarer (``collector.quiet``: 7% of a full Philly run's CPU).
        with quiet():
            return self._run()

    def _run(self) -> SimResult:
        began = time.perf_counter()
        jobs, n = self.jobs, len(self.jobs)
        tick = self.config.tick_s
        next_arrival = 0
        next_tick = jobs[0].submit_time if (tick > 0 and jobs) else _INF
        wake_at = _INF
        dirty = False
        #: Whether something other than arrivals changed since the last plan.
        changed = False
        arrived: list[str] = []
        self.timeline.append((jobs[0].submit_time if jobs else 0.0, 0, 0.0))
        while True:
            arrival_at = jobs[next_arrival].submit_time if next_arrival < n else _INF
            event_at = self.events[0][0] if self.events else _INF
            wake = wake_at if self.config.plan_on_events else _INF
            now = min(arrival_at, event_at, wake, next_tick if self.active else _INF)
            if now == _INF:
                break
            # 1-2. completions and ends of pauses due now
            while self.events and self.events[0][0] <= now:
                _, kind, _, version, name = heapq.heappop(self.events)
                run = self.running.get(name)
                if run is None or run.version != version:
                    continue
                if kind == _COMPLETE:
                    self._complete(run, now)
                    dirty = changed = True
                else:
                    run.advance(now)
                    self._set_useful(run, run.useful_now())
            # 3. arrivals
            while next_arrival < n and jobs[next_arrival].submit_time <= now:
                job = jobs[next_arrival]
                self.active[job.name] = Run(job, next_arrival, job.work, last=now)
                if self.kept is not None:
                    self.kept.arrive(self.active[job.name])
                if self.listed is not None:
                    self.listed.arrive(self.active[job.name])
                arrived.append(job.name)
                next_arrival += 1
                dirty = True
            # 4. plan when this instant asks for it
            while next_tick < now:  # ticks skipped while the cluster was empty
                next_tick += tick
            at_tick = now == next_tick
            if at_tick:
                next_tick += tick
            may_plan = self.config.plan_on_events or at_tick
            if may_plan and (dirty or now >= wake_at):
                only_arrivals = not changed and now < wake_at
                self._plan(now, arrived if only_arrivals else None)
                dirty = changed = False
                arrived.clear()
                wake_at = self._next_wake(now)
            if not (self.running or dirty or next_arrival < n or wake_at < _INF):
                break  # nothing runs, arrives or falls due: what is left never starts
            if self.timeline[-1][1:] != (self.allocated, self.useful):
                self.timeline.append((now, self.allocated, self.useful))
            if self.progress is not None:
                self.progress(len(self.records), n)
        for run in self.active.values():
            self.records.append(run.record(None))
        records = sorted(self.records, key=lambda r: (r.submit_time, r.name))
        return SimResult(
            self.label,
            self.cluster,
            tuple(records),
            tuple(self.timeline),
            self.plans,
            time.perf_counter() - began,
            self.plan_wall,
        )

    def _use(self, run: Run, sign: int) -> None:
        """Count (1) or uncount (-1) ``run``'s workers in ``node_used``, all three resources."""
        used, of, res = self.node_used, self.node_of, _WORKER
        for r in run.replicas:
            u = used[of[r.node]]
            u[0] += sign * res.gpu
            u[1] += sign * res.cpu_milli
            u[2] += sign * res.memory_bytes

    def _complete(self, run: Run, now: float) -> None:
        run.advance(now)
        self._use(run, -1)
        self.allocated -= run.workers
        self._set_useful(run, 0.0)
        del self.running[run.job.name]
        if self.kept is not None:
            self.kept.finish(run)
        if self.listed is not None:
            self.listed.finish(run)
        del self.active[run.job.name]
        self.records.append(run.record(now))

    # -- planning ---------------------------------------------------------------------------

    def _snapshot_job(self, run: Run, now: float) -> Job:
        """The job as the planner sees it now. The Job is cached until ``_apply`` changes the
        job (the only place its replicas, samples and times change); where the ranking reads
        attained GPU-time, a running job's Job is rebuilt at every plan, reusing the cached
        spec, replicas and samples."""
        fresh = self.fresh_attained and run.workers > 0
        cached = run.cached
        if cached is not None:
            if not fresh:
                return cached
            if self.queue_only and self._queue(run.attained_at(now)) == self._queue(
                cached.attained_gpu_seconds
            ):
                return cached
            self.rekeyed += 1  # a running job's rank may have moved: see ``_plan``
            worker, replicas, samples = cached.worker, cached.replicas, cached.throughput
            efficiency = cached.efficiency
        else:
            job = run.job
            worker = RoleSpec(job.min_workers, job.max_workers, _WORKER)
            replicas = tuple(run.replicas)
            samples = (
                tuple(run.samples[k] for k in sorted(run.samples))
                if self.config.report_throughput
                else ()
            )
            efficiency = self._efficiency(run)
        job = run.job
        built = Job(
            name=job.name,
            worker=worker,
            submit_time=job.submit_time,
            priority=job.priority,
            requested=job.requested,
            replicas=replicas,
            start_time=run.start_time,
            last_resize_time=run.last_resize_time,
            resizes=run.resizes + run.preemptions,
            attained_gpu_seconds=run.attained_at(now),
            throughput=samples,
            efficiency=efficiency,
        )
        run.cached = built
        if self.fixed_key is not None:
            run.rank_key = self.fixed_key(built)
        if self.queue_only:
            band = queue_band(built.attained_gpu_seconds, self.policy.queue_thresholds_gpu_s)
            run.queue_low, run.queue_high = band
        return built

    def _efficiency(self, run: Run) -> Efficiency | None:
        """A profiled job's statistical efficiency now, once it has measured anything."""
        profile = run.job.profile
        if profile is None or not run.samples:
            return None
        return profile.efficiency(run.placement, run.done)

    def _plan(self, now: float, arrived: list[str] | None = None) -> None:
        """Plan and apply. ``arrived``: the jobs that arrived since the last plan, when
        nothing else changed and no time-based rule fell due; if none of them can start,
        the plan is left out (the last plan's result is a fixed point, invariant 6)."""
        if self.profiled and self.config.report_throughput:
            self._remeasure(now)
        settled_before, self.settled = self.settled, False
        if (
            settled_before
            and arrived is not None
            and arrivals_settled(
                self.running.values(),
                [self.active[name] for name in arrived],
                now,
                self._snapshot_job,
                self.policy,
                self.cluster.gpus - self.allocated,
                queue_only=self.queue_only,
            )
        ):
            self.settled = True
            self.skipped += 1
            return
        # (A cached Job is taken where it holds: ``instant.collect``, ``active``, ``listed``.)
        free = self.cluster.gpus - self.allocated
        ask = self.settles and not self._holding(now)
        view = None
        if self.kept is not None:  # the three answers from the kept lists (``instant``)
            listed = self.kept.listing(
                now, self._snapshot_job, self.queue_only, self.fresh_attained
            )
            view = narrow(*listed, self.policy, now, free, self.reservations, ask_settled=ask)
        if view is None:
            tallied = None
            if self.listed is not None:
                lists = self.listed.listing(now, self._snapshot_job)
                tallied = self.listed.tally()
            else:
                got = collect(
                    self.active.values(),
                    now,
                    self._snapshot_job,
                    queue_only=self.queue_only,
                    fresh=self.fresh_attained,
                    keyed=self.fixed_key is not None,
                )
                lists = got.jobs, got.live, got.keys
            view = plainly(
                lists[0],
                lists[1],
                lists[2],
                self.policy,
                now,
                free,
                self.reservations,
                self.config.prune,
                ask,
                tallied,
            )
        jobs, live = view.jobs, view.live
        keys = view.keys if self.fixed_key is not None else None
        # A waiting job left out cannot start (``shown``), so nothing can where none shown can.
        if view.settled:
            self.skipped += 1
            self.rekeyed_seen = self.rekeyed
            self.reservations = ()  # what the plan would return: no hold is left
            # Keys that change only at wake-ups: ``arrivals_settled`` may then be asked.
            self.settled = self.fixed_key is not None and not self.least_attained
            return
        # Not where a running job's rank may have moved (a LAS queue crossed at no wake-up).
        moved = self.rekeyed != self.rekeyed_seen
        if self.config.prune and arrived is not None and len(jobs) < len(self.active) and not moved:
            names = {j.name for j in jobs}
            if not any(name in names for name in arrived):
                self.skipped += 1
                return
        if self.shows_all and self.listed is not None:
            jobs, live, keys = self.listed.jobs, self.listed.live, self.listed.keys
        occupied = None
        if self.hides and keys is not None:
            jobs, occupied = split(
                jobs, live, keys, self.policy, self.node_of, self.node_used, best=view.best
            )
        snapshot = Snapshot(self.nodes, tuple(jobs), self.reservations)
        began = time.perf_counter()
        # The cyclic garbage collector is paused while the planner runs, then restored as
        # it was: a plan allocates a few objects per job and makes no reference cycles, so
        # reference counting frees everything, but the collector's scans of the snapshot
        # cost much of a plan (about 40% at 10,000 jobs). It changes no result; the
        # simulator runs on one thread, so nothing else notices. (Written out: a context
        # manager is a Python-level generator, about 3% of a compiled simulation.)
        enabled = gc.isenabled()
        gc.disable()
        try:
            result: Plan = (
                plan(snapshot, self.policy, now)
                if self.planner is None
                else self.planner.plan(snapshot, now, occupied)
            )
        finally:
            if enabled:
                gc.enable()
        self.plan_wall += time.perf_counter() - began
        self.plans += 1
        self.rekeyed_seen = self.rekeyed
        self.reservations = result.reservations
        changes = result.changes
        for decision in changes:
            self._apply(self.active[decision.job], decision, now)

    def _holding(self, now: float) -> bool:
        """Whether a reservation still holds room for a job below its size (a plan would
        carry it; one for a job that runs, has left or expired, a plan drops)."""
        for r in self.reservations:
            run = self.active.get(r.job)
            if run is not None and r.expires_at > now and run.workers < run.job.min_workers:
                return True
        return False

    def _remeasure(self, now: float) -> None:
        """A runtime keeps measuring at its job's current size (the coordinator's smoothed
        rate, which the controller copies into the status), so the sample at that size
        follows the job now, and so do its gradient statistics (``Efficiency``). A profiled
        job's batch (with adaptation) and statistical efficiency change with its epoch; the
        samples at sizes it left keep what it measured there."""
        for run in self.running.values():
            profile = run.job.profile
            if profile is None or run.paused_until > now:
                continue
            run.advance(now)
            key = (len(run.placement), run.workers)
            rate, batch = profile.measured(run.placement, run.done)
            sample = run.samples[key]
            if (sample.samples_per_second, sample.batch) != (rate, batch):
                run.samples[key] = ThroughputSample(key[0], key[1], rate, batch)
                self._drop_job(run)
            cached = run.cached
            if cached is not None and cached.efficiency != self._efficiency(run):
                self._drop_job(run)

    def _drop_job(self, run: Run) -> None:
        """``run``'s snapshot Job is rebuilt at the next plan (its replicas, samples or
        times changed): the only place a cached Job is dropped."""
        run.cached = None
        if self.listed is not None:
            self.listed.touch(run)

    def _queue(self, attained: float) -> int:
        """The LAS queue index of a running job with ``attained`` GPU-seconds."""
        return queue_of(attained, self.policy.queue_thresholds_gpu_s)

    def _next_epoch(self, now: float) -> float:
        """When a running profiled job next enters a new epoch: its measured rate changes
        there, so the plan may change (a controller, planning every cycle, would see it)."""
        wake = _INF
        for run in self.running.values():
            profile = run.job.profile
            if profile is None or run.rate <= 0:
                continue
            edge = profile.horizon(run.done)
            if edge < run.total:
                rate = profile.rate(run.placement, run.done)
                at = max(run.last, run.paused_until) + (edge - run.done) / rate
                if at > now:
                    wake = min(wake, at)
        return wake

    def _apply(self, run: Run, decision: JobDecision, now: float) -> None:
        action, change = decision.action, decision.workers
        run.advance(now)
        self._use(run, -1)
        before = run.workers
        self.allocated -= before
        self._set_useful(run, 0.0)
        gone = set(change.remove)
        run.replicas = [r for r in run.replicas if r.name not in gone]
        for node in change.add_nodes:
            run.serial += 1
            run.replicas.append(Replica(f"{run.job.name}-w{run.serial}", Role.WORKER, node))
        after = run.workers
        config = self.config
        if action is Action.START:
            pause = config.start_delay_s
            if run.first_start is None:
                run.first_start = now
            else:
                pause += config.restart_pause_s
            run.start_time = now
        elif action is Action.SUSPEND or after == 0:
            run.preemptions += 1
            run.start_time = None
            pause = 0.0
        else:
            run.resizes += 1
            pause = config.resize_pause_s
        run.last_resize_time = now
        run.paused_until = now + pause
        counts: dict[str, int] = {}
        for r in run.replicas:
            counts[r.node] = counts.get(r.node, 0) + 1
        run.placement = tuple(sorted(counts.values()))
        profile = run.job.profile
        if profile is None:
            run.rate = run.job.rate(after)
        else:
            run.rate = profile.rate(run.placement, run.done) if after else 0.0
        self._drop_job(run)
        if self.kept is not None:
            self.kept.place(run, before, after)
        self.allocated += after
        self._use(run, 1)
        if after:
            self.running[run.job.name] = run
            nodes = len(run.placement)
            if config.report_throughput and (nodes, after) not in run.samples:
                if profile is None:
                    run.samples[(nodes, after)] = ThroughputSample(nodes, after, run.rate)
                else:
                    rate, batch = profile.measured(run.placement, run.done)
                    run.samples[(nodes, after)] = ThroughputSample(nodes, after, rate, batch)
        else:
            self.running.pop(run.job.name, None)
        self._schedule_completion(run)  # bumps the version: older events of the job are void
        if after and self.grows:
            self.wakes.push(run)
        if after and pause > 0:
            self._push(now + pause, _PAUSE_END, run)
        elif after:
            self._set_useful(run, run.useful_now())

    def _next_wake(self, now: float) -> float:
        """The next instant a time-based rule of the policy could change the plan."""
        policy = self.policy
        wake = _INF
        for r in self.reservations:
            if r.expires_at > now:
                wake = min(wake, r.expires_at)
        thresholds = policy.queue_thresholds_gpu_s
        if thresholds:
            for run in self.running.values():
                workers = len(run.replicas)  # ``attained_at`` and ``workers``, inlined
                got = run.attained + workers * (now - run.last)
                for t in thresholds:
                    if t > got + _EPS:
                        at = now + (t - got) / workers
                        if at < wake:
                            wake = at
                        break
        if self.grows:
            wake = min(wake, self.wakes.next_after(now, self.running))
        if self.profiled and self.config.report_throughput:
            wake = min(wake, self._next_epoch(now))
        if policy.starvation_limit_s is not None:
            for run in self.active.values():
                if not run.workers:
                    starves = starvation_end(run.job.submit_time, policy)
                    if starves is not None and starves > now:
                        wake = min(wake, starves)
        return wake


def simulate(
    jobs: Sequence[SimJob],
    cluster: ClusterSpec,
    policy: Policy,
    config: SimConfig = SimConfig(),
    *,
    label: str | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> SimResult:
    """Replay ``jobs`` on ``cluster`` under ``policy``."""
    return Engine(jobs, cluster, policy, config, label=label, progress=progress).run()
