"""The discrete-event engine: replays a workload through ``plan()`` and carries out each plan
the way a driver would, charging the costs a real cluster charges.

The cycle, in order, at each instant something happens:

1. Completions: a job whose work is done leaves and frees its GPUs.
2. Ends of pauses: a resized job resumes training (only the useful-GPU tally changes).
3. Arrivals: submitted jobs join the snapshot.
4. Plan, if this instant asks for it: with ``plan_on_events``, after any arrival or
   completion; at every planning tick (``tick_s``); and at the next instant when a
   time-based rule of the policy could change the plan (a cool-down or minimum run ending,
   the ramp interval of a job on its way up ending, a reservation expiring, a running
   job's attained GPU-time crossing a queue threshold). A tick at which nothing changed and
   no such rule fell due is skipped: the planner is idempotent (invariant 6), so the plan
   there would be empty, but for a move rebalancing values more as the jobs age
   (``stability.restart_factor``), which waits for the next plan. So is a plan that provably
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

import heapq
import math
import time
from collections.abc import Callable, Sequence

from edl_scheduler.core import (
    Action,
    Admission,
    JobDecision,
    Node,
    Plan,
    Policy,
    Replica,
    Reservation,
    Resources,
    Role,
    Snapshot,
    ThroughputSample,
    plan,
)
from edl_scheduler.core.incremental import IncrementalPlanner
from edl_scheduler.core.incremental.unchangeable import applies
from edl_scheduler.core.ordering import (
    ranks_continuously,
    starvation_end,
)
from simulations.collector import paused, quiet
from simulations.config import SimConfig
from simulations.leaving_out import leave_out
from simulations.running_and_waiting import RunningAndWaiting
from simulations.runs import JobRecord, Run, SimResult
from simulations.showing import arrivals_settled, collect, shown_from_all, shown_from_sides
from simulations.snapshot_jobs import SnapshotJobs
from simulations.snapshot_lists import SnapshotLists
from simulations.wakes import GrowthWakes, YieldWakes, next_epoch, next_queue
from simulations.workload import ClusterSpec, SimJob

__all__ = ["Engine", "SimConfig", "SimResult", "simulate"]

_INF = math.inf
_WORKER = Resources(gpu=1)


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
        #: [gpu, cpu, memory] that live workers take per node (``leaving_out.leave_out`` reads it).
        self.node_used = [[0, 0, 0] for _ in self.nodes]
        self.useful = 0.0
        self.timeline: list[tuple[float, int, float]] = []
        self.plans = 0
        #: Plans left out because only jobs that cannot start had arrived.
        self.skipped = 0
        self.plan_wall = 0.0
        self.planner = IncrementalPlanner(policy) if config.incremental else None
        #: Each run's snapshot Job, kept until the engine changes the run (``snapshot_jobs``).
        self.views = SnapshotJobs(policy, config.report_throughput, config.incremental)
        self.fresh_attained = self.views.fresh_attained
        self.queue_only = self.views.queue_only
        self.fixed_key = self.views.fixed_key
        #: Whether any job's speed comes from a measured profile (its rate changes by epoch).
        self.profiled = any(j.profile is not None for j in self.jobs)
        #: Whether plans that provably change nothing are left out (``pruning.settled``); not
        #: where jobs measure a speed that changes by epoch: each plan shows it to the planner.
        self.settles = config.prune and not (self.profiled and config.report_throughput)
        #: Whether the last instant that asked for a plan was proven settled.
        self.settled = False
        #: Running jobs' Jobs rebuilt for attained time (``SnapshotJobs.rekeyed``) as of the
        #: last plan made.
        self.rekeyed_seen = 0
        self.least_attained = ranks_continuously(policy)
        #: Whether running jobs no plan could change are left out of the snapshot.
        self.leaves_out = (
            config.hide and self.settles and self.fixed_key is not None and applies(policy)
        )
        #: The active jobs kept as running and waiting (``running_and_waiting``), where
        #: ``showing.shown_from_sides`` serves.
        sides_serve = self.leaves_out and policy.admission is not Admission.HEAD_OF_LINE
        self.sides = RunningAndWaiting(policy.elastic) if sides_serve else None
        #: The active jobs' snapshot lists kept between plans, where a job's Job changes
        #: only where the engine drops it (``snapshot_lists``); else listed afresh (``collect``).
        plain_keys = self.fixed_key is not None and not self.fresh_attained
        self.lists = SnapshotLists(policy.elastic) if plain_keys and self.sides is None else None
        self.views.lists = self.lists
        #: Whether each snapshot shows every active job, the waiting ones that cannot start
        #: included (pruning then only decides whether a plan is left out): under an elastic
        #: policy which waiting jobs can start moves whenever a job starts or ends, and each
        #: job left out and shown again (33 of 288 a plan, first 20,000 Philly jobs, ``edl``)
        #: cost the kept ranking more than planning a job that cannot start. Same plans.
        self.shows_all = self.lists is not None and policy.elastic
        #: Whether a running job's cool-down and minimum run time fall due (``_next_wake``).
        self.grows = policy.grows
        #: When running jobs' cool-downs, ramp intervals and minimum run times end
        #: (``wakes``), pushed where ``_apply`` sets them.
        self.wakes = GrowthWakes(policy, config.report_throughput)
        #: When running jobs have run long enough for a waiting equal to take from them:
        #: read only while some job waits (``_next_wake``).
        after = policy.equals_yield_after_s
        self.yields = YieldWakes(after) if after is not None else None

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
                if self.sides is not None:
                    self.sides.arrive(self.active[job.name])
                if self.lists is not None:
                    self.lists.arrive(self.active[job.name])
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
        if self.sides is not None:
            self.sides.finish(run)
        if self.lists is not None:
            self.lists.finish(run)
        del self.active[run.job.name]
        self.records.append(run.record(now))

    # -- planning ---------------------------------------------------------------------------

    def _plan(self, now: float, arrived: list[str] | None = None) -> None:
        """Plan and apply. ``arrived``: the jobs that arrived since the last plan, when
        nothing else changed and no time-based rule fell due; if none of them can start,
        the plan is left out (the last plan's result is a fixed point, invariant 6)."""
        if self.profiled and self.config.report_throughput:
            self.views.remeasure(self.running.values(), now)
        settled_before, self.settled = self.settled, False
        if (
            settled_before
            and arrived is not None
            and arrivals_settled(
                self.running.values(),
                [self.active[name] for name in arrived],
                now,
                self.views.job,
                self.policy,
                self.cluster.gpus - self.allocated,
                queue_only=self.queue_only,
            )
        ):
            self.settled = True
            self.skipped += 1
            return
        # (A cached Job is taken where it holds: ``showing.collect``, ``running_and_waiting``,
        # ``snapshot_lists``.)
        free = self.cluster.gpus - self.allocated
        ask = self.settles and not self._holding(now)
        view = None
        if self.sides is not None:  # the three answers from the kept lists (``showing``)
            listed = self.sides.listing(now, self.views.job, self.queue_only, self.fresh_attained)
            view = shown_from_sides(
                *listed, self.policy, now, free, self.reservations, ask_settled=ask
            )
        if view is None:
            tallied = None
            if self.lists is not None:
                lists = self.lists.listing(now, self.views.job)
                tallied = self.lists.tally()
            else:
                got = collect(
                    self.active.values(),
                    now,
                    self.views.job,
                    queue_only=self.queue_only,
                    fresh=self.fresh_attained,
                    keyed=self.fixed_key is not None,
                )
                lists = got.jobs, got.live, got.keys
            view = shown_from_all(
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
            self.rekeyed_seen = self.views.rekeyed
            self.reservations = ()  # what the plan would return: no hold is left
            # Keys that change only at wake-ups: ``arrivals_settled`` may then be asked.
            self.settled = self.fixed_key is not None and not self.least_attained
            return
        # Not where a running job's rank may have moved (a LAS queue crossed at no wake-up).
        moved = self.views.rekeyed != self.rekeyed_seen
        if self.config.prune and arrived is not None and len(jobs) < len(self.active) and not moved:
            names = {j.name for j in jobs}
            if not any(name in names for name in arrived):
                self.skipped += 1
                return
        if self.shows_all and self.lists is not None:
            jobs, live, keys = self.lists.jobs, self.lists.live, self.lists.keys
        occupied = None
        if self.leaves_out and keys is not None:
            jobs, occupied = leave_out(
                jobs, live, keys, self.policy, self.node_of, self.node_used, best=view.best
            )
        snapshot = Snapshot(self.nodes, tuple(jobs), self.reservations)
        began = time.perf_counter()
        # (The collector paused meanwhile: ``collector.paused``.)
        planner = self.planner
        result: Plan = paused(
            lambda: (
                plan(snapshot, self.policy, now)
                if planner is None
                else planner.plan(snapshot, now, occupied)
            )
        )
        self.plan_wall += time.perf_counter() - began
        self.plans += 1
        self.rekeyed_seen = self.views.rekeyed
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
        self.views.drop(run)
        if self.sides is not None:
            self.sides.place(run, before, after)
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
        if after and self.yields is not None:
            self.yields.push(run)
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
        if policy.queue_thresholds_gpu_s:
            wake = min(wake, next_queue(self.running.values(), now, policy.queue_thresholds_gpu_s))
        if self.grows:
            wake = min(wake, self.wakes.next_after(now, self.running))
        if self.yields is not None and len(self.active) > len(self.running):
            wake = min(wake, self.yields.next_after(now, self.running))
        if self.profiled and self.config.report_throughput:
            wake = min(wake, next_epoch(self.running.values(), now))
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
