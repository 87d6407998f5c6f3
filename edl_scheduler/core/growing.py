"""Growth: share idle GPUs among running jobs below their maximum (invariant 5).

Jobs are served by priority level first; inside a level the policy chooses by marginal
throughput gain (the job's fitted model, or the prior where it measured nothing; ties go to
the least fulfilled) or by fulfillment alone. One worker is handed out at a time and the
winner is scored again, so GPUs spread the way the scaling curves say they pay.

Where the policy grows on evidence (``Policy.ramp_s``), no job grows past its requested size
or twice the largest size it measured, whichever is larger, and a job on its way up may grow
again before its cool-down ends (``stability.may_ramp``).

A job may be held back, and its decision says why (``plan.HOLD_REASONS``): its cool-down,
a gain over the horizon smaller than the resize pause (``stability``), the policy's load
threshold, or, for a job that cannot be preempted, a higher-ranked job still waiting (GPUs
it took could not be given back). A grown job's whole increment is checked against the
pause once; a job that fails is reverted and its GPUs offered to the others. Admission in
a later round may take back part of a growth that was made final (``settle``); what is
left of it is then checked again, from the workers admission left the job, and reverted
the same way where it no longer pays (``_recheck_cut_growth``).

After the first round's growth, policies that grow by marginal gain also rebalance
(``rebalancing``): workers move from running jobs that use them poorly to running jobs that
would use them better, when the gain pays for both pauses.
"""

from __future__ import annotations

import heapq
from typing import Final

from edl_scheduler.core.placing import place
from edl_scheduler.core.plan import HOLD_REASONS, Reason, counted
from edl_scheduler.core.policy import Growth
from edl_scheduler.core.rebalancing import Rebalancer
from edl_scheduler.core.session import JobState, Session, Statement
from edl_scheduler.core.snapshot import Job, Role
from edl_scheduler.core.stability import (
    cooldown_end,
    cooling_until,
    may_ramp,
    resize_gain,
    worth_the_pause,
)

#: Reasons of a job that is waiting to start or to be restored to its minimum.
WAITING: Final = frozenset(
    {Reason.WAITING_FOR_CAPACITY, Reason.WAITING_IN_LINE, Reason.BELOW_MINIMUM}
)


def _measured(job: Job) -> bool:
    """Whether ``job``'s runtime measured a throughput at some size."""
    return any(t.samples_per_second > 0 for t in job.throughput)


def _has_evidence(js: JobState) -> bool:
    """Whether growth on evidence has anything to bound ``js`` by: a requested size or a
    measured throughput."""
    return js.job.requested is not None or _measured(js.job)


def _score(js: JobState, session: Session) -> tuple[float, ...]:
    fulfilled = js.fulfillment()
    if session.policy.growth is Growth.FULFILLMENT:
        return (-js.priority, fulfilled, js.rank)
    kept = js.margins
    if kept is None:
        kept = js.worth(session.policy)
    if not js.added_w and not js.removed_w:  # as it was: its kept speed-ups (``margins``)
        return (-js.priority, kept.growth_score, fulfilled, js.rank)
    model = kept.model
    nodes, workers = max(1, js.node_count(session.cluster)), js.size()
    gain = model.speedup(nodes, workers + 1) - model.speedup(nodes, workers)
    return (-js.priority, -round(gain, 9), fulfilled, js.rank)


def _scored(
    jobs: list[JobState], session: Session
) -> list[tuple[tuple[float, ...], int, JobState]]:
    """``(_score(js, session), i, js)`` for each of ``jobs`` (growth's heap before it is
    ordered). Asked of every candidate at every plan with idle GPUs, so an unmoved job with
    kept margins under the marginal-gain rule gets ``_score``'s tuple written out: the same
    values, ``fulfillment`` included."""
    if session.policy.growth is Growth.FULFILLMENT:
        return [(_score(js, session), i, js) for i, js in enumerate(jobs)]
    out: list[tuple[tuple[float, ...], int, JobState]] = []
    for i, js in enumerate(jobs):
        kept = js.margins
        if kept is None or js.added_w or js.removed_w:
            out.append((_score(js, session), i, js))
            continue
        span = js.hi - js.lo
        fulfilled = 1.0 if span <= 0 else (js.workers - js.lo) / span
        out.append(((-js.priority, kept.growth_score, fulfilled, js.rank), i, js))
    return out


def cooling_message(until: float, now: float) -> str:
    return f"below maximum, cooling down for {until - now:.0f}s more (until t={until:.0f})"


class Grower:
    def __init__(self, session: Session) -> None:
        self.s = session
        self.statements: dict[str, Statement] = {}
        self.start: dict[str, tuple[int, int]] = {}
        self.rebalanced = False
        #: The jobs rebalancing may find eligible, in rank order (``candidates``).
        self.pool: list[JobState] = []
        #: Each job whose growth an earlier round made final, with its size and node count
        #: then (``settle``): admission may take part of that growth back before the next
        #: round (``_recheck_cut_growth``).
        self.settled: dict[str, tuple[JobState, int, int]] = {}
        #: The job states that grew in this round, by name (``start``'s keys).
        self.grown: dict[str, JobState] = {}

    def candidates(self) -> list[JobState]:
        """The running jobs that may grow now, in rank order; holds the others for their
        cool-down or for a higher-ranked waiting job.

        On the way it gathers ``pool``: these jobs and the running ones at their maximum
        past their cool-down (not suspended), in rank order, which is every job that
        rebalancing can find eligible after this round's growth and past its cool-down
        (``rebalancing.Rebalancer.split``), so that its step visits those alone. Each job
        left out here stays out until then: it runs no worker or fewer than its minimum
        (growth changes only the sizes of the jobs returned here, parameter servers aside,
        and a job with servers never takes part), it is suspended, it retreated in this
        cycle (``retreating``; rebalancing leaves out a job resized in the cycle), it cools
        down (a time that this plan does not change), or it gets a hold reason here (a
        higher-ranked waiting job), which nothing before rebalancing takes back."""
        s = self.s
        cooldown, now = s.policy.cooldown_s, s.now
        ramps = s.policy.ramp_s is not None
        # The highest-ranked waiting job, found on the way: jobs come in rank order, and a
        # job's reason is read before this loop changes it, so this is the rank the whole
        # list would give wherever it is compared with a lower-ranked job's.
        first_waiting: int | None = None
        found = []
        pool = self.pool = []
        for js in s.jobs:
            if first_waiting is None and js.reason in WAITING:
                first_waiting = js.rank
            workers = js.workers  # (``size()``, read once: this loop sees every job)
            if not workers or workers < js.lo:
                continue
            job = js.job
            if js.suspended or job.suspended or js.reason is Reason.RETREATED:
                continue  # (a retreated job gave its GPUs back for the others)
            # When its cool-down ends, if it has not ended (``cooling_until``).
            live = js.live_w
            until = None
            if live:
                end = cooldown_end(job.last_resize_time, job.start_time, cooldown)
                if end is not None and end > now:
                    until = end
            if workers >= js.hi:
                if until is None:
                    pool.append(js)  # at its maximum: it may give in rebalancing
                continue
            # A job started, or shrunk to admit another, this cycle is being resized now:
            # its cool-down starts after this cycle, and it may take leftover idle GPUs.
            if until is not None and ((js.started and not live) or js.removed_w):
                until = None  # (``newly_started``, or shrunk)
            if until is not None and ramps and may_ramp(s, js):
                until = None  # on its way up, on evidence
            if until is not None:
                if js.reason is Reason.COOLING_DOWN:
                    pass  # held so in an earlier round (``hold`` would return at once)
                elif not js.started and js.for_job is None:
                    # Unmoved so far: the message would replace its own. It is written where
                    # the plan returns the job's decision (``cooling_message``): whatever
                    # changes a held job's size later writes its message, and most cooling
                    # jobs' decisions change nothing.
                    js.reason, js.message, js.cooling_end = Reason.COOLING_DOWN, "", until
                else:
                    js.hold(Reason.COOLING_DOWN, cooling_message(until, now))
                continue
            if not job.preemptible and first_waiting is not None and first_waiting < js.rank:
                js.hold(Reason.HELD_FOR_WAITING, "below maximum, held: a higher-ranked job waits")
                continue
            found.append(js)
            pool.append(js)
        return found

    def _hand_out(self, jobs: list[JobState]) -> None:
        """Serve priority levels in order (``jobs`` is in rank order); once no GPU is
        left, lower levels are not even scored."""
        level: list[JobState] = []
        for js in jobs:
            if level and js.priority != level[0].priority:
                self._hand_out_level(level)
                level = []
            level.append(js)
        if level:
            self._hand_out_level(level)

    def _hand_out_level(self, jobs: list[JobState]) -> None:
        s, policy = self.s, self.s.policy
        if s.cluster.free_gpu <= 0 and all(js.job.worker.resources.gpu for js in jobs):
            return
        heap = _scored(jobs, s)
        heapq.heapify(heap)
        limit = policy.max_load * s.cluster.capacity_gpu
        all_gpu: bool | None = None  # whether every job's worker takes a GPU (asked once)
        while heap:
            if s.cluster.free_gpu <= 0:
                if all_gpu is None:
                    all_gpu = all(js.job.worker.resources.gpu for js in jobs)
                if all_gpu:
                    break  # no GPU is left, and none comes back here: the rest pass
            _, i, js = heapq.heappop(heap)
            if js.size() >= self._limit(js):
                continue
            gpu = js.resources(Role.WORKER).gpu
            if gpu and s.cluster.free_in(js.classes) < gpu:
                continue  # no GPU free anywhere it may run
            if policy.max_load < 1.0 and gpu and s.allocated_gpus() + gpu > limit + 1e-9:
                js.hold(
                    Reason.LOAD_THRESHOLD,
                    f"below maximum, held: cluster load at {policy.max_load:.0%}",
                )
                continue
            if js.name not in self.start:
                self.start[js.name] = (js.node_count(s.cluster), js.size())
                self.grown[js.name] = js
            stmt = self.statements.setdefault(js.name, s.statement())
            if not place(s, stmt, js, Role.WORKER, 1):
                continue
            if js.size() < self._limit(js):
                heapq.heappush(heap, (_score(js, s), i, js))

    def _limit(self, js: JobState) -> int:
        """The most workers growth gives ``js``: its maximum, or, where the policy grows on
        evidence, its requested size or twice the largest size it measured
        (``explored_limit``). A job that gives neither (no requested size, no throughput
        reported: a runtime that does not measure) is bounded by its maximum alone, as
        without growth on evidence: nothing would ever raise its limit above its minimum."""
        if self.s.policy.ramp_s is None or not _has_evidence(js):
            return js.hi
        return js.explored_limit()

    def settle(self) -> None:
        """Make this round's growth final, so that admission may take part of it back (a
        later round judges only its own growth against the pause)."""
        for stmt in self.statements.values():
            stmt.commit()
        cluster = self.s.cluster
        for name in self.start:
            js = self.grown[name]
            self.settled[name] = (js, js.size(), js.node_count(cluster))
        self.statements.clear()
        self.start.clear()
        self.grown.clear()

    def _recheck_cut_growth(self) -> list[JobState]:
        """Jobs whose growth made final in an earlier round admission has since cut (taken
        back workers it added, or live workers the growth had lifted above the minimum):
        the growth they keep must still pay for its pause, measured from the workers
        admission left them (``stability.resize_gain``), as ``_revert_if_unpaid`` measures
        a round's growth. One that no longer pays gives back every worker growth added (what
        admission left it is at least its minimum) and is held; returns those. Without
        this a job could end the cycle grown across more nodes and slower than it ran (its
        growth judged whole, then cut)."""
        s = self.s
        cluster = s.cluster
        reverted = []
        for name, (js, size, nodes) in list(self.settled.items()):
            now_size, now_nodes = js.size(), js.node_count(cluster)
            if (now_size, now_nodes) == (size, nodes):
                continue  # untouched since its growth was judged
            self.settled[name] = (js, now_size, now_nodes)
            if not js.added_w or js.newly_started:
                continue
            removed = js.removed_w
            kept = [r for r in js.live_w if r not in removed] if removed else js.live_w
            if len(kept) < js.lo:
                continue  # what growth added is what keeps it at its minimum
            base = (len({r.node for r in kept}), len(kept))
            gain = resize_gain(js, (base[0], now_nodes), (base[1], now_size))
            if worth_the_pause(s, gain):
                continue
            stmt = s.statement()
            for node in reversed(list(js.added_w)):
                stmt.cancel(js, Role.WORKER, node)
            ps = js.job.pserver
            if ps is not None:
                added = js.added[Role.PSERVER]
                while added and js.size(Role.PSERVER) > _servers_wanted(js):
                    stmt.cancel(js, Role.PSERVER, added[-1])
            stmt.commit()
            self.settled[name] = (js, js.size(), js.node_count(cluster))
            if not removed and js.for_job is not None:
                # Admission took only workers growth had added: the job keeps what it ran
                # with, so it was not shrunk for anyone.
                js.for_job, js.reason, js.message = None, None, ""
            pause = s.policy.resize_pause_s
            js.hold(
                Reason.GAIN_BELOW_PAUSE,
                f"below maximum, held: predicted gain {gain:.1%} over "
                f"{s.policy.gain_horizon_s:g}s of what admission left of its growth does "
                f"not pay the {pause:g}s pause",
            )
            reverted.append(js)
        return reverted

    def run(self) -> None:
        """Hand out idle GPUs; may be called again after admission changed the picture."""
        s = self.s
        if not s.policy.grows:
            return
        cut = self._recheck_cut_growth() if self.settled else []
        jobs = self.candidates()
        if cut:
            jobs = [js for js in jobs if js not in cut]
        while True:
            self._hand_out(jobs)
            # (only a job that grew in this round can be reverted: no call for the others)
            grew = self.start
            reverted = [js for js in jobs if js.job.name in grew and self._revert_if_unpaid(js)]
            if not reverted:
                break
            jobs = [js for js in jobs if js not in reverted]
        ramps = s.policy.ramp_s is not None
        for js in jobs:
            if js.job.pserver is not None:
                self._grow_pservers(js)
            if ramps:
                self._say_if_unmeasured(js)
            if s.cluster.holds:  # (with no hold there is nothing to say)
                self._say_if_held(js)
        self._servers_to_their_rule()
        if not self.rebalanced:  # once per cycle, after the first round's growth
            self.rebalanced = True
            Rebalancer(s, self.pool).run()

    def _say_if_unmeasured(self, js: JobState) -> None:
        """A job that growth on evidence stopped at its limit (its requested size, or twice
        the largest size it measured), while a GPU it could use is idle, says so: invariant 5
        allows only stated holds."""
        size = js.size()
        if size >= js.hi or js.reason in HOLD_REASONS:
            return
        limit = self._limit(js)
        if size < limit:
            return
        gpu = js.resources(Role.WORKER).gpu
        if gpu and self.s.cluster.free_in(js.classes) < gpu:
            return  # no room anyway
        before = len(js.live_w)
        grew = f"grew {before}->{size} into idle GPUs; " if before and size > before else ""
        # (one with neither a requested size nor a measurement is limited by its maximum)
        job = js.job
        doubled = _measured(job) and (job.requested is None or limit > job.requested)
        bound = "twice the largest size it measured" if doubled else "its requested size"
        js.hold(
            Reason.AWAITING_MEASUREMENT,
            f"{grew}below maximum, held at {counted(limit, 'worker')} ({bound}) until its runtime "
            "measures the size it runs at",
        )

    def _say_if_held(self, js: JobState) -> None:
        """A job left below its maximum although a node it may use has room, because that
        room is held for a higher-ranked job, says so: invariant 5 allows only stated holds."""
        if js.size() >= js.hi or js.reason in HOLD_REASONS:
            return
        cluster, res = self.s.cluster, js.resources(Role.WORKER)
        for node, holds in cluster.holds.items():
            if cluster.node_class[node] not in js.classes:
                continue
            if cluster.room(node, res, js.name, js.rank) == 0 and cluster.room(node, res, "", -1):
                holders = sorted({h.job for h in holds if h.rank < js.rank and h.count > 0})
                js.hold(
                    Reason.HELD_FOR_WAITING,
                    f"below maximum, held: room on {cluster.names[node]} is reserved for "
                    f"{', '.join(holders)}, ranked above",
                )
                return

    def _revert_if_unpaid(self, js: JobState) -> bool:
        """Undo a running job's growth whose gain does not pay for its pause."""
        if js.name not in self.start or js.newly_started:
            return False
        nodes0, workers0 = self.start[js.name]
        if js.size() == workers0:
            return False
        gain = resize_gain(js, (nodes0, js.node_count(self.s.cluster)), (workers0, js.size()))
        if worth_the_pause(self.s, gain):
            return False
        self.statements.pop(js.name).discard()
        del self.start[js.name]
        del self.grown[js.name]
        pause = self.s.policy.resize_pause_s
        js.hold(
            Reason.GAIN_BELOW_PAUSE,
            f"below maximum, held: predicted gain {gain:.1%} over "
            f"{self.s.policy.gain_horizon_s:g}s does not pay the {pause:g}s pause",
        )
        return True

    def _grow_pservers(self, js: JobState) -> None:
        """Parameter servers follow the workers: ceil(workers * psMax / workerMax)."""
        ps = js.job.pserver
        if ps is None or js.name not in self.statements:
            return
        stmt = self.statements[js.name]
        for _ in range(max(0, _servers_wanted(js) - js.size(Role.PSERVER))):
            if not place(self.s, stmt, js, Role.PSERVER, 1):
                break

    def _servers_to_their_rule(self) -> None:
        """A job whose workers did not grow (at its maximum, say) still gets the servers
        its rule gives, when it may be resized now: started this cycle, or past its
        cool-down."""
        for js in self.s.jobs:
            if js.job.pserver is None or js.name in self.statements or js.job.suspended:
                continue
            if js.suspended or js.size() < js.lo or js.size(Role.PSERVER) >= _servers_wanted(js):
                continue
            if not js.newly_started and cooling_until(self.s, js) is not None:
                continue
            stmt = self.s.statement()
            self.statements[js.name] = stmt
            before = js.size(Role.PSERVER)
            self._grow_pservers(js)
            if js.size(Role.PSERVER) == before:
                stmt.discard()
                del self.statements[js.name]


def _servers_wanted(js: JobState) -> int:
    """ceil(workers * psMax / workerMax), within the servers' minimum and maximum."""
    ps = js.job.pserver
    assert ps is not None
    want = -(-js.size() * ps.max_replicas // max(1, js.job.worker.max_replicas))
    return max(ps.min_replicas, min(ps.max_replicas, want))
