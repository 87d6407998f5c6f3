"""What must hold of a snapshot before the planner decides anything, and what becomes of a
job that breaks it.

An inconsistent snapshot is a driver bug, a race (a worker reported on a node that has
gone) or a user's edit the driver passed on unchecked. The planner never plans on a wrong
picture, since a plan built on one could over-commit a node; but one job's bad state must
never stop planning for the others. So the problems are of two scopes:

- ``JobError``: one job's state (a replica on an unknown node, bounds the planner cannot
  honour, two replicas or two jobs of one name). ``validate`` returns these; ``plan`` sets
  each such job aside for the cycle (``set_aside``): it keeps the replicas it has, the
  capacity they take is used as other pods' is, and its decision says what is wrong and
  how to fix it (``Reason.SET_ASIDE``). Every other job is planned as if the job were not
  there.
- ``ClusterError``: the nodes themselves (a node listed twice, negative capacity). No job
  can be planned safely on such a picture, so ``validate`` raises and the cycle stops.

A job with more live replicas than its maximum is no error: the user lowered the maximum,
and the planner drains the surplus (``complying``).

What must stay true: the set of jobs set aside is a function of the snapshot alone; an
incremental planner that checks only the jobs it has not seen finds the same set
(``incremental``).
"""

from __future__ import annotations

from dataclasses import replace

from edl_scheduler.core.resources import NO_RESOURCES, Resources
from edl_scheduler.core.snapshot import Job, Role, RoleSpec, Snapshot


class SnapshotError(ValueError):
    """Base class: ``subject`` names the offending job or node; the message says what is
    wrong and what fixes it."""

    def __init__(self, subject: str, message: str) -> None:
        super().__init__(message)
        self.subject = subject


class JobError(SnapshotError):
    """One job's state the planner cannot accept: that job is set aside for the cycle."""


class ClusterError(SnapshotError):
    """The nodes are inconsistent: no job can be planned, and the cycle stops."""


class UnknownNodeError(JobError):
    pass


class NegativeCapacityError(JobError):
    pass


class DuplicateNameError(JobError):
    """Two jobs, or two replicas of one job, share a name."""


class InvalidJobError(JobError):
    pass


class DuplicateNodeError(ClusterError):
    pass


class NegativeNodeCapacityError(ClusterError):
    pass


def _role_problem(
    job: Job, role: Role, spec: RoleSpec | None, any_of_role: bool
) -> JobError | None:
    name, what = job.name, role.value
    if spec is None:
        if any_of_role:
            return InvalidJobError(
                name,
                f"job {name} has {what} replicas but no {what} spec: give the job a "
                f"{what} spec, or delete its {what} replicas",
            )
        return None
    least = 1 if role is Role.WORKER else 0
    if spec.min_replicas < least:
        return InvalidJobError(
            name,
            f"job {name}: {what} minReplicas ({spec.min_replicas}) is below {least}: "
            f"set it to at least {least}",
        )
    if spec.max_replicas < spec.min_replicas:
        return InvalidJobError(
            name,
            f"job {name}: {what} maxReplicas ({spec.max_replicas}) is below minReplicas "
            f"({spec.min_replicas}): raise maxReplicas or lower minReplicas",
        )
    if spec.resources.is_negative():
        return NegativeCapacityError(
            name,
            f"job {name}: {what} resources are negative ({spec.resources}): request zero "
            "or more of each",
        )
    return None


def problem_of(job: Job, node_names: set[str]) -> JobError | None:
    """The first problem of ``job`` on its own (its name against others' is checked by
    ``validate``), or None. Checked in the order roles, requested size, replicas."""
    pservers = False
    for replica in job.replicas:
        if replica.role is not Role.WORKER:
            pservers = True
            break
    found = _role_problem(job, Role.WORKER, job.worker, False)
    if found is None:
        found = _role_problem(job, Role.PSERVER, job.pserver, pservers)
    if found is not None:
        return found
    if job.requested is not None and not (
        job.worker.min_replicas <= job.requested <= job.worker.max_replicas
    ):
        return InvalidJobError(
            job.name,
            f"job {job.name}: requested size {job.requested} is outside "
            f"[{job.worker.min_replicas}, {job.worker.max_replicas}]: request a size "
            "between minReplicas and maxReplicas",
        )
    if not job.replicas:
        return None
    names: set[str] = set()
    for replica in job.replicas:
        if replica.node not in node_names:
            return UnknownNodeError(
                job.name,
                f"job {job.name}: replica {replica.name} is on unknown node "
                f"{replica.node!r}: delete the replica (it is replaced on a node that "
                "exists) or bring the node back",
            )
        if replica.name in names:
            return DuplicateNameError(
                job.name,
                f"job {job.name}: replica name {replica.name!r} appears twice: give each "
                "replica its own name",
            )
        names.add(replica.name)
    return None


def validate(snapshot: Snapshot) -> tuple[JobError, ...]:
    """Raise a ClusterError if the nodes are inconsistent; else return the problems of
    the jobs to set aside, in snapshot order (empty when every job is valid)."""
    node_names: set[str] = set()
    for node in snapshot.nodes:
        if node.name in node_names:
            raise DuplicateNodeError(
                node.name,
                f"node {node.name!r} appears twice: the driver must list each node once",
            )
        node_names.add(node.name)
        if node.allocatable.is_negative() or node.used_by_others.is_negative():
            raise NegativeNodeCapacityError(
                node.name,
                f"node {node.name}: allocatable or used capacity is negative: the driver "
                "must report zero or more of each",
            )
    counts: dict[str, int] = {}
    for job in snapshot.jobs:
        counts[job.name] = counts.get(job.name, 0) + 1
    problems: list[JobError] = []
    for job in snapshot.jobs:
        found: JobError | None
        if counts[job.name] > 1:
            found = DuplicateNameError(
                job.name,
                f"job {job.name!r} appears {counts[job.name]} times: every one is set "
                "aside until one name names one job (rename or delete the others)",
            )
        else:
            found = problem_of(job, node_names)
        if found is not None:
            problems.append(found)
    return tuple(problems)


def set_aside(snapshot: Snapshot, problems: tuple[JobError, ...]) -> tuple[Snapshot, list[Job]]:
    """The snapshot without the jobs that ``problems`` name, and those jobs, in snapshot
    order.

    A job set aside keeps its replicas, so what they take stays taken: in the snapshot
    returned, the capacity of its replicas that count toward its size, on nodes of the
    snapshot, is used by others there (its role's resources; none where the role has no
    spec or its resources are negative, which is all the planner can know of them).
    Draining ones are left out, as for every job: their capacity is already counted free
    for whoever they were drained for. Its reservations go with it."""
    names = {p.subject for p in problems}
    taken: dict[str, Resources] = {}
    kept: list[Job] = []
    aside: list[Job] = []
    for job in snapshot.jobs:
        if job.name not in names:
            kept.append(job)
            continue
        aside.append(job)
        for replica in job.replicas:
            spec = job.role_spec(replica.role)
            if replica.draining or spec is None or spec.resources.is_negative():
                continue
            taken[replica.node] = taken.get(replica.node, NO_RESOURCES) + spec.resources
    nodes = tuple(
        replace(node, used_by_others=node.used_by_others + taken[node.name])
        if node.name in taken
        else node
        for node in snapshot.nodes
    )
    left = tuple(r for r in snapshot.reservations if r.job not in names)
    return Snapshot(nodes, tuple(kept), left), aside
