"""The shard ledger under real processes, with the framework-free worker.

Aspects (one scripted run, checked by the workers' own ledger files, not by the
coordinator's count):
- every sample is trained exactly once per epoch through a graceful drain (the victim exits
  0), a SIGKILL (its leases go back to todo), two joins, and a coordinator SIGKILLed and
  restarted from its state file mid-epoch;
- survivors keep their PIDs (no worker restarts);
- throughput reaches the coordinator's progress;
- a worker that arrives after the last commit exits 0 (finished);
- a worker with an incomplete environment fails clearly at start.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from trainer_runtime.plain_worker import EXIT_UNREACHABLE

from .harness import Cluster, waiting_for
from .ledger_files import checking_exactly_once

SAMPLES, SHARD, EPOCHS = 3000, 10, 2
WORKER = ["-m", "trainer_runtime.plain_worker", "--step-time-s", "0.03"]


@pytest.mark.slow
def test_ledger_is_exact_through_drain_kill_join_and_coordinator_restart(
    cluster: Cluster,
) -> None:
    coordinator_args = [
        "--samples", str(SAMPLES), "--shard-size", str(SHARD), "--epochs", str(EPOCHS),
        "--mode", "independent", "--join-window-s", "0.1", "--lease-timeout-s", "10",
    ]  # fmt: skip
    cluster.starting_coordinator(*coordinator_args)

    def worker(name: str) -> None:
        ledger = cluster.root / f"{name}.ledger"
        cluster.starting_worker(name, [*WORKER, "--ledger-file", str(ledger)])

    for name in ("w0", "w1", "w2"):
        worker(name)
    client = cluster.client()

    def done_at_least(samples: int) -> bool:
        return bool(client.progress().samples_done >= samples)

    def members() -> set[str]:
        return {m.worker_id for m in client.progress().members}

    waiting_for(lambda: members() == {"w0", "w1", "w2"}, 60, "three workers")
    waiting_for(lambda: done_at_least(200), 60, "first samples")
    survivor_pid = cluster.processes["w0"].pid
    client.drain("w1")
    assert cluster.waiting_exit("w1", 20) == 0
    waiting_for(lambda: done_at_least(400), 60, "training after the drain")
    cluster.killing("w2")
    worker("w3")
    worker("w4")
    waiting_for(
        lambda: {"w3", "w4"} <= members(),
        30,
        "two joiners",
    )
    waiting_for(lambda: done_at_least(SAMPLES + 300), 60, "the second epoch")
    cluster.killing("coordinator")
    cluster.starting_coordinator(*coordinator_args)
    waiting_for(lambda: client.progress().finished, 90, "the job to finish")
    progress = client.progress()
    assert progress.samples_done == SAMPLES * EPOCHS
    assert any(t.samples_per_s > 0 for t in progress.throughput)
    for name in ("w0", "w3", "w4"):
        assert cluster.waiting_exit(name, 30) == 0, cluster.log(name)
    assert cluster.processes["w0"].pid == survivor_pid
    assert (cluster.root / "w4.ledger").read_text(), "the joiner trained nothing"
    checking_exactly_once(cluster.root, SAMPLES, EPOCHS)


def test_worker_arriving_after_the_last_commit_exits_0(cluster: Cluster) -> None:
    """A controller may start a grown or replacement worker just as the job ends: it must
    exit 0 (finished), not fail and be charged to the job's restart budget."""
    cluster.starting_coordinator(
        "--samples", "200", "--shard-size", "10", "--epochs", "1",
        "--mode", "independent", "--join-window-s", "0.1",
    )  # fmt: skip
    cluster.starting_worker("w0", [*WORKER])
    client = cluster.client()
    waiting_for(lambda: client.progress().finished, 60, "the job to finish")
    assert cluster.waiting_exit("w0", 30) == 0, cluster.log("w0")
    cluster.starting_worker("late", [*WORKER])
    assert cluster.waiting_exit("late", 30) == 0, cluster.log("late")
    assert "late: finished" in cluster.log("late")
    assert client.progress().samples_done == 200


def test_worker_without_contract_fails_clearly(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "trainer_runtime.plain_worker"],
        env={"PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert result.returncode == 2
    assert "EDL_COORDINATOR" in result.stderr


def test_worker_with_unreachable_coordinator_exits_with_its_code_and_says_why() -> None:
    env = {
        "PATH": "/usr/bin:/bin",
        "EDL_COORDINATOR": "127.0.0.1:9",  # discard port: nothing listens
        "EDL_JOB_TOKEN": "t",
        "EDL_JOB_ID": "j",
        "EDL_WORKER_ID": "w0",
        "EDL_TIMEOUT_S": "2",
    }
    result = subprocess.run(
        [sys.executable, "-m", "trainer_runtime.plain_worker"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert result.returncode == EXIT_UNREACHABLE, result.stderr
    assert "w0 stops" in result.stderr and "Traceback" not in result.stderr
