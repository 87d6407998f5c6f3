"""What one instant's plan needs from the active jobs, in as few passes as the rules allow.

Before every plan the engine lists the active jobs (their snapshot ``Job``, live workers and
rank key), then ``pruning.shown`` leaves out the waiting jobs that cannot start,
``pruning.settled`` asks whether the plan would change anything, and
``leaving_out.leave_out`` finds the running jobs no plan can change. Each is a pass over
every job, where an instant changes about one. ``shown_from_sides`` answers all three
questions from the running jobs and the waiting jobs (``Running``, ``Waiting``), looping
over each once; the engine keeps those two sides from instant to instant
(``running_and_waiting``). ``collect`` builds the list afresh and sorts it into running and
waiting jobs in the same loop, for the policies ``shown_from_sides`` does not serve
(``shown_from_all`` then asks ``shown`` and ``settled`` themselves).

What must stay true: ``shown_from_sides``'s answers are exactly those of ``shown``,
``settled`` and the first loop of ``leave_out`` (the best-ranked shown job below its size),
on every instant (``tests/simulations/test_showing.py`` compares them at every plan of the
simulations). It serves only where running jobs are left out (``unchangeable.applies``: no
growth, no shrinking, no priorities, preemption none or whole-job suspension, rank keys
kept) and admission is not strict FIFO; it answers None, and the engine asks the three
functions, where a premise of its shortcuts fails (a running job that may not be
preempted).

Why the shortcuts are exact: ``shown`` keeps every running job and the waiting jobs whose
gang fits ``pool`` (free GPUs plus what suspending the running jobs ranked below the
best-ranked waiting job frees) or that hold a reservation. ``settled`` asks the jobs shown:
the best-ranked short one (its lack against ``reach``, free GPUs plus what suspending the
running jobs ranked below it frees), then whether any short job lacks at most ``reach``;
where the best-ranked short job is the best-ranked waiting job, ``reach`` is ``pool`` (the
same free GPUs, the same running jobs, every one preemptible). Where neither early answer
decides, ``settled`` itself is asked about the shown jobs (its sweep; rare).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from edl_scheduler.core import Admission, Job, Policy, Reservation
from edl_scheduler.core.incremental.unchangeable import applies
from edl_scheduler.core.sizing import gang_size
from simulations.pruning import Tally, pruned, settled
from simulations.runs import Run

Key = tuple[float | str, ...]


@dataclass(slots=True)
class Collected:
    """The active jobs in the engine's order: snapshot Job, live workers, rank key (empty
    where the keys are not kept), and where the running and the waiting ones are."""

    jobs: list[Job]
    live: list[int]
    keys: list[Key]
    running: list[int]
    waiting: list[int]
    #: The best-ranked waiting job's key (None: none waits, or keys are not kept).
    top_waiting: Key | None


def collect(
    runs: Iterable[Run],
    now: float,
    rebuild: Callable[[Run, float], Job],
    *,
    queue_only: bool,
    fresh: bool,
    keyed: bool,
) -> Collected:
    """Each run's snapshot Job (its cached one where it still holds: under LAS queues while
    its attained GPU-time stays in the band it was built in, ``Run.in_queue_band``
    inlined; else unless ``fresh`` rebuilds every running job's), its live workers, and its
    rank key where ``keyed`` (``Run.rank_key``, kept with the Job)."""
    jobs: list[Job] = []
    live: list[int] = []
    keys: list[Key] = []
    running: list[int] = []
    waiting: list[int] = []
    top: Key | None = None
    for i, r in enumerate(runs):
        n, job = len(r.replicas), r.cached
        if job is None or (
            n
            and (
                (queue_only and not r.queue_low <= r.attained + n * (now - r.last) < r.queue_high)
                or (fresh and not queue_only)
            )
        ):
            job = rebuild(r, now)
        jobs.append(job)
        live.append(n)
        if keyed:
            k = r.rank_key
            keys.append(k)
            if not n and (top is None or k < top):
                top = k
        if n:
            running.append(i)
        else:
            waiting.append(i)
    return Collected(jobs, live, keys, running, waiting, top)


@dataclass(slots=True)
class Shown:
    """``shown``'s jobs (their Jobs, live workers and keys, in the engine's order), whether
    they are ``settled`` (False where not asked), and ``(key,)`` of the best-ranked of them
    below its size (``leave_out``'s ``best``; ``(None,)``: none; None: not found here)."""

    jobs: list[Job]
    live: list[int]
    keys: list[Key]
    settled: bool
    best: tuple[Key | None] | None


def shown_from_all(
    jobs: list[Job],
    live: list[int],
    keys: list[Key],
    policy: Policy,
    now: float,
    free_gpus: int,
    reservations: Sequence[Reservation],
    prune: bool,
    ask_settled: bool,
    tallied: Tally | None = None,
) -> Shown:
    """The same answers from ``shown`` (where ``prune``) and ``settled`` themselves (every
    policy), over the active jobs as ``collect`` lists them (keys empty where not kept;
    ``tallied``: their ``pruning.Tally``, where the caller keeps it). Reads the lists,
    never changes them (``snapshot_lists`` hands out its own)."""
    kept: list[Key] | None = keys if keys or not jobs else None
    if prune:
        at = pruned(
            jobs, policy, now, free_gpus, reservations, live=live, keys=kept, tallied=tallied
        )
        if at is not None and len(at) < len(jobs):
            jobs, live = [jobs[i] for i in at], [live[i] for i in at]
            kept = None if kept is None else [kept[i] for i in at]
    quiet = ask_settled and settled(jobs, policy, now, free_gpus, live=live, keys=kept)
    return Shown(jobs, live, kept if kept is not None else [], quiet, None)


#: A running job: (arrival index, Job, live workers, rank key).
Running = tuple[int, Job, int, Key]


@dataclass(frozen=True, slots=True)
class Waiting:
    """A waiting job as ``shown_from_sides`` reads it, built once while it waits
    (``running_and_waiting``). A class, not a tuple: compiled, a field of a tuple taken from
    a list is read by unboxing all of them, where ``shown_from_sides`` passes over most
    waiting jobs reading two."""

    index: int  # in arrival order
    job: Job
    key: Key
    size: int
    gpus: int  # of its gang
    name: str
    #: Whether it may change although waiting: leaving by its spec, or with parameter servers.
    flagged: bool


def waiting_entry(index: int, job: Job, key: Key, elastic: bool) -> Waiting:
    size = gang_size(job, elastic)
    flagged = job.suspended or job.pserver is not None
    return Waiting(index, job, key, size, size * job.worker.resources.gpu, job.name, flagged)


def entries(c: Collected, elastic: bool) -> tuple[list[Running], list[Waiting]]:
    """``c``'s running and waiting jobs as ``shown_from_sides`` reads them (keys kept)."""
    jobs, live, keys = c.jobs, c.live, c.keys
    running = [(i, jobs[i], live[i], keys[i]) for i in c.running]
    return running, [waiting_entry(i, jobs[i], keys[i], elastic) for i in c.waiting]


def shown_from_sides(
    running: list[Running],
    waiting: list[Waiting],
    top_w: Key | None,
    policy: Policy,
    now: float,
    free_gpus: int,
    reservations: Sequence[Reservation],
    *,
    ask_settled: bool,
) -> Shown | None:
    """``shown``, ``settled`` (where ``ask_settled``) and ``leave_out``'s best-ranked short job
    over the active jobs, given as their running and waiting ones (each in arrival order;
    ``top_w``: the best-ranked waiting key). See the module. None where a premise fails:
    hiding's (``unchangeable.applies``), admission not strict FIFO, every running job preemptible.
    (Lists, and loops that index them: compiled, a loop over a ``Sequence`` or ``zip``
    goes through Python's iteration protocol.)"""
    if policy.admission is Admission.HEAD_OF_LINE or not applies(policy):
        return None
    held = {r.job for r in reservations}
    suspends = policy.suspends
    elastic = policy.elastic
    free = max(0, free_gpus)
    pool = free
    may_change = False  # a shown job above its size, leaving by its spec, or with servers
    short_top: Key | None = None  # the best-ranked running job below its size
    short_lack = 0
    least_lack = -1  # the least any shown job below its size lacks (-1: none is)
    for _, j, n, k in running:
        if not j.preemptible:
            return None  # (``shown`` then shows everything)
        w = j.worker
        size = gang_size(j, elastic)
        if n < size:  # (one leaving by its spec or with servers is ``leave_out``'s too)
            lack = (size - n) * w.resources.gpu
            if short_top is None or k < short_top:
                short_top, short_lack = k, lack
            if least_lack < 0 or lack < least_lack:
                least_lack = lack
        if n > size or j.suspended or j.pserver is not None:
            may_change = True
        if suspends and top_w is not None and k > top_w:
            pool += n * w.resources.gpu
    # The shown jobs in arrival order: the shown waiting ones merged with the running ones
    # as they come (both runs are in arrival order, and no index is in both).
    jobs: list[Job] = []
    live: list[int] = []
    keys: list[Key] = []
    at, ran = 0, len(running)
    fits_top: Key | None = None  # the best-ranked shown waiting job (``leave_out``'s)
    gang_top: Key | None = None  # ... and of those with a gang (``settled``'s)
    gang_lack = 0
    for e in waiting:
        gpus = e.gpus
        if gpus > pool and e.name not in held:
            continue
        i, k = e.index, e.key
        while at < ran:
            ri, rj, rn, rk = running[at]
            if ri > i:
                break
            jobs.append(rj)
            live.append(rn)
            keys.append(rk)
            at += 1
        jobs.append(e.job)
        live.append(0)
        keys.append(k)
        if fits_top is None or k < fits_top:
            fits_top = k
        if e.flagged:
            may_change = True
        elif e.size > 0:
            if gang_top is None or k < gang_top:
                gang_top, gang_lack = k, gpus
            if least_lack < 0 or gpus < least_lack:
                least_lack = gpus
    while at < ran:
        _, rj, rn, rk = running[at]
        jobs.append(rj)
        live.append(rn)
        keys.append(rk)
        at += 1
    # ``leave_out``'s best-ranked shown job below its size: waiting, or running short.
    if short_top is None or (fits_top is not None and fits_top < short_top):
        best = (fits_top,)
    else:
        best = (short_top,)
    out = Shown(jobs, live, keys, False, best)
    if ask_settled and not may_change:
        out.settled = _settled(
            out,
            running,
            top_w,
            policy,
            now,
            free_gpus,
            (short_top, short_lack),
            (gang_top, gang_lack),
            least_lack,
            pool,
        )
    return out


def _settled(
    out: Shown,
    running: list[Running],
    top_w: Key | None,
    policy: Policy,
    now: float,
    free_gpus: int,
    short: tuple[Key | None, int],
    gang: tuple[Key | None, int],
    least_lack: int,
    pool: int,
) -> bool:
    """``settled`` over the shown jobs, from what ``shown_from_sides`` counted (no job above
    its size, leaving by its spec, or with servers): ``short`` and ``gang``, the best-ranked
    running job below its size and waiting job with a gang, with what each lacks;
    ``least_lack``, the least any of them lacks (-1: none lacks anything)."""
    (short_top, short_lack), (gang_top, gang_lack) = short, gang
    if gang_top is None or (short_top is not None and short_top < gang_top):
        top, lack = short_top, short_lack
    else:
        top, lack = gang_top, gang_lack
    if top is None:
        return True
    assert least_lack >= 0
    if not policy.suspends:
        reach = max(0, free_gpus)
    elif top == top_w:
        reach = pool  # the same free GPUs and running jobs ranked below the same key
    else:
        reach = max(0, free_gpus)
        for _, j, n, k in running:
            if k > top:
                reach += n * j.worker.resources.gpu
    if lack <= reach:
        return False
    if least_lack > reach:
        return True
    return settled(out.jobs, policy, now, free_gpus, live=out.live, keys=out.keys)


def arrivals_settled(
    running: Iterable[Run],
    arrived: Iterable[Run],
    now: float,
    rebuild: Callable[[Run, float], Job],
    policy: Policy,
    free_gpus: int,
    *,
    queue_only: bool,
) -> bool:
    """``settled`` over the running jobs and the ``arrived`` ones: the engine's question after
    a settled instant when only ``arrived`` came since. Free GPUs, running jobs and rank keys
    are as they were, so every job that waited still cannot start, and the rule asks about
    the arrivals alone, in one loop over the running jobs: False at once where one has no
    Job yet or, under LAS queues (``queue_only``), left the band its Job was built in
    (``Run.in_queue_band``, inlined; a wake-up may land a hair before a threshold, and the
    crossing then comes with no wake-up of its own: the full path rebuilds its Job)."""
    jobs: list[Job] = []
    live: list[int] = []
    keys: list[Key] = []
    for r in running:
        job = r.cached
        if job is None:
            return False  # (not after a settled instant: every Job was built there)
        if queue_only:
            n = len(r.replicas)
            if not r.queue_low <= r.attained + n * (now - r.last) < r.queue_high:
                return False
        jobs.append(job)
        live.append(len(job.replicas))
        keys.append(r.rank_key)
    for r in arrived:
        job = r.cached if r.cached is not None else rebuild(r, now)
        jobs.append(job)
        live.append(len(job.replicas))
        keys.append(r.rank_key)
    return settled(jobs, policy, now, free_gpus, live=live, keys=keys)
