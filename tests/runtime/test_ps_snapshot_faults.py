"""A parameter server whose snapshots cannot be written (a full disk).

Aspects tested:
- a snapshot write that fails once is tried again and lands;
- one that keeps failing marks the writer failed, and later snapshots are not written (the
  server is about to be replaced: the job rolls back to its last complete snapshot);
- a real server process under a file size limit (RLIMIT_FSIZE) stops with exit 5 and says
  why, rather than serve on without the snapshot the job would roll back to.
"""

from __future__ import annotations

import resource
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from trainer_runtime.ps.serving import SnapshotWriter
from trainer_runtime.ps.snapshots import SnapshotDirectory

from .harness import Cluster, waiting_for
from .test_ps_elastic import coordinator_args, job_args, server_args


class FullDisk(SnapshotDirectory):
    """A snapshot directory whose next ``fail`` writes raise, as on a full disk."""

    def __init__(self, root: Path, fail: int) -> None:
        super().__init__(root)
        self.fail = fail

    def writing(self, *args: object, **kwargs: object) -> None:
        if self.fail > 0:
            self.fail -= 1
            raise OSError(28, "No space left on device")
        super().writing(*args, **kwargs)  # type: ignore[arg-type]


def _state(step: int) -> tuple[int, int, int, np.ndarray, np.ndarray, int]:
    zeros = np.zeros(4, dtype=np.float32)
    return (step, 0, 4, zeros, zeros.copy(), 4)


def test_a_snapshot_that_fails_once_is_written_again(tmp_path: Path) -> None:
    writer = SnapshotWriter(FullDisk(tmp_path, fail=1))
    writer.enqueue(*_state(5))
    writer.flushing()
    assert not writer.failed.is_set()
    assert (tmp_path / "step-000000000005" / "0-4.npy").exists()


def test_a_snapshot_that_keeps_failing_marks_the_writer_failed(tmp_path: Path) -> None:
    directory = FullDisk(tmp_path, fail=10**6)
    writer = SnapshotWriter(directory)
    writer.enqueue(*_state(5))
    writer.flushing()
    assert writer.failed.is_set() and isinstance(writer.failure, OSError)
    directory.fail = 0  # the disk has room again, but the server is on its way out
    writer.enqueue(*_state(10))
    writer.flushing()
    assert not any(tmp_path.iterdir())


@pytest.mark.slow
def test_a_server_that_cannot_snapshot_exits_5(cluster: Cluster) -> None:
    samples = 600
    cluster.starting_coordinator(*coordinator_args(samples, 2))
    cluster.starting_worker("ps0", server_args(cluster))
    cluster.starting_worker("w0", job_args(cluster, "ledger", samples, global_batch="6"))

    def limited() -> None:  # its partition's snapshot (> 2 KB) does not fit
        resource.setrlimit(resource.RLIMIT_FSIZE, (1024, 1024))

    crippled = subprocess.Popen(
        [sys.executable, *server_args(cluster)],
        env=cluster.environment("ps1", server=True),
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, preexec_fn=limited,
    )  # fmt: skip
    try:
        assert crippled.wait(120) == 5
        assert crippled.stderr is not None
        said = crippled.stderr.read()
    except subprocess.TimeoutExpired:
        raise AssertionError(f"ps1 did not stop: {cluster.log('w0')[-2000:]}") from None
    finally:
        if crippled.poll() is None:  # ours: stopped by its PID
            crippled.kill()
            crippled.wait(10)
    assert "a snapshot could not be written" in said and "Traceback" not in said, said
    waiting_for(lambda: "ps1" not in [m.worker_id for m in cluster.client().progress().servers],
                30, "ps1 to be gone from the job")  # fmt: skip
