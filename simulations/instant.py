"""What one instant's plan needs from the active jobs, in as few passes as the rules allow.

Before every plan the engine lists the active jobs (their snapshot ``Job``, live workers and
rank key), then ``pruning.shown`` leaves out the waiting jobs that cannot start,
``pruning.settled`` asks whether the plan would change anything, and ``hiding.split`` finds
the running jobs no plan can change. Each is a pass over every job, where an instant
changes about one. ``collect`` builds the list and sorts it into running and waiting jobs
in the same loop (with the best-ranked waiting job's key); ``narrow`` then answers all
three questions from those, looping over the running jobs and the waiting jobs once each.

What must stay true: ``narrow``'s answers are exactly those of ``shown``, ``settled`` and the
first loop of ``split`` (the best-ranked shown job below its size), on every instant
(``tests/simulations/test_t2_instant.py`` compares them at every plan of the simulations).
It serves only where hiding does (``hiding.hides``: no growth, no shrinking, no priorities,
preemption none or whole-job suspension, rank keys kept) and admission is not strict FIFO;
it answers None, and the engine asks the three functions, where a premise of its shortcuts
fails (a running job that may not be preempted).

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

from edl_scheduler.core import Admission, Job, Policy, Preemption, Reservation
from simulations.hiding import hides
from simulations.pruning import settled, shown
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
class Narrowed:
    """``shown``'s jobs (their Jobs, live workers and keys, in the engine's order), whether
    they are ``settled`` (False where not asked), and ``(key,)`` of the best-ranked of them
    below its size (``split``'s ``best``; ``(None,)``: none; None: not found here)."""

    jobs: list[Job]
    live: list[int]
    keys: list[Key]
    settled: bool
    best: tuple[Key | None] | None


def plainly(
    c: Collected,
    policy: Policy,
    now: float,
    free_gpus: int,
    reservations: Sequence[Reservation],
    prune: bool,
    ask_settled: bool,
) -> Narrowed:
    """The same answers from ``shown`` (where ``prune``) and ``settled`` themselves (every
    policy; keys where kept)."""
    jobs, live = c.jobs, c.live
    keys: list[Key] | None = c.keys if c.keys or not c.jobs else None
    if prune:
        at = shown(jobs, policy, now, free_gpus, reservations, live=live, keys=keys)
        if len(at) < len(jobs):
            jobs, live = [jobs[i] for i in at], [live[i] for i in at]
            keys = None if keys is None else [keys[i] for i in at]
    quiet = ask_settled and settled(jobs, policy, now, free_gpus, live=live, keys=keys)
    return Narrowed(jobs, live, keys if keys is not None else [], quiet, None)


def narrow(
    c: Collected,
    policy: Policy,
    now: float,
    free_gpus: int,
    reservations: Sequence[Reservation],
    *,
    ask_settled: bool,
) -> Narrowed | None:
    """``shown``, ``settled`` (where ``ask_settled``) and ``split``'s best-ranked short job
    from ``c`` (see the module); None where a premise fails: hiding's (``hiding.hides``),
    admission not strict FIFO, every running job preemptible, rank keys kept."""
    if policy.admission is Admission.HEAD_OF_LINE or not hides(policy) or (not c.keys and c.jobs):
        return None
    jobs, live, keys = c.jobs, c.live, c.keys
    held = {r.job for r in reservations}
    suspends = policy.preemption is Preemption.SUSPEND
    elastic = policy.elastic
    free = max(0, free_gpus)
    top_w = c.top_waiting
    pool = free
    may_change = False  # a shown job above its size, leaving by its spec, or with servers
    short_top: Key | None = None  # the best-ranked running job below its size
    short_lack = 0
    least_lack: int | None = None  # the least any shown job below its size lacks
    for i in c.running:
        j = jobs[i]
        if not j.preemptible:
            return None  # (``shown`` then shows everything)
        n, k, w = live[i], keys[i], j.worker
        size = (
            w.min_replicas
            if elastic
            else (j.requested if j.requested is not None else w.max_replicas)
        )
        if n < size:  # (one leaving by its spec or with servers is ``split``'s too)
            lack = (size - n) * w.resources.gpu
            if short_top is None or k < short_top:
                short_top, short_lack = k, lack
            if least_lack is None or lack < least_lack:
                least_lack = lack
        if n > size or j.suspended or j.pserver is not None:
            may_change = True
        if suspends and top_w is not None and k > top_w:
            pool += n * w.resources.gpu
    shown_w: list[int] = []
    fits_top: Key | None = None  # the best-ranked shown waiting job (``split``'s)
    gang_top: Key | None = None  # ... and of those with a gang (``settled``'s)
    gang_lack = 0
    for i in c.waiting:
        j = jobs[i]
        w = j.worker
        size = (
            w.min_replicas
            if elastic
            else (j.requested if j.requested is not None else w.max_replicas)
        )
        gpus = size * w.resources.gpu
        if gpus > pool and j.name not in held:
            continue
        shown_w.append(i)
        k = keys[i]
        if fits_top is None or k < fits_top:
            fits_top = k
        if j.suspended or j.pserver is not None:
            may_change = True
        elif size > 0:
            if gang_top is None or k < gang_top:
                gang_top, gang_lack = k, gpus
            if least_lack is None or gpus < least_lack:
                least_lack = gpus
    if len(shown_w) == len(c.waiting):
        at = None  # every job
    elif not shown_w:
        at = c.running
    else:
        at = sorted(c.running + shown_w)
    # ``split``'s best-ranked shown job below its size: waiting, or running short.
    if short_top is None or (fits_top is not None and fits_top < short_top):
        best = (fits_top,)
    else:
        best = (short_top,)
    if at is None:
        out = Narrowed(jobs, live, keys, False, best)
    else:
        out = Narrowed(
            [jobs[i] for i in at], [live[i] for i in at], [keys[i] for i in at], False, best
        )
    if ask_settled and not may_change:
        out.settled = _settled(
            out,
            c,
            policy,
            now,
            free_gpus,
            short_top,
            short_lack,
            gang_top,
            gang_lack,
            least_lack,
            pool,
        )
    return out


def _settled(
    out: Narrowed,
    c: Collected,
    policy: Policy,
    now: float,
    free_gpus: int,
    short_top: Key | None,
    short_lack: int,
    gang_top: Key | None,
    gang_lack: int,
    least_lack: int | None,
    pool: int,
) -> bool:
    """``settled`` over the shown jobs, from what ``narrow`` counted (no job above its size,
    leaving by its spec, or with servers)."""
    if gang_top is None or (short_top is not None and short_top < gang_top):
        top, lack = short_top, short_lack
    else:
        top, lack = gang_top, gang_lack
    if top is None:
        return True
    assert least_lack is not None
    if policy.preemption is not Preemption.SUSPEND:
        reach = max(0, free_gpus)
    elif top == c.top_waiting:
        reach = pool  # the same free GPUs and running jobs ranked below the same key
    else:
        jobs, live, keys = c.jobs, c.live, c.keys
        reach = max(0, free_gpus)
        for i in c.running:
            if keys[i] > top:
                reach += live[i] * jobs[i].worker.resources.gpu
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
    """``settled`` over the running jobs and the ``arrived`` ones (the engine's question after
    a settled instant), in one loop over the running jobs: False at once where one has no
    Job yet or, under LAS queues (``queue_only``), left the band its Job was built in
    (``Run.in_queue_band``, inlined)."""
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
