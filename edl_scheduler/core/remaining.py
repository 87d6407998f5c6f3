"""Weights by remaining work: rebalancing gives workers first to the jobs closest to their end.

Pollux's objective (the power mean of the jobs' speed-ups, ``rebalancing``) treats every
job alike whatever it has left to do. For the mean completion time that is not the best
share: with speed-ups that grow as a power ``k^p`` of the workers (``0 < p < 1``), the
optimal allocation (heSRPT, Berg et al., 2020) finishes jobs shortest remaining first and
gives the ``i``-th job counted from the longest a share growing as ``i^(p / (1 - p))``;
the weight on a job's ``-1 / speedup`` that leads rebalancing's greedy moves to such
shares grows as ``i^(p (1 + p) / (1 - p))``, about ``i^2`` for the ``p`` of 0.5-0.6 that
data-parallel jobs measure over a few nodes. So each job's term is weighted by
``(i / m) ** RANK_EXPONENT`` among the ``m`` jobs that report: the job with the least work
left counts fully, the one with the most ``1 / m^2``.

What a job has left comes from its runtime, not from a guess: a job on the project's
runtime declares its epochs, and its ledger knows the samples done
(``Job.remaining_samples``). Time left at one worker, the size-free measure the rank needs,
is the samples left over the samples per second its fitted throughput gives at one worker
(``left_at_one``). Jobs are ranked among every job running at the step, those that report
ranked by it; a job that reports nothing counts at the median reporter's weight, so leaving
the field out neither helps nor harms it. Where no job of the step reports, there are no
weights and rebalancing is Pollux's objective exactly.

What must stay true: a plan applied and made again at the same instant changes nothing
(invariant 6), so a job's weight depends on nothing a plan changes: not on its size (time
left is counted at one worker, from its samples) nor on which jobs may move (every running
job is ranked); where none of the step's jobs reports, every job of the step has one
weight, which moves nothing a weight of 1 would not. Every weight is in ``(0, 1]``, and a
job's weight never rises with its remaining work against the same others.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Final

from edl_scheduler.core.session import JobState
from edl_scheduler.core.snapshot import Job
from edl_scheduler.core.throughput import fit

#: The exponent of a job's position from the longest (see the module).
RANK_EXPONENT: Final = 2.0


def left_at_one(job: Job) -> float | None:
    """Seconds ``job`` needs at one worker for what it has left: its remaining samples over
    the samples per second its throughput, fitted to what it measured, gives at one worker
    (not its goodput: its declared end is counted in samples). None where it reports no
    remaining samples or has measured nothing."""
    left = job.remaining_samples
    if left is None or not any(s.samples_per_second > 0 for s in job.throughput):
        return None
    rate = fit(job.throughput).throughput(1, 1)
    return left / rate if rate > 0 else None


def reports(jobs: Iterable[JobState]) -> bool:
    """Whether any of ``jobs`` reports what it has left (else ``weights`` is not needed:
    asked of a step's jobs first, so that nothing is fitted for nothing)."""
    return any(js.job.remaining_samples is not None for js in jobs)


def weights(running: Sequence[tuple[int, Job]]) -> dict[int, float]:
    """The weight of each of ``running`` (``(rank, job)`` of every running job), by rank:
    ``(i / m) ** RANK_EXPONENT`` for the ``m`` that report, ``i`` a job's position counted
    from the most time left (ties: the better-ranked job counts as having less); the others
    the median reporter's weight. Empty where none reports."""
    left = {rank: left_at_one(job) for rank, job in running}
    reporting = sorted(
        (rank for rank, value in left.items() if value is not None),
        key=lambda rank: (-(left[rank] or 0.0), -rank),
    )
    m = len(reporting)
    if not m:
        return {}
    out = {rank: ((i + 1) / m) ** RANK_EXPONENT for i, rank in enumerate(reporting)}
    middle = ((m + 1) // 2 / m) ** RANK_EXPONENT
    return {rank: out.get(rank, middle) for rank, _ in running}
