"""Shared helpers of the runtime tests: an in-process coordinator, and real processes
(coordinator and workers) started with the environment contract, stopped by PID only."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from edl_gradients.goodput import BatchLimits, shaping
from trainer_runtime.client import CoordinatorClient
from trainer_runtime.coordinator.serving import CoordinatorServer, CoordinatorService
from trainer_runtime.coordinator.state import ConsumptionMode, CoordinatorState
from trainer_runtime.coordinator.storing import MemoryStore
from trainer_runtime.environment import WorkerContract, trust_environ
from trainer_runtime.protocol.credentials import Issuer, JobCredentials
from trainer_runtime.sharding import DatasetPlan

#: The tests' launcher: one signing key, one job. Tests drive coordinators as the job's
#: controller (``TOKEN``, which may make every call); workers get their own credentials.
CREDENTIALS = JobCredentials(Issuer.generate(), "test-job")
TOKEN = CREDENTIALS.controller()
VERIFIER = CREDENTIALS.verifier()
TRUST = trust_environ(CREDENTIALS)
REPO = Path(__file__).resolve().parents[2]


def waiting_for(
    condition: Callable[[], bool],
    timeout_s: float,
    what: str,
    explain: Callable[[], str] | None = None,
) -> None:
    """Poll `condition` until it holds; at `timeout_s`, fail naming `what`, with what
    `explain` says then (the processes' last lines: all a CI log keeps of a rare stall)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.02)
    said = f"\n{explain()}" if explain is not None else ""
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}{said}")


@pytest.fixture
def coordinator() -> Iterator[CoordinatorServer]:
    """An in-process coordinator in independent mode: 40 samples, shards of 4, 2 epochs."""
    state = CoordinatorState.starting(
        DatasetPlan(40, 4, 2), ConsumptionMode.INDEPENDENT, join_window_s=0.05
    )
    server = CoordinatorServer(CoordinatorService(state, MemoryStore(), VERIFIER)).start()
    yield server
    server.stop(0.1)


@dataclass
class Cluster:
    """Real processes of one job, in a temporary directory; every PID is ours."""

    root: Path
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    port: int = 0

    def environment(
        self,
        worker_id: str,
        extra: dict[str, str] | None = None,
        server: bool = False,
        coordinator: str | None = None,
    ) -> dict[str, str]:
        """The contract's environment of `worker_id` (a parameter server's with ``server``),
        with its own credential, which reaches its coordinator at `coordinator` (a proxy's
        address) or, by default, where it listens."""
        contract = WorkerContract(
            coordinator=coordinator or f"127.0.0.1:{self.port}",
            token=(CREDENTIALS.server if server else CREDENTIALS.worker)(worker_id),
            job_id="test-job",
            worker_id=worker_id,
            node="node-a",
            timeout_s=20.0,
        )
        env = {**os.environ, **TRUST, **contract.to_environ(), **(extra or {})}
        env["PYTHONPATH"] = str(REPO)
        env.setdefault("OMP_NUM_THREADS", "1")
        return env

    def starting_coordinator(
        self, *args: str, extra: dict[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        port_file = self.root / "port"
        port_file.unlink(missing_ok=True)
        arguments = ["--port", str(self.port)] if self.port else []
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "trainer_runtime.coordinator",
                "--state-file",
                str(self.root / "state.json"),
                "--port-file",
                str(port_file),
                *arguments,
                *args,
            ],
            env={**os.environ, **TRUST, **(extra or {}), "PYTHONPATH": str(REPO)},
            stdout=(self.root / "coordinator.log").open("ab"),
            stderr=subprocess.STDOUT,
        )
        self.processes["coordinator"] = process
        waiting_for(port_file.exists, 20.0, "the coordinator to listen")
        waiting_for(lambda: port_file.read_text() != "", 5.0, "the port file")
        self.port = int(port_file.read_text())
        return process

    def starting_worker(
        self,
        worker_id: str,
        argv: list[str],
        extra: dict[str, str] | None = None,
        coordinator: str | None = None,
    ) -> subprocess.Popen[bytes]:
        server = "trainer_runtime.ps" in argv  # what is launched tells its role
        process = subprocess.Popen(
            [sys.executable, *argv],
            env=self.environment(worker_id, extra, server, coordinator),
            stdout=(self.root / f"{worker_id}.log").open("ab"),
            stderr=subprocess.STDOUT,
        )
        self.processes[worker_id] = process
        return process

    def client(self, address: str | None = None) -> CoordinatorClient:
        """A client of the job's coordinator, reached at `address` (a proxy's) or directly."""
        return CoordinatorClient(
            address or f"127.0.0.1:{self.port}", TOKEN, timeout_s=5.0, retry_s=20.0
        )

    def killing(self, name: str) -> None:
        process = self.processes[name]
        os.kill(process.pid, signal.SIGKILL)
        process.wait(timeout=10)

    def terminating(self, name: str) -> None:
        """SIGTERM, what the kubelet sends a pod it deletes or evicts (SIGKILL follows after
        the grace period: the test's own bound on `waiting_exit`)."""
        os.kill(self.processes[name].pid, signal.SIGTERM)

    def waiting_exit(self, name: str, timeout_s: float) -> int:
        try:
            return self.processes[name].wait(timeout=timeout_s)
        except subprocess.TimeoutExpired as error:
            log = (self.root / f"{name}.log").read_text(errors="replace")[-3000:]
            raise AssertionError(f"{name} did not exit within {timeout_s} s:\n{log}") from error

    def log(self, name: str) -> str:
        return (self.root / f"{name}.log").read_text(errors="replace")

    def tails(self, lines: int = 8, width: int = 200) -> str:
        """The last `lines` lines of each process's log, each cut at `width` characters."""
        said = []
        for name in self.processes:
            path = self.root / f"{name}.log"
            text = path.read_text(errors="replace") if path.exists() else ""
            last = [line[:width] for line in text.splitlines() if line.strip()][-lines:]
            code = self.processes[name].poll()
            said.append(f"--- {name} (exit {code}):\n" + "\n".join(last))
        return "\n".join(said)

    def stopping_all(self) -> None:
        for process in self.processes.values():
            if process.poll() is None:
                os.kill(process.pid, signal.SIGKILL)
                process.wait(timeout=10)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    job = Cluster(tmp_path)
    yield job
    job.stopping_all()


def gated(args: list[str], gate: Path) -> list[str]:
    """A newcomer started with the others, that joins once `gate` exists: its imports
    must not decide whether it joins before the job ends (`elastic_job.waiting_for_gate`)."""
    return [*args, "--gate", str(gate)]


#: The global batches `changing_batch` cycles through, with at most 3 samples a rank at once.
BATCH_CYCLE = "6,20,9,14"


def cycle_windows(workers: tuple[int, ...] = (2, 3)) -> frozenset[int]:
    """The windows `BATCH_CYCLE` makes at those world sizes: each batch shaped into whole
    micro-batches of at most 3 (`edl_gradients.goodput.shaping`, as the policy does), so
    20 on 2 workers is 4 micro-batches of 3 each, a window of 24."""
    batches = [int(b) for b in BATCH_CYCLE.split(",")]
    limits = BatchLimits(min(batches), max(batches), max_local=3)
    windows = set()
    for batch in batches:
        for world in workers:
            local, steps = shaping(batch / world, limits)
            windows.add(local * steps * world)
    return frozenset(windows)


def changing_batch(
    cluster: Cluster, worker_args: list[str], coordinator_args: list[str], startup_s: float
) -> list[str]:
    """Run a ledger job whose batch goes through `BATCH_CYCLE` (`elastic_job.cycling`),
    through a join 2 -> 3, a SIGKILL 3 -> 2 and a coordinator restart, each a few steps
    after the last; the survivors, once they exited 0. The coordinator was started by the
    caller with a join window that waits for `set_target`'s workers; `coordinator_args`
    start its replacement."""
    client = cluster.client()
    client.set_target(2)

    def advancing(by: int) -> None:
        target = int(client.progress().committed_step) + by
        waiting_for(
            lambda: client.progress().committed_step >= target,
            90,
            f"step {target}",
            cluster.tails,
        )

    def members() -> list[str]:
        return [m.worker_id for m in client.progress().members]

    args = [*worker_args, "--batch-cycle", BATCH_CYCLE, "--max-local", "3"]
    # The target closes the join window, it does not cap the generation: a third worker
    # that registered with the first two would be in the first generation, so it waits.
    gate = cluster.root / "w2-joins"
    for name in ("w0", "w1"):
        cluster.starting_worker(name, args)
    cluster.starting_worker("w2", gated(args, gate))
    waiting_for(lambda: len(members()) == 2, startup_s, "two workers")
    advancing(6)
    client.set_target(3)  # 2 -> 3
    gate.touch()
    waiting_for(lambda: len(members()) == 3, 90, "a third to join")
    advancing(6)
    killed = members()[1]
    cluster.killing(killed)  # 3 -> 2
    advancing(6)
    assert not client.progress().finished, "the restart should land mid-job"
    cluster.killing("coordinator")
    time.sleep(0.5)
    cluster.starting_coordinator(*coordinator_args)
    survivors = [name for name in ("w0", "w1", "w2") if name != killed]
    for name in survivors:
        assert cluster.waiting_exit(name, 120) == 0, cluster.log(name)[-3000:]
    return survivors
