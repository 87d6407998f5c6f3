"""Weights by remaining work: rebalancing gives workers first to the jobs closest to their end.

Pollux's objective (the power mean of the jobs' speed-ups, ``rebalancing``) treats every
job alike whatever it has left to do. For the mean completion time that is not the best
share: with speed-ups that grow as a power ``k^p`` of the workers (``0 < p < 1``), the
optimal allocation (heSRPT, Berg et al., 2020) finishes jobs shortest remaining first and
gives the ``i``-th job counted from the longest a share growing as ``i^(p / (1 - p))``;
the weight on a job's ``-1 / speedup`` that leads rebalancing's greedy moves to such
shares grows as ``i^(p (1 + p) / (1 - p))``, about ``i^2`` for the ``p`` of 0.5-0.6 that
data-parallel jobs measure over a few nodes. So each job's term is weighted by
``(i / n) ** RANK_EXPONENT``: the job with the least work left counts fully, the one with
the most ``1 / n^2``.

What a job has left comes from its runtime, not from a guess: a job on the project's
runtime declares its epochs, and its ledger knows the samples done
(``Job.remaining_samples``). Time left at one worker, the size-free measure the rank
needs, is the samples left over the samples per second it measured at its live size, times
its model's speed-up there (``left_at_one``). A job that reports nothing (or has not
measured its live size) takes the median of those that do, so leaving the field out
neither helps nor harms it; where no job reports, there are no weights and rebalancing is
Pollux's objective exactly.

What must stay true: the weights are a pure function of the step's jobs (their rank breaks
ties), every weight is in ``(0, 1]``, and a job's weight never rises with its remaining
work against the same others.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Final

from edl_scheduler.core.margins import Margins
from edl_scheduler.core.session import JobState
from edl_scheduler.core.snapshot import Job

#: The exponent of a job's position from the longest (see the module).
RANK_EXPONENT: Final = 2.0


def left_at_one(job: Job, kept: Margins) -> float | None:
    """Seconds ``job`` needs at one worker for what it has left: its remaining samples over
    the rate it measured at its live size (``kept``: its margins there), times its model's
    speed-up at that size. None where it reports no remaining samples, or no rate there."""
    left = job.remaining_samples
    if left is None or kept.at <= 0:
        return None
    for sample in job.throughput:
        rate = sample.samples_per_second
        if sample.workers == kept.workers and sample.nodes == kept.nodes and rate > 0:
            return left / rate * kept.at
    return None


def reports(jobs: Iterable[JobState]) -> bool:
    """Whether any of ``jobs`` reports what it has left (else ``weights`` is empty; asked
    first, so that no model is fitted for nothing)."""
    return any(js.job.remaining_samples is not None for js in jobs)


def weights(members: Sequence[tuple[int, Job, Margins]]) -> dict[int, float]:
    """Each member's weight by its rank from ``(rank, job, margins at its live size)``:
    ``(i / n) ** RANK_EXPONENT`` with ``i`` its position counted from the most time left
    (ties: the better-ranked job counts as having less). Empty where no member reports
    what it has left."""
    known = {rank: left_at_one(job, kept) for rank, job, kept in members}
    reported = sorted(v for v in known.values() if v is not None)
    if not reported:
        return {}
    middle = reported[len(reported) // 2]
    left = {rank: (middle if v is None else v) for rank, v in known.items()}
    order = sorted(left, key=lambda rank: (-left[rank], -rank))
    n = len(order)
    return {rank: ((i + 1) / n) ** RANK_EXPONENT for i, rank in enumerate(order)}
