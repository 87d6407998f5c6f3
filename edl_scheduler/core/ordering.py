"""How a policy ranks jobs: the order of admission, and "higher-ranked" in invariant 4.

Rank 0 is the first to be served. With priorities, every job of a higher priority ranks
above every job of a lower one; within a level the policy's ordering decides; the job name
breaks the last tie so that ranking is total and deterministic.

Which policy fields make a job's rank depend on time is said here, once: a waiting job's
under a LAS starvation limit (``key_varies``, ``starvation_end``), a running job's where
the ordering reads attained GPU-time (``ranks_by_queue``: only when it crosses a queue
threshold, ``queue_of``, ``queue_band``; ``ranks_continuously``: at every instant). A
driver that keeps rank keys between plans (the simulator) asks these, never the fields.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from edl_scheduler.core.policy import Ordering, Policy
from edl_scheduler.core.snapshot import Job, Role


def effective_priority(job: Job, policy: Policy) -> int:
    return job.priority if policy.use_priority else 0


def queue_of(attained: float, thresholds: tuple[float, ...]) -> int:
    """The LAS queue of a job that attained ``attained`` GPU-seconds: how many thresholds
    it has passed."""
    queue = 0
    for t in thresholds:
        if attained >= t:
            queue += 1
    return queue


def queue_band(attained: float, thresholds: tuple[float, ...]) -> tuple[float, float]:
    """The attained GPU-seconds ``[low, high)`` within which a job that attained
    ``attained`` stays in its LAS queue (``queue_of``)."""
    low = max((t for t in thresholds if t <= attained), default=-math.inf)
    high = min((t for t in thresholds if t > attained), default=math.inf)
    return low, high


def starves(job: Job, policy: Policy, now: float) -> bool:
    """Whether a waiting job has waited past the policy's LAS starvation limit by ``now``
    (it then returns to the first queue)."""
    limit = policy.starvation_limit_s
    return limit is not None and not job.replicas and not now - job.submit_time < limit


def starvation_end(submit_time: float, policy: Policy) -> float | None:
    """When a job submitted at ``submit_time`` that still waits starts to starve
    (``starves`` from that instant on; None: the policy has no limit)."""
    limit = policy.starvation_limit_s
    return None if limit is None else submit_time + limit


def las_queue(job: Job, policy: Policy, now: float) -> int:
    """The discretized 2D-LAS queue of a job: how many thresholds its attained GPU-time
    has passed, or 0 when it has starved past the policy's starvation limit."""
    if starves(job, policy, now):
        return 0
    return queue_of(job.attained_gpu_seconds, policy.queue_thresholds_gpu_s)


def _waits(job: Job) -> float:
    """0.0 for a job with live workers, 1.0 for one that waits (the LAS tie-break)."""
    for r in job.replicas:
        if r.role is Role.WORKER and not r.draining:
            return 0.0
    return 1.0


def rank_key(job: Job, policy: Policy, now: float) -> tuple[float, ...]:
    prio = -float(effective_priority(job, policy))
    if policy.ordering is Ordering.LEAST_ATTAINED:
        return (prio, job.attained_gpu_seconds, job.submit_time)
    if policy.ordering is Ordering.LAS_QUEUES:
        queue = float(las_queue(job, policy, now))
        waits = _waits(job) if policy.las_running_first else 0.0
        return (prio, queue, waits, job.submit_time)
    return (prio, job.submit_time)


def sort_key(policy: Policy, now: float) -> Callable[[Job], tuple[float | str, ...]]:
    """``(*rank_key(job, policy, now), job.name)`` with the policy's choices made once, not
    once per job (this orders every job of every cycle)."""
    use_priority = policy.use_priority
    if policy.ordering is Ordering.LEAST_ATTAINED:

        def least_attained(j: Job) -> tuple[float | str, ...]:
            prio = -float(j.priority if use_priority else 0)
            return (prio, j.attained_gpu_seconds, j.submit_time, j.name)

        return least_attained
    if policy.ordering is Ordering.LAS_QUEUES:
        running_first = policy.las_running_first

        def las(j: Job) -> tuple[float | str, ...]:
            prio = -float(j.priority if use_priority else 0)
            queue = las_queue(j, policy, now)
            waits = _waits(j) if running_first else 0.0
            return (prio, float(queue), waits, j.submit_time, j.name)

        return las

    def fifo(j: Job) -> tuple[float | str, ...]:
        return (-float(j.priority if use_priority else 0), j.submit_time, j.name)

    return fifo


def key_varies(policy: Policy) -> bool:
    """Whether a waiting job's rank key depends on ``now`` (the LAS starvation rule); a
    running job's never does, nor any job's under the other orderings."""
    return policy.ordering is Ordering.LAS_QUEUES and policy.starvation_limit_s is not None


def ranks_by_queue(policy: Policy) -> bool:
    """Whether a running job's rank reads its attained GPU-time only through its LAS queue
    (``queue_of``): it moves only when the job crosses a threshold."""
    return policy.ordering is Ordering.LAS_QUEUES


def ranks_continuously(policy: Policy) -> bool:
    """Whether a running job's rank reads its attained GPU-time itself (least attained
    first): it moves at every instant the job runs."""
    return policy.ordering is Ordering.LEAST_ATTAINED


def ranked(jobs: tuple[Job, ...], policy: Policy, now: float) -> list[Job]:
    """Jobs in the order the policy serves them (first = highest ranked)."""
    return sorted(jobs, key=sort_key(policy, now))
