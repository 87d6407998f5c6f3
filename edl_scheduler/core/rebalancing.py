"""Rebalancing: move workers between running jobs to where they make more progress.

Admission gives every newcomer its gang and growth hands out idle GPUs, but neither ever
takes a GPU back from a job that uses it poorly to give it to one that would use it well:
once every GPU is allocated, sizes only change when jobs arrive or finish. Pollux (OSDI'21)
instead re-optimizes every job's allocation each round for a fairness-leaning mean of the
jobs' goodput speed-ups (the power mean with p = -1), charging a re-allocation penalty. This
step does the same, greedily, one worker at a time, within the planner's rules:

- The objective is the sum over jobs of ``-1 / speedup(nodes, workers)`` (maximizing it
  maximizes that power mean), from each job's fitted model (``throughput.job_model`` of what
  its runtime measured; the prior for sizes it never ran at). Where a runtime reports its
  statistical efficiency (``snapshot.Efficiency``, as the simulator does for the Pollux
  workloads), the model is of goodput, as in Pollux. Against the plain sum of speed-ups it
  values a worker more at a job that runs slowly than at one already fast: a GPU moves from
  a big job to a small one unless the big job loses much more by it, so short jobs are not
  starved by long ones that scale well (the sum gave every GPU to the best scaler). Speed-ups
  are over one worker (Pollux divides by the speed-up at a fair share instead).
- A move takes one worker from a donor and gives that very GPU (same node) to a recipient, so
  the cluster's allocation, and with it invariant 5, is unchanged. Its value over the
  policy's ``gain_horizon_s`` is (recipient's gain - donor's loss) x horizon, minus, for each
  of the two jobs not yet resized in this step, what its pause costs in the objective
  (``resize_pause_s / speedup``: the progress lost while it pauses, as a lower speed-up over
  the horizon). Only moves of positive value are made, best first.
- Re-allocation charge (as Pollux): a job's speed-up at a changed allocation counts only by
  ``stability.restart_factor``, ``(age - resizes x pause) / (age + pause)``, so a job moved
  often, or one that started moments ago, is moved only for a large gain; without it, every
  arrival and epoch change after a cool-down produced moves that paid one pause, and some
  jobs were resized hundreds of times.
- Stability (invariant 7, ``stability``): a donor must be allowed a voluntary shrink (its
  minimum run and cool-down are over); a recipient must be past its cool-down, or on its
  way up where the policy ramps (``may_ramp``: growth's exception, which gives it idle GPUs
  too), and its whole growth must pay its pause (``worth_the_pause``), the rule growth
  obeys.
- Priority (invariant 4): a donor never has a higher priority than its recipient. Jobs
  resized in this cycle already (started, grown, shrunk, restored), non-preemptible donors,
  jobs with parameter servers, and jobs below their minimum take no part.
- Trust (as Pollux): a recipient takes workers only up to twice the largest size it has
  measured, or its requested size where that is larger (``explored_limit``: the size its
  user asked for is taken on their word). Beyond that its speed-up is the prior's
  near-linear guess,
  which would win every comparison with a donor's measured curve and move GPUs from known
  use to hope; the limit doubles each time the job runs at a new largest size. Growth into
  idle GPUs is not limited: an idle GPU costs nothing to try.
- Remaining work (``remaining``): where jobs report the samples they have left, each job's
  term and pause count by a weight from its position in time left at one worker, so
  workers go first to the jobs nearest their end (heSRPT's shares). A job's gains, losses
  and kept bounds all scale by it (the moveless proof holds); with no reports, all are 1.
- Determinism: ties go to the lower rank; the loop ends after at most one move per GPU.

Every moved job says why: the recipient grew by so many workers taken from named jobs, the
donor was shrunk for a named job (``for_job``), with the predicted speed-ups.
"""

from __future__ import annotations

import heapq
from typing import Final

from edl_scheduler.core.margins import explored_limit, first_gain, first_loss
from edl_scheduler.core.plan import HOLD_REASONS, Reason
from edl_scheduler.core.policy import Growth
from edl_scheduler.core.remaining import reports, weights
from edl_scheduler.core.session import JobState, Session
from edl_scheduler.core.snapshot import Replica, Role
from edl_scheduler.core.stability import (
    cooling_until,
    may_ramp,
    may_shrink_voluntarily,
    restart_factor,
    worth_the_pause,
)
from edl_scheduler.core.throughput import ThroughputModel

_W: Final = Role.WORKER
_INF: Final = float("inf")
#: Donors tried for one recipient before it is given up (the cheapest first); bounds a
#: step to O(moves x log jobs) however many donors a priority rule or placement rules out.
_DONORS_TRIED: Final = 8
#: Whether the kept bounds (``margins``) spare work: a step they prove moveless is left
#: out (``Rebalancer.run``) and a giver is valued only when reached (``_best_move``). The
#: step's result is the same either way (tests turn it off to show that).
USE_KEPT_BOUNDS = True

__all__ = ["USE_KEPT_BOUNDS", "Rebalancer", "explored_limit"]


class _Member:
    """A job taking part: its model, and its size and node count when the step began."""

    __slots__ = (
        "above",
        "at",
        "below",
        "donor",
        "factor",
        "js",
        "limit",
        "model",
        "moved",
        "nodes0",
        "pause",
        "recipient",
        "sources",
        "version",
        "weight",
        "workers0",
    )

    def __init__(
        self, js: JobState, session: Session, donor: bool, recipient: bool, weight: float = 1.0
    ) -> None:
        self.js = js
        #: What the job's term counts for by its remaining work (``remaining.weights``).
        self.weight = weight
        kept = js.worth(session.policy)  # (not moved yet: its live size is its size)
        self.model: ThroughputModel = kept.model
        self.nodes0 = kept.nodes
        self.workers0 = kept.workers
        #: Speed-ups at ``workers0`` on ``nodes0``, one more and one fewer (kept, exact).
        self.at, self.above, self.below = kept.at, kept.above, kept.below
        #: ``resize_pause_s / at``: what one pause costs it (``Rebalancer._pause_cost``).
        self.pause = kept.pause
        #: Share of a changed allocation's speed-up that counts (``restart_factor``).
        self.factor = restart_factor(session, js)
        self.limit = kept.limit
        self.donor = donor
        self.recipient = recipient
        self.moved = False
        #: Donors of a recipient, in the order they gave.
        self.sources: list[str] = []
        self.version = 0

    def speedup(self, nodes: int, workers: int) -> float:
        if workers <= 0:
            return 0.0
        nodes = max(1, nodes)
        if nodes == self.nodes0:  # the sizes a step asks most, kept: the same floats
            step = workers - self.workers0
            if step == 0:
                return self.at
            if step == 1:
                return self.above
            if step == -1:
                return self.below
        return self.model.speedup(nodes, workers)

    def utility(self, nodes: int, workers: int) -> float:
        """What the job's speed-up is worth in the objective: ``-1 / speedup``."""
        nodes = max(1, nodes)
        up = self.speedup(nodes, workers)
        if workers != self.workers0 or nodes != self.nodes0:
            up *= self.factor  # a changed allocation: charged as Pollux charges restarts
        return -1.0 / up if up > 0 else float("-inf")


#: ``HOLD_REASONS`` by identity (enum members are singletons; hashing one runs Python code,
#: and this test runs for every running job at every plan).
_HELD: Final = frozenset(id(reason) for reason in HOLD_REASONS)


def _no_move_can_pay(
    takers: list[JobState],
    givers: list[JobState],
    session: Session,
    weights: dict[int, float],
) -> bool:
    """Whether the step provably makes no move. The step's recipients are ``takers``; its
    donors are the jobs of either list that may shrink now (above their minimum and one
    worker, preemptible, ``may_shrink_voluntarily``). A step makes its first move only for
    a recipient whose first gain is positive and exceeds some donor's first loss
    (``_best_move``: recipients come best first, donors cheapest first, and ``gain - loss
    <= 0`` ends a recipient's search), and without a first move there is none; priorities
    only narrow the pairs further. So the step is moveless when the best first gain is at
    most 0 or at most every donor's first loss.

    Those first values are computed here as the step would compute them (``first_gain``,
    ``first_loss``: the kept speed-ups of an unmoved member and this plan's restart factor,
    the same operations on the same floats), but only where the kept bounds (``margins``:
    ``best_gain`` never below the first gain, ``least_loss`` never above the first loss,
    at any ``now``) leave the answer open: a taker whose bound is no higher than the best
    gain found so far cannot raise it, and a donor whose loss bound is at least the best
    gain cannot be paid. A NaN value (a speed-up of 0 at a job's live size) proves
    nothing. Each job's values and bounds count by its weight (``remaining``), as the
    step counts them; a positive weight keeps a bound a bound."""
    horizon = session.policy.gain_horizon_s
    best_gain = -_INF
    for js in takers:
        kept = js.margins or js.worth(session.policy)
        w = weights.get(js.rank, 1.0)
        if w * kept.best_gain <= best_gain:
            continue
        gain = w * first_gain(kept, restart_factor(session, js), horizon)
        if gain != gain:
            return False
        if gain > best_gain:
            best_gain = gain
    if best_gain <= 0:
        return True
    for group in (takers, givers):
        for js in group:
            # (``least_loss`` is infinite at one worker or at the job's minimum)
            kept = js.margins or js.worth(session.policy)
            w = weights.get(js.rank, 1.0)
            if w * kept.least_loss >= best_gain or not js.job.preemptible:
                continue
            if not may_shrink_voluntarily(session, js):
                continue
            loss = w * first_loss(kept, restart_factor(session, js), horizon)
            if not best_gain - loss <= 0:  # as the step compares them (NaN: not proven)
                return False
    return True


class Rebalancer:
    """One rebalancing step over a session (after admission and growth)."""

    def __init__(self, session: Session, pool: list[JobState] | None = None) -> None:
        """``pool``: the jobs that may be eligible, in rank order (``growing.Grower``'s
        candidate scan gathers them); every job of the session when not given."""
        self.s = session
        self.pool = pool
        self.moves = 0
        #: (loss, rank, version, member), cheapest first; a giver not valued yet stands in
        #: as (its kept loss bound, rank, 0, its JobState) until it is reached (``_best_move``).
        self.donors: list[tuple[float, int, int, _Member | JobState]] = []
        self.recipients: list[tuple[float, int, int, _Member]] = []
        #: Each step job's weight by its remaining work, by rank (empty: all count 1).
        self.weights: dict[int, float] = {}

    def run(self) -> int:
        """Make every move of positive value, best first; returns how many were made."""
        s = self.s
        if not s.policy.elastic or s.policy.growth is not Growth.MARGINAL_GAIN:
            return 0
        if s.policy.gain_horizon_s <= 0:
            return 0
        takers, givers = self.split(s.jobs if self.pool is None else self.pool)
        if not takers:
            return 0
        self.weights = self.weigh(takers + givers)
        if USE_KEPT_BOUNDS and _no_move_can_pay(takers, givers, s, self.weights):
            return 0
        members = {js.rank: self._member(js, False, True) for js in takers}
        self.recipients = [(-self._gain(m), m.js.rank, 0, m) for m in members.values()]
        if min(entry[0] for entry in self.recipients) >= 0:
            return 0  # no job that more workers would pay for: no move can be made
        for js in takers:
            if js.size() > max(1, js.lo) and js.job.preemptible:
                members[js.rank].donor = may_shrink_voluntarily(s, js)
        for js in givers:
            if not may_shrink_voluntarily(s, js):
                continue
            if USE_KEPT_BOUNDS:
                least = (js.margins or js.worth(s.policy)).least_loss
                self.donors.append((self.weights.get(js.rank, 1.0) * least, js.rank, 0, js))
            else:
                members[js.rank] = self._member(js, True, False)
        self.donors += [(self._loss(m), m.js.rank, 0, m) for m in members.values() if m.donor]
        if not self.donors:
            return 0
        heapq.heapify(self.donors)
        heapq.heapify(self.recipients)
        for _ in range(s.cluster.capacity_gpu):
            if not self._best_move():
                break
        return self.moves

    def weigh(self, step: list[JobState]) -> dict[int, float]:
        """Every running job's weight by its remaining work (``remaining.weights``), by
        rank, where one of the step's jobs reports what it has left; else none."""
        if not reports(step):
            return {}
        return weights([(js.rank, js.job) for js in self.s.jobs if js.size() > 0])

    def split(self, jobs: list[JobState]) -> tuple[list[JobState], list[JobState]]:
        """The step's takers (eligible, past their cool-down or on their way up, below their
        explored limit) and givers (the other eligible jobs past their cool-down, above one
        worker and their minimum, and preemptible) among ``jobs``, in their order. Decided
        before any model is fitted: a job at its maximum gains nothing from a worker, one
        at its minimum (or one worker) has none to give, and one cooling down may not
        shrink voluntarily (``may_shrink_voluntarily``) nor grow unless on its way up, so
        leaving them out changes no move, only the step's cost. (Takers are tested as
        donors in ``run``, once needed.)"""
        s, held = self.s, _HELD
        ramps = s.policy.ramp_s is not None
        takers: list[JobState] = []
        givers: list[JobState] = []
        for js in jobs:  # (growth's pool: a few dozen jobs a plan)
            workers = js.workers
            if not workers or workers < js.lo:
                continue
            job = js.job
            if js.suspended or js.started or job.suspended or job.pserver is not None:
                continue
            if js.for_job is not None or js.added_w or js.removed_w:
                continue  # resized in this cycle already
            if id(js.reason) in held or job.worker.resources.gpu <= 0:
                continue
            kept = js.margins
            limit = kept.limit if kept is not None else js.explored_limit()
            if cooling_until(s, js) is not None:
                # A job on its way up may take workers before its cool-down ends, as growth
                # gives it idle ones (``may_ramp``); it gives none then.
                if ramps and workers < limit and may_ramp(s, js):
                    takers.append(js)
                continue
            if workers < limit:
                takers.append(js)
            elif workers > max(1, js.lo) and job.preemptible:
                givers.append(js)
        return takers, givers

    # -- values -------------------------------------------------------------------------------

    def _member(self, js: JobState, donor: bool, recipient: bool) -> _Member:
        return _Member(js, self.s, donor, recipient, self.weights.get(js.rank, 1.0))

    def _pause_cost(self, m: _Member) -> float:
        """What one pause costs ``m`` in the objective, horizon-weighted (0 once it moved:
        the step's moves of one job make one resize). A pause of ``t`` seconds loses the
        progress of ``t`` seconds at speed-up ``s``: as a lower speed-up over the horizon it
        is worth ``t * s * d(-1/s)/ds = t / s``. Before the member's weight."""
        return 0.0 if m.moved else m.pause  # (kept: ``margins``)

    def _nodes(self, m: _Member) -> int:
        """``m``'s node count now (at least 1): ``nodes0`` until it is moved."""
        js = m.js
        if not js.added_w and not js.removed_w:
            return m.nodes0
        return max(1, js.node_count(self.s.cluster))

    def _gain(self, m: _Member) -> float:
        """Value of one more worker for ``m`` (on its current nodes), horizon-weighted."""
        js = m.js
        if js.size() >= m.limit:
            return float("-inf")
        nodes = self._nodes(m)
        up = m.utility(nodes, js.size() + 1) - m.utility(nodes, js.size())
        return m.weight * (up * self.s.policy.gain_horizon_s - self._pause_cost(m))

    def _loss(self, m: _Member) -> float:
        """Cost of one worker fewer for ``m``, horizon-weighted."""
        js = m.js
        if js.size() <= max(1, js.lo):
            return float("inf")
        nodes = self._nodes(m)
        down = m.utility(nodes, js.size()) - m.utility(nodes, js.size() - 1)
        return m.weight * (down * self.s.policy.gain_horizon_s + self._pause_cost(m))

    # -- moves --------------------------------------------------------------------------------

    def _best_move(self) -> bool:
        """The best recipient that some donor pays for takes one worker from the cheapest
        such donor. Recipients that find none are dropped for the rest of the step: what
        they could gain changes only when they move. Heap entries carry the member's
        version, so entries made stale by a move are skipped.

        A giver that takes no part as a recipient enters the donors' heap under its kept
        loss bound (``margins``: never above its loss) and is valued only when it comes to
        the top, which is then replaced by its real entry. That changes no choice: an entry
        on top is below every other entry's bound, so below its real loss as well, and a
        bound that no gain pays ends the search as the real loss would (the loss is
        higher). Most donors of a step are never reached."""
        while self.recipients:
            neg_gain, _, version, r = heapq.heappop(self.recipients)
            if version != r.version:
                continue
            if -neg_gain <= 0:
                return False  # no recipient left that more GPUs would pay for
            tried: list[tuple[float, int, int, _Member | JobState]] = []
            moved = False
            while self.donors and len(tried) < _DONORS_TRIED:
                entry = heapq.heappop(self.donors)
                loss, rank, d_version, d = entry
                if isinstance(d, JobState):  # a giver under its bound: valued now
                    if -neg_gain - loss <= 0:
                        heapq.heappush(self.donors, entry)
                        break  # its loss is no lower: none that pays follows
                    m = self._member(d, True, False)
                    heapq.heappush(self.donors, (self._loss(m), rank, 0, m))
                    continue
                if d_version != d.version:
                    continue
                if -neg_gain - loss <= 0:
                    heapq.heappush(self.donors, entry)
                    break  # donors come cheapest first: none that pays follows
                tried.append(entry)
                if d is r or d.js.priority > r.js.priority or d.sources or r.js.for_job:
                    continue  # a job either gives or takes in one step, never both
                if self._move(d, r):
                    tried.pop()
                    self._requeue(d)
                    self._requeue(r)
                    moved = True
                    break
            for entry in tried:
                heapq.heappush(self.donors, entry)
            if moved:
                return True
        return False

    def _requeue(self, m: _Member) -> None:
        """New heap entries for a member that just gave or took a worker."""
        m.version += 1
        if m.donor and not m.sources:
            heapq.heappush(self.donors, (self._loss(m), m.js.rank, m.version, m))
        if m.recipient and m.js.for_job is None:
            heapq.heappush(self.recipients, (-self._gain(m), m.js.rank, m.version, m))

    def _move(self, d: _Member, r: _Member) -> bool:
        """Give one of ``d``'s workers' GPUs to ``r``, if the move keeps its value once the
        real node counts are known and ``r``'s whole growth still pays for its pause."""
        s, cluster = self.s, self.s.cluster
        res = r.js.resources(_W)
        if d.js.resources(_W) != res:
            return False  # a worker of another shape: not a one-for-one swap
        before = self._total(d) + self._total(r)
        for replica in self._replicas_to_give(d, r):
            node = cluster.index[replica.node]
            if cluster.node_class[node] not in r.js.classes:
                continue
            stmt = s.statement()
            stmt.remove(d.js, replica)
            if cluster.room(node, res, r.js.name, r.js.rank) < 1:
                stmt.discard()
                continue
            stmt.add(r.js, _W, node)
            after = self._total(d) + self._total(r)
            value = (after - before) * s.policy.gain_horizon_s
            value -= d.weight * self._pause_cost(d) + r.weight * self._pause_cost(r)
            if value <= 0 or not self._pays(r):
                stmt.discard()
                continue
            stmt.commit()
            self._record(d, r)
            return True
        return False

    def _replicas_to_give(self, d: _Member, r: _Member) -> list[Replica]:
        """``d``'s live workers, best candidates first: on a node ``r`` already uses (it
        stays compact), then on the node where ``d`` has fewest workers (it may leave that
        node), newest first; one per node (the others on that node are equivalent)."""
        cluster = self.s.cluster
        gone = {id(x) for x in d.js.removed[_W]}
        mine = [x for x in d.js.live[_W] if id(x) not in gone]
        r_nodes = set(r.js.nodes(_W, cluster))
        per_node: dict[str, int] = {}
        for x in mine:
            per_node[x.node] = per_node.get(x.node, 0) + 1
        seen: set[str] = set()
        out: list[Replica] = []
        order = sorted(
            range(len(mine)),
            key=lambda i: (
                cluster.index[mine[i].node] not in r_nodes,
                per_node[mine[i].node],
                -i,
            ),
        )
        for i in order:
            if mine[i].node not in seen:
                seen.add(mine[i].node)
                out.append(mine[i])
        return out

    def _total(self, m: _Member) -> float:
        return m.weight * m.utility(m.js.node_count(self.s.cluster), m.js.size())

    def _pays(self, r: _Member) -> bool:
        """The recipient's whole growth in this step pays for its pause (``stability``)."""
        before = r.model.throughput(r.nodes0, r.workers0)
        after = r.model.throughput(max(1, r.js.node_count(self.s.cluster)), r.js.size())
        gain = r.factor * after / before - 1.0 if before > 0 else float("inf")
        return worth_the_pause(self.s, gain)

    def _record(self, d: _Member, r: _Member) -> None:
        self.moves += 1
        d.moved = r.moved = True
        cluster = self.s.cluster
        nodes_d = d.js.node_count(cluster)
        nodes_r = r.js.node_count(cluster)
        d.js.reason = Reason.REBALANCED
        d.js.for_job = r.js.name
        d.js.message = (
            f"shrunk {d.workers0}->{d.js.size()}: its GPUs go to {r.js.name}, where they add "
            f"more (predicted speed-up {d.speedup(d.nodes0, d.workers0):.2f}x -> "
            f"{d.speedup(nodes_d, d.js.size()):.2f}x here)"
        )
        if d.js.name not in r.sources:
            r.sources.append(d.js.name)
        r.js.reason = Reason.GREW
        r.js.message = (
            f"grew {r.workers0}->{r.js.size()} with GPUs from {', '.join(r.sources)} "
            f"(predicted speed-up {r.speedup(r.nodes0, r.workers0):.2f}x -> "
            f"{r.speedup(nodes_r, r.js.size()):.2f}x)"
        )
