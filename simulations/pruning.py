"""Which jobs the planner must see: waiting jobs that provably cannot start are left out.

The planner's cost grows with the jobs in its snapshot, and in a congested cluster most of
them are waiting jobs that this plan cannot start. Leaving those out changes no decision,
because admission tries each waiting job in a statement that is discarded when its gang does
not fit: a job that fails takes nothing, reserves nothing and blocks nothing, except under
strict FIFO (head-of-line), where it blocks every job ranked below it.

A waiting job ``X`` cannot start when its gang needs more GPUs than could possibly be
freed for it:

    free GPUs
    + (shrink allowed)   workers above the minimum of every running job
    + (suspend allowed)  all workers of every running job ranked below ``X``

Each term is an upper bound of what the planner could take (it may take less: cool-downs,
priorities, node fit), so the rule only errs toward showing a job. Under head-of-line
admission the first waiting job is always kept (it may block the rest), and at most
``free + 1`` waiting jobs can matter when nothing can be preempted. With capacity held by
reservations, or with the least-attained ordering, every job is shown.

Known gap: under preemptive policies the rule is off by default (``prune_preemptive``). On
``philly_1d`` under ``tiresias`` it changed a few jobs' preemption counts (average JCT
10,248.34 s pruned against 10,248.19 s unpruned), so some decision of the planner depends on
a waiting job that the bound says cannot start; until that is understood, only the
non-preemptive policies (``fifo-gang``, ``fifo-backfill``) are pruned, where results are
identical.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

from edl_scheduler.core import Admission, Job, Ordering, Policy, Preemption, Role
from edl_scheduler.core.ordering import rank_key


def _minimum(job: Job, policy: Policy) -> int:
    return job.worker.min_replicas if policy.elastic else job.rigid_size


def visible(
    jobs: Sequence[Job],
    policy: Policy,
    now: float,
    free_gpus: int,
    reserved: bool,
    *,
    prune_preemptive: bool = False,
) -> list[Job]:
    """``jobs`` (in submit order) without the waiting ones that cannot start now."""
    if reserved or policy.ordering is Ordering.LEAST_ATTAINED:
        return list(jobs)
    if policy.preemption is not Preemption.NONE and not prune_preemptive:
        return list(jobs)
    shrink = policy.elastic and policy.preemption in (
        Preemption.SHRINK,
        Preemption.SHRINK_THEN_SUSPEND,
    )
    suspend = policy.preemption in (Preemption.SUSPEND, Preemption.SHRINK_THEN_SUSPEND)
    running = [j for j in jobs if j.live(Role.WORKER)]
    if policy.admission is Admission.HEAD_OF_LINE:
        if shrink or suspend or policy.use_priority or policy.ordering is not Ordering.FIFO:
            return list(jobs)
        shown = list(running)
        waiting = [j for j in jobs if not j.live(Role.WORKER)]
        return shown + waiting[: max(0, free_gpus) + 1]
    pool = max(0, free_gpus)
    if shrink:
        for j in running:
            gpu = j.worker.resources.gpu
            pool += max(0, len(j.live(Role.WORKER)) - _minimum(j, policy)) * gpu
    keys: list[tuple[tuple[float, ...], str]] = []
    suffix: list[int] = [0]
    if suspend:
        ranked = sorted(running, key=lambda j: (rank_key(j, policy, now), j.name))
        keys = [(rank_key(j, policy, now), j.name) for j in ranked]
        held = [len(j.live(Role.WORKER)) * j.worker.resources.gpu for j in ranked]
        suffix = [0] * (len(held) + 1)
        for i in range(len(held) - 1, -1, -1):
            suffix[i] = suffix[i + 1] + held[i]
    shown = []
    for job in jobs:
        if job.live(Role.WORKER):
            shown.append(job)
            continue
        need = _minimum(job, policy) * job.worker.resources.gpu
        could = pool
        if suspend:
            at = bisect.bisect_right(keys, (rank_key(job, policy, now), job.name))
            could += suffix[at]
        if need <= could:
            shown.append(job)
    return shown
