"""How many workers a job runs with under a policy: its bounds, the gang it starts with, and
what it holds above its minimum. One answer each, asked by the planner's steps and by the
simulator's shortcuts alike.

Under an elastic policy a job runs between its spec's ``minReplicas`` and ``maxReplicas``;
under a rigid one at exactly its requested size (``requested``, else its maximum). Its gang
is its minimum: the workers that must be placed at once for it to start (invariant 2). What
its workers above the minimum take is what shrinking it may free (invariant 4). Nothing here
reads a clock or does I/O.
"""

from __future__ import annotations

from edl_scheduler.core.snapshot import Job


def bounds(job: Job, elastic: bool) -> tuple[int, int]:
    """The least and the most workers ``job`` runs with under an elastic (or rigid)
    policy."""
    worker = job.worker
    if elastic:
        return worker.min_replicas, worker.max_replicas
    size = job.requested if job.requested is not None else worker.max_replicas
    return size, size


def gang_size(job: Job, elastic: bool) -> int:
    """The workers ``job`` needs to start: its minimum (elastic) or its rigid size."""
    worker = job.worker
    if elastic:
        return worker.min_replicas
    return job.requested if job.requested is not None else worker.max_replicas


def gang_gpus(job: Job, elastic: bool) -> int:
    """The GPUs of ``job``'s gang."""
    return gang_size(job, elastic) * job.worker.resources.gpu


def surplus_gpus(workers: int, minimum: int, gpu: int) -> int:
    """The GPUs that ``workers`` workers of ``gpu`` GPUs each hold above a job's
    ``minimum``: what shrinking the job to its minimum frees (0 at or below it)."""
    return max(0, workers - minimum) * gpu
