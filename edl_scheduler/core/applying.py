"""``apply_plan``: the state a plan leads to, as a driver that carries it out would see it.

The simulator advances with it and the tests use it to check idempotence (invariant 6):
victims leave at once (a graceful drain that has completed), new replicas appear on their
planned nodes with fresh names, and sizes changes stamp ``last_resize_time``. The plan's
reservations become the next snapshot's.
"""

from __future__ import annotations

from dataclasses import replace

from edl_scheduler.core.plan import Action, JobDecision, Plan
from edl_scheduler.core.snapshot import Job, Replica, Role, Snapshot


def _new_names(job: Job, role: Role, count: int, taken: set[str]) -> list[str]:
    names: list[str] = []
    i = len(job.replicas)
    while len(names) < count:
        name = f"{job.name}-{role.value}-{i}"
        if name not in taken:
            names.append(name)
            taken.add(name)
        i += 1
    return names


def _apply_to_job(job: Job, decision: JobDecision, now: float) -> Job:
    if not decision.changed:
        return job
    replicas = list(job.replicas)
    taken = {r.name for r in replicas}
    for change in (decision.workers, decision.pservers):
        if change is None:
            continue
        gone = set(change.remove)
        replicas = [r for r in replicas if r.name not in gone]
        names = _new_names(job, change.role, len(change.add_nodes), taken)
        replicas += [
            Replica(n, change.role, node) for n, node in zip(names, change.add_nodes, strict=True)
        ]
    start_time = job.start_time
    if decision.action is Action.START:
        start_time = now
    elif decision.action is Action.SUSPEND:
        start_time = None
    return replace(job, replicas=tuple(replicas), start_time=start_time, last_resize_time=now)


def apply_plan(snapshot: Snapshot, plan: Plan) -> Snapshot:
    by_job = {d.job: d for d in plan.decisions}
    jobs = tuple(
        _apply_to_job(job, by_job[job.name], plan.now) if job.name in by_job else job
        for job in snapshot.jobs
    )
    return Snapshot(nodes=snapshot.nodes, jobs=jobs, reservations=plan.reservations)
