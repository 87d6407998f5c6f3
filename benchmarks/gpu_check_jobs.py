"""The GPU check's jobs: our coordinator and worker processes, started and stopped by PID.

`gpu_nccl_check.py` drives the checks; this module holds what they share: the job (a
coordinator and workers, each a process of this project started with the runtime's
environment contract), the helpers that wait, find a port and make NCCL take a process for
a host of its own, and the script a worker process runs (`SCRIPT`, with a hidden `--role`).

What must stay true: every process a job starts is its own, and is stopped by its PID when
the job ends; every wait is bounded.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from trainer_runtime.environment import trust_environ  # noqa: E402
from trainer_runtime.protocol.credentials import Issuer, JobCredentials  # noqa: E402

#: The script each worker process runs (`--role ledger|overhead|pair`).
SCRIPT = REPO / "benchmarks" / "gpu_nccl_check.py"
CREDENTIALS = JobCredentials(Issuer.generate(), "gpu-check")
ERROR_HANDLING = "TORCH_NCCL_ASYNC_ERROR_HANDLING"
WORKER_TIMEOUT_S = 8.0  # EDL_TIMEOUT_S of the ledger workers: every bounded wait


def python_path() -> str:
    return os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)


def waiting_for(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.02)
    raise TimeoutError(f"timed out after {timeout_s} s waiting for {what}")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def separate_hosts(name: str) -> dict[str, str]:
    """Environment that makes NCCL take this process for a host of its own."""
    return {"NCCL_HOSTID": f"edl-check-{name}", "NCCL_SOCKET_IFNAME": "lo", "NCCL_IB_DISABLE": "1"}


class Job:
    """One job: our coordinator and worker processes, every PID ours, stopped by PID."""

    def __init__(
        self, root: Path, device: str, mode: str, samples: int, epochs: int, window_s: float
    ) -> None:
        self.root, self.device, self.mode = root, device, mode
        self.processes: dict[str, subprocess.Popen[bytes]] = {}
        port_file = root / "port"
        self.processes["coordinator"] = subprocess.Popen(
            [sys.executable, "-m", "trainer_runtime.coordinator", "--port-file", str(port_file),
             "--samples", str(samples), "--shard-size", "10", "--epochs", str(epochs),
             "--join-window-s", str(window_s), "--lease-timeout-s", "15"],
            env={**os.environ, **trust_environ(CREDENTIALS), "PYTHONPATH": python_path()},
            stdout=(root / "coordinator.log").open("ab"), stderr=subprocess.STDOUT,
        )  # fmt: skip
        waiting_for(lambda: port_file.exists() and port_file.read_text() != "", 60, "coordinator")
        self.address = f"127.0.0.1:{int(port_file.read_text())}"
        from trainer_runtime.client import CoordinatorClient

        self.client = CoordinatorClient(
            self.address, CREDENTIALS.controller(), timeout_s=5.0, retry_s=20.0
        )

    def contract(self, worker: str) -> Any:
        from trainer_runtime.environment import WorkerContract

        return WorkerContract(
            self.address,
            CREDENTIALS.worker(worker),
            "gpu-check",
            worker,
            f"node-{worker}",
            timeout_s=WORKER_TIMEOUT_S,
        )

    def starting(self, worker: str, argv: list[str]) -> None:
        env = {**os.environ, **self.contract(worker).to_environ(), "PYTHONPATH": python_path()}
        if self.mode == "hosts":
            env.update(separate_hosts(worker))
        self.processes[worker] = subprocess.Popen(
            [sys.executable, str(SCRIPT), *argv],
            env=env,
            stdout=(self.root / f"{worker}.log").open("ab"),
            stderr=subprocess.STDOUT,
        )

    def members(self) -> list[str]:
        return [m.worker_id for m in self.client.progress().members]

    def step(self) -> int:
        return int(self.client.progress().committed_step)

    def advancing(self, by: int) -> None:
        target = self.step() + by
        waiting_for(lambda: self.step() >= target, 120, f"committed step {target}")

    def exit_code(self, worker: str, timeout_s: float) -> int:
        try:
            return self.processes[worker].wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return -999

    def log(self, worker: str) -> str:
        return (self.root / f"{worker}.log").read_text(errors="replace")[-2000:]

    def stopping(self) -> None:
        self.client.close()
        for process in self.processes.values():
            if process.poll() is None:
                os.kill(process.pid, signal.SIGKILL)
                process.wait(timeout=10)


@contextmanager
def running_job(
    logs: Path, device: str, mode: str, samples: int, epochs: int, window_s: float = 0.3
) -> Iterator[Job]:
    """A job whose folder (logs, traces) is made under `logs` and kept; its processes are
    stopped on the way out."""
    folder = tempfile.mkdtemp(prefix="job-", dir=logs)
    job = Job(Path(folder), device, mode, samples, epochs, window_s)
    try:
        yield job
    finally:
        job.stopping()
