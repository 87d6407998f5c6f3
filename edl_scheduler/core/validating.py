"""What must hold of a snapshot before the planner decides anything.

An inconsistent snapshot is a driver bug or a race (a worker reported on a node that has
gone, more workers than the job allows). The planner refuses it with a typed error naming
the job or node, rather than planning on it: a plan built on a wrong picture could
over-commit a node.
"""

from __future__ import annotations

from edl_scheduler.core.memo import PlanMemo
from edl_scheduler.core.snapshot import Job, Role, RoleSpec, Snapshot


class SnapshotError(ValueError):
    """Base class: ``subject`` names the offending job or node."""

    def __init__(self, subject: str, message: str) -> None:
        super().__init__(message)
        self.subject = subject


class UnknownNodeError(SnapshotError):
    pass


class OverMaximumError(SnapshotError):
    pass


class NegativeCapacityError(SnapshotError):
    pass


class DuplicateNameError(SnapshotError):
    pass


class InvalidJobError(SnapshotError):
    pass


def _check_role(job: Job, role: Role, spec: RoleSpec | None, live: int, any_of_role: bool) -> None:
    if spec is None:
        if any_of_role:
            raise InvalidJobError(
                job.name, f"job {job.name} has {role.value} replicas but no {role.value} spec"
            )
        return
    if spec.min_replicas < (1 if role is Role.WORKER else 0):
        raise InvalidJobError(
            job.name, f"job {job.name}: {role.value} minReplicas ({spec.min_replicas}) < 1"
        )
    if spec.max_replicas < spec.min_replicas:
        raise InvalidJobError(
            job.name,
            f"job {job.name}: {role.value} maxReplicas ({spec.max_replicas}) is below "
            f"minReplicas ({spec.min_replicas})",
        )
    if spec.resources.is_negative():
        raise NegativeCapacityError(
            job.name, f"job {job.name}: {role.value} resources are negative"
        )
    if live > spec.max_replicas:
        raise OverMaximumError(
            job.name,
            f"job {job.name} has {live} live {role.value} replicas, more than its "
            f"maxReplicas ({spec.max_replicas})",
        )


def _check_job(job: Job, node_names: set[str]) -> None:
    # One pass over the replicas (this runs for every job of every cycle); the checks are
    # then made in the order roles, requested size, replicas.
    live_w = live_p = 0
    pservers = False
    for replica in job.replicas:
        if replica.role is Role.WORKER:
            live_w += not replica.draining
        else:
            pservers = True
            live_p += not replica.draining
    _check_role(job, Role.WORKER, job.worker, live_w, live_w > 0)
    _check_role(job, Role.PSERVER, job.pserver, live_p, pservers)
    if job.requested is not None and not (
        job.worker.min_replicas <= job.requested <= job.worker.max_replicas
    ):
        raise InvalidJobError(
            job.name,
            f"job {job.name}: requested size {job.requested} is outside "
            f"[{job.worker.min_replicas}, {job.worker.max_replicas}]",
        )
    if not job.replicas:
        return
    names: set[str] = set()
    for replica in job.replicas:
        if replica.node not in node_names:
            raise UnknownNodeError(
                job.name,
                f"job {job.name}: replica {replica.name} is on unknown node {replica.node!r}",
            )
        if replica.name in names:
            raise DuplicateNameError(
                job.name, f"job {job.name}: replica name {replica.name!r} appears twice"
            )
        names.add(replica.name)


def validate(snapshot: Snapshot, memo: PlanMemo | None = None) -> None:
    """Raise a SnapshotError for the first inconsistency found; return None when valid.

    With a ``memo``, jobs it holds (validated in an earlier cycle on the same nodes) and
    nodes it validated are not checked again; when a check fails the first error is the
    same as without it, because a held job passed every check of its own."""
    if memo is not None and memo.nodes_valid:
        fresh = memo.sort_out(snapshot.jobs)
        if _distinct(fresh, memo):
            node_names = memo.node_names
            for job in fresh:
                _check_job(job, node_names)
            return
    _validate(snapshot)
    if memo is not None:
        memo.nodes_valid = True
        memo.node_names = {node.name for node in snapshot.nodes}


def _distinct(fresh: list[Job], memo: PlanMemo) -> bool:
    """Whether the names of the snapshot just sorted out (``PlanMemo.sort_out``) are
    distinct, looking only at ``fresh``, its jobs not held by the memo. The held ones are
    jobs of the last validated snapshot, whose names were distinct, so two of them clash
    only where one Job is shown twice (``repeated``); a new job clashes with a held one
    only where that one is shown now (marked by this sort, ``Derived.seen``)."""
    if memo.repeated:
        return False
    names, cycle = memo.names, memo.cycle
    new: set[str] = set()
    for job in fresh:
        name = job.name
        other = names.get(name)
        if (other is not None and other.seen == cycle) or name in new:
            return False
        new.add(name)
    return True


def _validate(snapshot: Snapshot) -> None:
    node_names: set[str] = set()
    for node in snapshot.nodes:
        if node.name in node_names:
            raise DuplicateNameError(node.name, f"node {node.name!r} appears twice")
        node_names.add(node.name)
        if node.allocatable.is_negative() or node.used_by_others.is_negative():
            raise NegativeCapacityError(
                node.name, f"node {node.name}: allocatable or used capacity is negative"
            )
    job_names: set[str] = set()
    for job in snapshot.jobs:
        if job.name in job_names:
            raise DuplicateNameError(job.name, f"job {job.name!r} appears twice")
        job_names.add(job.name)
        _check_job(job, node_names)
