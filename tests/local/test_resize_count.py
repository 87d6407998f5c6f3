"""The local backend tells the planner how often a job's size changed (``Job.resizes``).

Aspects: the count is the job's recorded resizes and preemptions; its start (from 0 workers)
is not one; a job with none has 0. No process is started: the snapshot is built from the
store alone.
"""

from __future__ import annotations

from pathlib import Path

from edl_scheduler.api import load_training_job
from edl_scheduler.local.config import build_config
from edl_scheduler.local.controlling import LocalCluster
from edl_scheduler.local.processes import ProcessSupervisor
from edl_scheduler.local.storing import ResizeRow, Store

from .jobs import plain_job


def test_the_snapshot_counts_recorded_resizes_but_not_the_start(tmp_path: Path) -> None:
    home = tmp_path / "home"
    store = Store(home / "state.db")
    supervisor = ProcessSupervisor()
    try:
        cluster = LocalCluster(build_config(home, 4, None), store, supervisor)
        keys = []
        for name in ("moved", "quiet"):
            job = load_training_job(plain_job(name, 1, 4))
            cluster.submit(job, str(home))
            keys.append(job.key)
        moved, quiet = keys
        for before, after in ((0, 2), (2, 4), (4, 1), (1, 0)):  # start, grow, shrink, preempt
            store.add_resize(ResizeRow(moved, 1.0, before, after, "test"))
        store.add_resize(ResizeRow(quiet, 1.0, 0, 1, "test"))
        snapshot = cluster._snapshot(store.jobs())
        assert {j.name: j.resizes for j in snapshot.jobs} == {moved: 3, quiet: 0}
    finally:
        supervisor.close(grace_s=1)
        store.close()
