"""Step 2 of the local cluster's cycle: what the planner sees of the local machine, and the
reservations it keeps between cycles.

The local cluster is one node, ``local``, of ``slots`` GPUs (or CPU slots): a worker takes
``slots_per_worker`` of them, a ``ps`` job's parameter server none (it is a CPU process
beside the workers). Each job is what ``core.building.job_from_training_job`` makes of its
TrainingJob, with no placement rules (there is one node) and the efficiency its status
measured.

What must stay true: the snapshot is built from the store alone (processes the service
adopted after a restart count like the ones it started), and a reservation outlives a
restart of the service (it is saved in the store's meta table).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import replace

from edl_scheduler.core import Job, Node, Replica, Reservation, Resources, Role, RoleSpec, Snapshot
from edl_scheduler.core.building import job_from_training_job
from edl_scheduler.core.snapshot import NO_CONSTRAINTS
from edl_scheduler.local.launching import LOCAL_NODE, slots_per_worker
from edl_scheduler.local.statusing import planned_efficiency
from edl_scheduler.local.storing import JobRow, Store

_RESERVATIONS = "reservations"


def local_snapshot(
    rows: Iterable[JobRow], store: Store, slots: int, reservations: Iterable[Reservation]
) -> Snapshot:
    """The planner's view of the unfinished jobs ``rows`` on a machine of ``slots``; the
    reservations kept are those of jobs still planned."""
    node = Node(LOCAL_NODE, Resources(slots, 0, 0))
    jobs: list[Job] = []
    for row in rows:
        replicas = tuple(
            Replica(w.name, w.role, LOCAL_NODE, w.draining) for w in store.replicas(row.key)
        )
        last = row.job.status.last_resize
        planned = job_from_training_job(
            row.job,
            row.job.spec.priority or 0,
            replicas,
            last.time.timestamp() if last else None,
        )
        worker, server = planned.worker, planned.pserver
        jobs.append(
            replace(
                planned,
                worker=RoleSpec(
                    worker.min_replicas,
                    worker.max_replicas,
                    Resources(slots_per_worker(row.job), 0, 0),
                ),
                pserver=(
                    RoleSpec(server.min_replicas, server.max_replicas, Resources())
                    if server is not None
                    else None
                ),
                constraints=NO_CONSTRAINTS,
                efficiency=planned_efficiency(row.job.status),
                # Resizes and preemptions recorded (a start is from 0 workers).
                resizes=sum(1 for r in store.resizes(row.key) if r.from_replicas > 0),
            )
        )
    keys = {j.name for j in jobs}
    kept = tuple(r for r in reservations if r.job in keys)
    return Snapshot((node,), tuple(jobs), kept)


def save_reservations(store: Store, reservations: Iterable[Reservation]) -> None:
    """Keep the planner's reservations in the store, for the next cycle or service."""
    rows = [
        {
            "job": r.job,
            "node": r.node,
            "role": r.role.value,
            "count": r.count,
            "expires_at": r.expires_at,
        }
        for r in reservations
    ]
    store.set_meta(_RESERVATIONS, json.dumps(rows))


def load_reservations(store: Store) -> tuple[Reservation, ...]:
    """The reservations a cycle saved (none in a fresh store)."""
    saved = store.get_meta(_RESERVATIONS)
    if not saved:
        return ()
    return tuple(
        Reservation(r["job"], r["node"], Role(r["role"]), r["count"], r["expires_at"])
        for r in json.loads(saved)
    )
