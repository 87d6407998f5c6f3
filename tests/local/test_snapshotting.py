"""What the local backend tells the planner (`snapshotting.local_snapshot`): how often a job's
size changed (``Job.resizes``), and a ``ps`` job's servers.

Aspects: the count is the job's recorded resizes and preemptions; its start (from 0 workers)
is not one; a job with none has 0. A ``ps`` job's servers are replicas of role pserver that
ask for nothing (a worker asks for its slots). A store written before servers ran locally
(no role column) opens, its processes read as workers. No process is started: the snapshot
is built from the store alone.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from edl_scheduler.api import load_training_job
from edl_scheduler.core import Resources, Role
from edl_scheduler.local.config import build_config
from edl_scheduler.local.controlling import LocalCluster
from edl_scheduler.local.processes import ProcessSupervisor
from edl_scheduler.local.snapshotting import local_snapshot
from edl_scheduler.local.storing import ResizeRow, Store, WorkerRow

from .jobs import as_ps, plain_job


@pytest.fixture
def local(tmp_path: Path) -> Iterator[tuple[LocalCluster, Store]]:
    """A local cluster of 4 slots whose jobs are submitted but never run (no cycle)."""
    home = tmp_path / "home"
    store = Store(home / "state.db")
    supervisor = ProcessSupervisor()
    try:
        yield LocalCluster(build_config(home, 4, None), store, supervisor), store
    finally:
        supervisor.close(grace_s=1)
        store.close()


def submitted(cluster: LocalCluster, text: str) -> str:
    job = load_training_job(text)
    cluster.submit(job, str(cluster.config.home))
    return job.key


def test_the_snapshot_counts_recorded_resizes_but_not_the_start(
    local: tuple[LocalCluster, Store],
) -> None:
    cluster, store = local
    moved, quiet = (submitted(cluster, plain_job(name, 1, 4)) for name in ("moved", "quiet"))
    for before, after in ((0, 2), (2, 4), (4, 1), (1, 0)):  # start, grow, shrink, preempt
        store.add_resize(ResizeRow(moved, 1.0, before, after, "test"))
    store.add_resize(ResizeRow(quiet, 1.0, 0, 1, "test"))
    snapshot = local_snapshot(store.jobs(), store, 4, ())
    assert {j.name: j.resizes for j in snapshot.jobs} == {moved: 3, quiet: 0}


def test_a_ps_jobs_servers_hold_no_slot(local: tuple[LocalCluster, Store]) -> None:
    cluster, store = local
    key = submitted(cluster, as_ps(plain_job("ps", 1, 2, gpus=2), servers=(2, 3)))
    store.add_worker(WorkerRow("s0", key, 1, 1.0, (), 1.0, False, None, Role.PSERVER))
    store.add_worker(WorkerRow("w0", key, 2, 1.0, (0, 1), 1.0, False, None))
    (planned,) = local_snapshot(store.jobs(), store, 4, ()).jobs
    assert planned.pserver is not None and planned.pserver.resources == Resources()
    assert (planned.pserver.min_replicas, planned.pserver.max_replicas) == (2, 3)
    assert planned.worker.resources == Resources(2, 0, 0)
    assert {r.name: r.role for r in planned.replicas} == {"s0": Role.PSERVER, "w0": Role.WORKER}
    assert [w.name for w in store.workers(key)] == ["w0"]
    assert [s.name for s in store.servers(key)] == ["s0"]


def test_a_store_without_roles_opens_with_its_processes_as_workers(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    old = sqlite3.connect(str(path))
    old.executescript(
        "CREATE TABLE workers (name TEXT PRIMARY KEY, job TEXT NOT NULL, pid INTEGER, "
        "ctime REAL, slots TEXT NOT NULL, started REAL NOT NULL, "
        "draining INTEGER NOT NULL DEFAULT 0, drain_since REAL);"
        "INSERT INTO workers VALUES ('w0', 'default/j', 7, 1.5, '0,1', 2.0, 0, NULL);"
    )
    old.commit()
    old.close()
    store = Store(path)
    try:
        assert store.replicas() == [
            WorkerRow("w0", "default/j", 7, 1.5, (0, 1), 2.0, False, None, Role.WORKER)
        ]
        store.add_worker(WorkerRow("s0", "default/j", 8, 1.5, (), 3.0, False, None, Role.PSERVER))
        assert [s.name for s in store.servers("default/j")] == ["s0"]
    finally:
        store.close()
