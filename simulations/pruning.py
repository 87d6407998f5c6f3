"""Which jobs the planner must see: waiting jobs that provably cannot start are left out.

The planner's cost grows with the jobs in its snapshot, and in a congested cluster most of
them are waiting jobs that this plan cannot start. Leaving those out changes no decision,
because admission tries each waiting job in a statement that is discarded when its gang does
not fit: a job that fails takes nothing, reserves nothing and blocks nothing, except under
strict FIFO (head-of-line), where it blocks every job ranked below it. Its trial leaves
no trace on the cluster either (placement walks the nodes in an order that depends on free
capacity alone), so node choices of the others stay the same.

A waiting job ``X`` cannot start when its gang needs more GPUs than could possibly be free
at its turn in any round of the cycle:

    free GPUs
    + (shrink allowed)   workers above the minimum of every running job
    + (suspend allowed)  all workers of every running job that some waiting job may suspend

The last term is not "jobs ranked below ``X``": a job ranked above ``X`` may suspend a whole
job to start, use part of its GPUs, and leave the rest free for ``X``, whose own rank never
entered into it (on ``philly_1d`` under ``tiresias`` a 1-GPU job suspended a 4-GPU job and a
2-GPU job ranked below both started on the rest). So the term counts every running job the
best-ranked waiting job could suspend (ranked below it, or of lower priority where the policy
uses priorities); a job ranked below that one can suspend no other. Growth only moves GPUs
from "free" to "above the minimum", so it cannot raise the sum.

Each term is an upper bound of what the planner could take (it may take less: cool-downs,
priorities, node fit), so the rule only errs toward showing a job. Always shown: running
jobs, jobs that hold reservations (the planner carries a hold only for a job it sees), and,
under head-of-line admission, the first waiting job (it may block the rest; at most
``free + 1`` waiting jobs can matter when nothing can be preempted). Everything is shown
where the rule's premises fail: the least-attained ordering, a running job that may not be
preempted (growth holds it back while a higher-ranked job waits, whether that job can start
or not), and head-of-line admission with preemption or priorities.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from edl_scheduler.core import Admission, Job, Ordering, Policy, Reservation, Role
from edl_scheduler.core.ordering import ranks_continuously, sort_key
from edl_scheduler.core.sizing import gang_gpus, gang_size, surplus_gpus


def _live_workers(job: Job) -> int:
    """Live (placed, not draining) workers: ``len(job.live(Role.WORKER))`` without the tuple."""
    count = 0
    for r in job.replicas:
        if r.role is Role.WORKER and not r.draining:
            count += 1
    return count


def visible(
    jobs: Sequence[Job],
    policy: Policy,
    now: float,
    free_gpus: int,
    reservations: Sequence[Reservation] = (),
    *,
    live: Sequence[int] | None = None,
    keys: Sequence[tuple[float | str, ...]] | None = None,
) -> list[Job]:
    """``jobs`` (in submit order) without the waiting ones that cannot start now.

    ``live`` and ``keys``, where a caller that keeps them passes them (the simulator), are
    each job's live workers and its rank key (``ordering.sort_key(policy, now)``), in the
    order of ``jobs``; else they are computed here."""
    at = shown(jobs, policy, now, free_gpus, reservations, live=live, keys=keys)
    return [jobs[i] for i in at]


def shown(
    jobs: Sequence[Job],
    policy: Policy,
    now: float,
    free_gpus: int,
    reservations: Sequence[Reservation] = (),
    *,
    live: Sequence[int] | None = None,
    keys: Sequence[tuple[float | str, ...]] | None = None,
) -> list[int]:
    """Where in ``jobs`` the jobs ``visible`` returns are, in its order (a caller that keeps
    something per job takes the same entries)."""
    at = pruned(jobs, policy, now, free_gpus, reservations, live=live, keys=keys)
    return list(range(len(jobs))) if at is None else at


class Tally:
    """What ``shown`` reads of every job, from one pass over them (``tally``) or kept by a
    caller that follows each change (``snapshot_lists.SnapshotLists``): the GPUs above the
    minimum of the running jobs (what shrinking them frees, under an elastic policy);
    whether every running job may be preempted; the GPUs of the largest waiting job's gang
    (``gang``; -1: none waits), so that where it fits every waiting job does, and where
    the waiting jobs are, in order (``waiting``: a keeper finds them only if asked)."""

    __slots__ = ("_waiting", "_where", "largest", "preemptible", "surplus")

    def __init__(
        self,
        waiting: list[int] | None,
        surplus: int,
        preemptible: bool,
        largest: int,
        where: Callable[[], list[int]] | None = None,
    ) -> None:
        self._waiting = waiting
        self._where = where
        self.surplus = surplus
        self.preemptible = preemptible
        self.largest = largest

    def waiting(self) -> list[int]:
        """Where the waiting jobs are, in order."""
        if self._waiting is None:
            assert self._where is not None  # (one of the two is given)
            self._waiting = self._where()
        return self._waiting


def surplus_of(job: Job, live: int, elastic: bool) -> int:
    """GPUs above ``job``'s minimum that its ``live`` workers take (0 while it waits)."""
    return surplus_gpus(live, gang_size(job, elastic), job.worker.resources.gpu)


def tally(jobs: list[Job], live: list[int], shrink: bool, elastic: bool) -> Tally:
    """``Tally`` of ``jobs`` by one pass (the surplus only where ``shrink``); it stops at
    the first running job that may not be preempted (then every job is shown)."""
    waiting: list[int] = []
    surplus = 0
    largest = -1
    for i in range(len(live)):
        n = live[i]
        j = jobs[i]
        if not n:
            waiting.append(i)
            largest = max(largest, gang_gpus(j, elastic))
            continue
        if not j.preemptible:
            return Tally([], 0, False, -1)
        if shrink:
            surplus += surplus_of(j, n, elastic)
    return Tally(waiting, surplus, True, largest)


def pruned(
    jobs: Sequence[Job],
    policy: Policy,
    now: float,
    free_gpus: int,
    reservations: Sequence[Reservation] = (),
    *,
    live: Sequence[int] | None = None,
    keys: Sequence[tuple[float | str, ...]] | None = None,
    tallied: Tally | None = None,
) -> list[int] | None:
    """``shown``, or None where it shows every job (no list of every index is made).
    ``tallied``: the jobs' ``Tally``, where the caller keeps it (else one pass makes it).

    This runs before every plan over every job: one pass goes over them all, the other
    loops over the waiting or the running jobs alone, and the sequences are indexed as
    lists (compiled, indexing a ``Sequence`` is a generic call)."""
    js = jobs if isinstance(jobs, list) else list(jobs)
    if ranks_continuously(policy):
        return None
    shrink = policy.elastic and policy.shrinks
    suspend = policy.suspends
    if live is None:
        ns = [_live_workers(j) if j.replicas else 0 for j in js]
    else:
        ns = live if isinstance(live, list) else list(live)
    elastic = policy.elastic
    got = tally(js, ns, shrink, elastic) if tallied is None else tallied
    if not got.preemptible:
        return None
    pool = max(0, free_gpus) + (got.surplus if shrink else 0)
    if policy.admission is Admission.HEAD_OF_LINE:
        if shrink or suspend or policy.use_priority or policy.ordering is not Ordering.FIFO:
            return None
        held = {r.job for r in reservations}
        waiting = got.waiting()
        first = waiting[: max(0, free_gpus) + 1]
        running = [i for i in range(len(ns)) if ns[i]]
        return running + first + [i for i in waiting[len(first) :] if js[i].name in held]
    if got.largest <= pool:
        return None  # (suspending may only add to the pool)
    waiting = got.waiting()
    held = {r.job for r in reservations}
    if suspend and waiting:
        if keys is None:
            key = sort_key(policy, now)  # (*rank_key, name), the planner's own ranking
            ks = [key(j) for j in js]
        else:
            ks = keys if isinstance(keys, list) else list(keys)
        # The best-ranked waiting job (keys end in the name: no two are equal).
        best_at = waiting[0]
        top = ks[best_at]
        for i in waiting:
            if ks[i] < top:
                top, best_at = ks[i], i
        if not policy.suspends_by_rank:  # only lower priorities
            best = js[best_at].priority
            for i in range(len(ns)):
                if ns[i]:
                    j = js[i]
                    if j.priority < best:
                        pool += ns[i] * j.worker.resources.gpu
        else:
            for i in range(len(ns)):
                if ns[i] and ks[i] > top:
                    pool += ns[i] * js[i].worker.resources.gpu
    fits = []
    for i in waiting:
        j = js[i]
        if gang_gpus(j, elastic) <= pool or j.name in held:
            fits.append(i)
    if len(fits) == len(waiting):
        return None
    running = [i for i in range(len(ns)) if ns[i]]
    if not fits:
        return running
    # Both runs are in the order of ``jobs``: merged, they are too.
    return sorted(running + fits)


def settled(
    jobs: Sequence[Job],
    policy: Policy,
    now: float,
    free_gpus: int,
    *,
    live: Sequence[int] | None = None,
    keys: Sequence[tuple[float | str, ...]] | None = None,
) -> bool:
    """Whether a plan over ``jobs`` provably changes nothing: the policy only starts jobs
    (rigid sizes, no growth, no shrinking, no priorities) and no job below its size can be
    the first to start. Then ``plan()`` returns every job as it is (the caller checks that no
    reservation is still held: a hold changes where a job may go).

    Why that is exact: admission visits the jobs below their size in rank order; before the
    first of them starts, nothing has changed, so each one tried meets the free GPUs and the
    suspendable jobs ranked below it as they are now, and admission skips it without a trace
    when its gang exceeds their sum (``Admitter.run``'s quick reject). If every such job is
    skipped, none starts, nothing is suspended, and with no growth there is no second round.
    ``live`` and ``keys`` as for ``visible``. False wherever a premise fails."""
    if not policy.moves_whole_jobs_only:
        return False
    if live is None:
        live = [_live_workers(j) if j.replicas else 0 for j in jobs]
    if keys is None:
        key = sort_key(policy, now)
        keys = [key(j) for j in jobs]
    suspends = policy.suspends
    # (rank key, 1, GPUs it lacks) for a job below its size; (rank key, 0, GPUs suspending
    # it frees) for a running job. Keys end in the job's name, so for one job below its
    # size that runs, its lack sorts first in the sweep below: its own workers are not in
    # its pool, as in the admitter's.
    entries: list[tuple[tuple[float | str, ...], int, int]] = []
    top: tuple[float | str, ...] | None = None  # the best-ranked short job's key
    lack = 0
    elastic = policy.elastic
    # Indexed loops over lists: compiled, ``zip`` goes through Python's iteration protocol.
    js = jobs if isinstance(jobs, list) else list(jobs)
    ns = live if isinstance(live, list) else list(live)
    ks = keys if isinstance(keys, list) else list(keys)
    assert len(ns) == len(ks) == len(js)  # (one entry per job in each)
    for at in range(len(js)):
        j, n = js[at], ns[at]
        worker = j.worker
        size = gang_size(j, elastic)
        if n > size or j.suspended or j.pserver is not None:
            # Above its size, leaving by its spec, or with parameter servers (the planner
            # restores a missing one, which needs no GPU): it may change.
            return False
        gpu = worker.resources.gpu
        if n < size:
            k = ks[at]
            entries.append((k, 1, (size - n) * gpu))
            if top is None or k < top:
                top, lack = k, (size - n) * gpu
        if n and suspends and j.preemptible:
            entries.append((ks[at], 0, n * gpu))
    if top is None:
        return True
    free = max(0, free_gpus)
    # Most plans that change something start the best-ranked short job: one sum says so.
    reach = free + sum(g for k, lacks, g in entries if not lacks and k > top)
    if lack <= reach:
        return False
    # Every other short job ranks below the best one, so what suspending frees for it is
    # part of ``reach``: where no job lacks at most that, none can start (most settled
    # instants), without the sweep's sort.
    if all(g > reach for _, lacks, g in entries if lacks):
        return True
    # From the lowest rank up: ``pool`` is what suspending every running job ranked below
    # the one at hand frees.
    entries.sort(reverse=True)
    pool = 0
    for _, lacks, gpus in entries:
        if not lacks:
            pool += gpus
        elif gpus <= free + pool:
            return False
    return True
