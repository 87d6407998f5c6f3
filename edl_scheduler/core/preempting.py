"""Preemption: which workers, or whole jobs, are taken so that a waiting job starts.

Invariant 4 (priority first) lives here: a waiting job may take every worker above the
minimum of each preemptible job of lower priority, regardless of cool-downs, and of each
equal ranked below it where the policy shrinks equals (``may_shrink``), and whole lower
jobs where the policy suspends (``may_suspend``). Victims are offered one replica (or one
whole job) at a time (``victims``), node by node (first the nodes that could hold most of
the gang, preferring those whose victims have the lowest priority), and on each node lowest
priority first, then the most fulfilled; workers that growth added earlier in this cycle go
back first (they are then simply not added). Whole jobs come after the workers, and after
them the workers left on nodes that a suspension made useful. Admission takes them in that
order until the gang fits, and gives back those it turns out not to need
(``admitting.Admitter``).

Proofs outside this module rest on these rules: which running jobs no plan can change
(``incremental.unchangeable``, ``tests/core/test_unchangeable.py``) and the simulator's
shortcuts (``simulations/pruning.py``: waiting jobs that cannot start, plans that change
nothing; ``tests/simulations/test_pruning.py``, ``test_settled.py``). A change here that
breaks them fails there.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterator
from typing import Final

from edl_scheduler.core.policy import EqualShrinking
from edl_scheduler.core.session import JobState, Session, Statement
from edl_scheduler.core.snapshot import Replica, Role
from edl_scheduler.core.stability import has_run_minimum, may_shrink_voluntarily

_W: Final = Role.WORKER


class Victim:
    """What is taken from one job: live replicas, or one worker that growth added to it
    this cycle on ``withdrawn`` (node index), which is then simply not added. (A plain
    class: compiled, its ``__init__`` is C, where a dataclass's is Python code.)"""

    __slots__ = ("js", "replicas", "whole", "withdrawn")

    def __init__(
        self,
        js: JobState,
        replicas: tuple[Replica, ...],
        whole: bool,
        withdrawn: int | None = None,
    ) -> None:
        self.js = js
        self.replicas = replicas
        self.whole = whole
        self.withdrawn = withdrawn


def may_shrink(session: Session, js: JobState, victim: JobState) -> bool:
    """May ``victim`` lose workers above its minimum so that ``js`` starts? Rule 4 says yes
    for every preemptible job of lower priority; one of ``js``'s own priority ranked below
    it as the policy says (``shrink_equal_priority``), and one ranked above it past its
    cool-down where the policy lets equals reclaim their borrowed workers."""
    # A job started this cycle may still be one: growth may have given it workers above
    # its minimum in this very cycle, and those are as reclaimable as any.
    if victim is js or not victim.job.preemptible:
        return False
    policy = session.policy
    if victim.rank > js.rank:
        return victim.priority < js.priority or equal_may_shrink(session, victim)
    return (
        policy.reclaims
        and victim.priority == js.priority
        and may_shrink_voluntarily(session, victim)
    )


def equal_may_shrink(session: Session, victim: JobState) -> bool:
    """May ``victim`` be shrunk for a job of its own priority ranked above it? (Its surplus
    is counted for the admission's quick reject by the same rule: ``Admitter``.)"""
    rule = session.policy.shrink_equal_priority
    if rule is EqualShrinking.ANY:
        return True
    if rule is EqualShrinking.NEVER:
        return False
    min_run = session.policy.suspension_min_run_s
    return has_run_minimum(victim.job.start_time, session.now, min_run)


def may_suspend(session: Session, js: JobState, victim: JobState) -> bool:
    """May ``victim`` be suspended whole so that ``js`` starts? Where the policy suspends:
    a preemptible running job not started this cycle, of lower priority (invariant 4), or
    of ``js``'s own (every job, without priorities; with them, under ``suspend_equal_priority``)
    ranked below it and past ``Policy.suspension_min_run_s`` (no rule demands that one: it
    is the policy's choice, and the minimum run, which pays for the suspension's cost,
    keeps it from thrashing)."""
    if victim is js or not victim.job.preemptible or victim.started or not victim.running:
        return False
    if victim.priority < js.priority:
        return True
    policy = session.policy
    if victim.priority > js.priority or not policy.suspends_by_rank:
        return False
    if victim.rank < js.rank:
        return False
    min_run = policy.suspension_min_run_s
    return min_run <= 0 or has_run_minimum(victim.job.start_time, session.now, min_run)


def victims(
    session: Session, js: JobState, needs: dict[Role, int], shrink: bool, suspend: bool
) -> Iterator[Victim]:
    """Victim units in the order they are taken: single workers above their job's
    minimum, node by node (the nodes that could hold most of the gang first), then
    whole jobs (lowest priority first), then the workers above the minimum that the
    first pass left on nodes where suspensions made room (it stops at the room that
    shrinking alone reaches). The caller takes each unit before asking for the next, so
    budgets and fulfillment are read fresh."""
    if shrink:
        yield from _shrink_units(session, js, needs)
    if suspend:
        suspended = False
        for victim in _whole_jobs(session, js):
            suspended = True
            yield victim
        if shrink and suspended:  # (without, the first pass offered all that helps)
            yield from _shrink_units(session, js, needs, full=True)


def _whole_jobs(session: Session, js: JobState) -> Iterator[Victim]:
    """The jobs ``may_suspend`` allows, lowest priority first, then lowest ranked, each
    with its remaining replicas (one with none where ``js`` may run frees nothing)."""
    cluster, classes = session.cluster, js.classes
    whole = [v for v in _ranked_below(_had_workers(session), js) if may_suspend(session, js, v)]
    for v in sorted(whole, key=lambda v: (v.priority, -v.rank)):
        gone = set(map(id, v.removed[Role.WORKER] + v.removed[Role.PSERVER]))
        rest = [r for r in v.live[Role.WORKER] + v.live[Role.PSERVER] if id(r) not in gone]
        if any(cluster.node_class[cluster.index[r.node]] in classes for r in rest):
            yield Victim(v, tuple(rest), whole=True)


def _had_workers(session: Session) -> list[JobState]:
    """The jobs with live workers at the cycle's start, in rank order: every job
    ``may_suspend`` can name (one without them runs now only if started this cycle)."""
    index = session.had_workers
    if index is None:
        index = session.had_workers = [v for v in session.jobs if v.live_w]
    return index


def _reclaimable(session: Session) -> list[JobState]:
    """The jobs an equal ranked below may shrink voluntarily (``may_shrink``), in rank
    order; only jobs with live workers at the cycle's start have run their minimum."""
    index = session.reclaimable
    if index is None:
        index = session.reclaimable = [
            v
            for v in _had_workers(session)
            if v.job.preemptible and may_shrink_voluntarily(session, v)
        ]
    return index


def _ranked_below(ranked: list[JobState], js: JobState) -> list[JobState]:
    """The jobs of ``ranked`` (in rank order) ranked below ``js``."""
    return ranked[bisect_right(ranked, js.rank, key=_rank) :]


def _of_lower_priority(ranked: list[JobState], js: JobState) -> list[JobState]:
    """The jobs of ``ranked`` (in rank order) of lower priority than ``js``: with
    priorities, ranking puts each level in one run of ranks, highest first."""
    return ranked[bisect_right(ranked, -js.priority, key=_negated_priority) :]


def _rank(js: JobState) -> int:
    return js.rank


def _negated_priority(js: JobState) -> int:
    return -js.priority


def _spare(session: Session) -> list[JobState]:
    """The jobs that had workers above their minimum at the cycle's start, in rank order."""
    index = session.spare
    if index is None:
        index = session.spare = [v for v in _had_workers(session) if len(v.live_w) > v.lo]
    return index


def _shrinkable(session: Session, js: JobState) -> Iterator[JobState]:
    """Each job that ``may_shrink`` allows for ``js`` and has workers above its minimum,
    once, and a few that do not (checked again). Those ranked below it (a job of higher
    priority never is) that had such workers at the cycle's start, and with
    ``reclaim_equal_priority`` those of its priority ranked above that may shrink now
    (where equals are never shrunk, only those of lower priority are ranked below it); and
    any such job among those moved this cycle (``touched``). Asked for every waiting job
    that preempts, so it visits no job that could never be one: under overload most jobs
    wait, or run at their minimum."""
    policy = session.policy
    reclaim = policy.reclaims
    if reclaim:
        for v in _reclaimable(session):
            if v.rank >= js.rank:
                break
            if v.priority == js.priority:
                yield v
    equals = policy.shrink_equal_priority is not EqualShrinking.NEVER
    spare = _spare(session)
    yield from _ranked_below(spare, js) if equals else _of_lower_priority(spare, js)
    for v in session.touched.values():  # (none of them was yielded above)
        if v.rank > js.rank and (equals or v.priority < js.priority):
            if len(v.live_w) <= v.lo:
                yield v
        elif reclaim and not v.live_w and v.priority == js.priority:
            yield v


def _shrink_units(
    session: Session, js: JobState, needs: dict[Role, int], full: bool = False
) -> Iterator[Victim]:
    cluster, res, need = session.cluster, js.resources(Role.WORKER), needs[Role.WORKER]
    on_node: dict[int, list[tuple[JobState, Replica | None]]] = {}
    for v in _shrinkable(session, js):
        if v.size() <= v.lo or not may_shrink(session, js, v):
            continue
        for n in v.added[_W]:  # growth of this cycle goes back first
            if cluster.node_class[n] in js.classes:
                on_node.setdefault(n, []).append((v, None))
        removed = v.removed[_W]
        gone = set(map(id, removed)) if removed else None  # (most jobs: none removed)
        for r in reversed(v.live[_W]):  # newest first: rank 0 stays longest
            n = cluster.index[r.node]
            if (gone is None or id(r) not in gone) and cluster.node_class[n] in js.classes:
                on_node.setdefault(n, []).append((v, r))

    def potential(n: int) -> int:
        """Room for the gang on ``n`` if every worker there that may go went, each
        victim job giving at most its budget (its workers above the minimum)."""
        gpu = cpu = mem = 0
        budget: dict[JobState, int] = {}  # (by identity: ``JobState`` has eq=False)
        for v, _ in on_node[n]:
            left = budget.get(v)
            if left is None:
                left = v.workers - v.lo
            if left > 0:
                budget[v] = left - 1
                freed = v.job.worker.resources
                gpu += freed.gpu
                cpu += freed.cpu_milli
                mem += freed.memory_bytes
            else:
                budget[v] = left
        return cluster.room_freed(n, res, js.name, js.rank, gpu, cpu, mem)

    def order(n: int) -> tuple[int, int, int, int, int]:
        """Nodes where victims add the most useful room first (a node that already
        holds some of the gang gains nothing from victims up to that), then those
        that could hold most of the gang, then the cheapest victims."""
        lowest = min(v.priority for v, _ in on_node[n])
        now = min(cluster.room(n, res, js.name, js.rank), need)
        return (-(most[n] - now), -most[n], lowest, -now, n)

    # The room for the gang each node can reach: victims there stop once it is reached,
    # and a node where all of them make no room for one worker is passed over (its
    # victims would spend their jobs' budgets for nothing). Parameter servers need room
    # too, which this count of workers does not see: for them every node's victims are
    # offered until the whole gang's workers fit there; in the pass after suspensions
    # (``full``) every useful node's are.
    most = {n: min(potential(n), need) for n in on_node}
    servers = bool(needs.get(Role.PSERVER))
    enough = dict.fromkeys(on_node, need) if full or servers else most
    for n in sorted(on_node, key=order):
        if not servers and most[n] == 0:
            continue
        units = sorted(
            on_node[n],
            key=lambda vr: (
                vr[0].priority,
                -vr[0].fulfillment(),
                -vr[0].rank,
                vr[1] is not None,
            ),
        )
        for v, replica in units:
            if cluster.room(n, res, js.name, js.rank) >= max(1, enough[n]):
                break
            if v.size() <= v.lo:
                continue  # its budget is spent
            if replica is None:
                yield Victim(v, (), whole=False, withdrawn=n)
            else:
                yield Victim(v, (replica,), whole=False)


def take(stmt: Statement, victim: Victim) -> None:
    """Take ``victim``'s replicas (or withdraw its worker added this cycle) in ``stmt``."""
    for replica in victim.replicas:
        stmt.remove(victim.js, replica)
    if victim.withdrawn is not None:
        stmt.cancel(victim.js, Role.WORKER, victim.withdrawn)
