"""Starting, reaching and stopping a local job's processes: its coordinator, its workers
and a ``ps`` job's parameter servers.

The cycle (``controlling.LocalCluster``) decides what runs; this module does it over the
process supervisor and keeps what that needs: the coordinator clients, the slot bookkeeping
and the log tails that explain an exit.

What must stay true:
- A worker is started only on slots no other worker of any job holds (``free_slots`` reads
  the store, which outlives the service), so a slot never runs two workers.
- A job has at most one coordinator process: ``ensure_coordinator`` starts one only when
  none runs (a coordinator that exited after the last epoch is left alone).
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from edl_scheduler.core import Role
from edl_scheduler.local.config import LocalConfig, coordinator_name
from edl_scheduler.local.launching import (
    JobFiles,
    coordinator_process,
    job_files,
    server_process,
    slots_per_worker,
    submission_id,
    worker_process,
)
from edl_scheduler.local.processes import (
    ProcessSpec,
    ProcessState,
    ProcessStatus,
    ProcessSupervisor,
    UnknownProcess,
)
from edl_scheduler.local.storing import JobRow, Store, WorkerRow
from trainer_runtime.protocol.credentials import Issuer, JobCredentials

KILL_GRACE_S = 5.0
"""After a drain's deadline or a stop request: SIGTERM, then SIGKILL this much later."""

LOG_TAIL_BYTES = 2048
LOG_TAIL_CHARS = 300


def credentials_of(row: JobRow) -> JobCredentials:
    """The job's credentials: a signing key derived from the random secret its row keeps
    (``state.db``, the owner's only), so the service has no other key to keep; each
    submission's secret is new, so a job submitted again refuses its predecessor's
    processes."""
    return JobCredentials(Issuer.from_secret(row.token), row.key)


class Spawner:
    """The local cluster's hands on processes; holds no job state of its own but clients."""

    def __init__(self, config: LocalConfig, store: Store, supervisor: ProcessSupervisor) -> None:
        self.config = config
        self.store = store
        self.supervisor = supervisor
        self._clients: dict[str, Any] = {}

    def files(self, row: JobRow) -> JobFiles:
        """What this submission of the job keeps on disk (``launching.job_files``)."""
        return job_files(self.config.state_dir, row.job, submission_id(row.token))

    # -- reading processes ---------------------------------------------------------------

    def state(self, name: str) -> tuple[ProcessStatus, str] | None:
        """The process's status and, once it has ended, its log's last line (or None)."""
        try:
            status = self.supervisor.status(name)
        except UnknownProcess:
            return None
        tail = ""
        if status.state.finished:
            tail = last_line(self.config.log_dir / f"{name}.log")
        return status, tail

    def coordinator_succeeded(self, key: str) -> bool:
        name = coordinator_name(key)
        return name in self.supervisor and (
            self.supervisor.status(name).state is ProcessState.SUCCEEDED
        )

    # -- the coordinator -----------------------------------------------------------------

    @staticmethod
    def coordinator_up(row: JobRow) -> bool:
        """Whether the coordinator's port accepts connections (cheap; avoids RPC retries)."""
        try:
            with socket.create_connection(("127.0.0.1", row.port), timeout=0.2):
                return True
        except OSError:
            return False

    def client(self, row: JobRow) -> Any:
        """The job's coordinator client, made once and kept until the job goes."""
        client = self._clients.get(row.key)
        if client is None:
            from trainer_runtime.client import CoordinatorClient

            client = CoordinatorClient(
                f"127.0.0.1:{row.port}",
                credentials_of(row).controller(),
                timeout_s=2.0,
                retry_s=1.0,
            )
            self._clients[row.key] = client
        return client

    def drop_client(self, key: str) -> None:
        client = self._clients.pop(key, None)
        if client is not None:
            client.close()

    def close_clients(self) -> None:
        for client in self._clients.values():
            client.close()
        self._clients.clear()

    def ensure_coordinator(self, row: JobRow) -> str | None:
        """Start the job's coordinator unless one runs; the start's failure, if it failed."""
        name = coordinator_name(row.key)
        if name in self.supervisor:
            state = self.supervisor.status(name).state
            if state is ProcessState.RUNNING or state is ProcessState.SUCCEEDED:
                return None
            self.supervisor.forget(name)
        spec = coordinator_process(
            row.job,
            name,
            row.port,
            credentials_of(row),
            self.files(row).state_file,
            self.config.log_dir,
        )
        status = self.supervisor.start(spec)
        self.store.set_coordinator(row.key, status.pid, status.create_time)
        return status.message if status.state is ProcessState.FAILED else None

    # -- workers -------------------------------------------------------------------------

    def free_slots(self) -> list[int]:
        used = {s for w in self.store.workers() for s in w.slots}
        return [s for s in range(self.config.slots) if s not in used]

    def start_worker(self, row: JobRow, now: float) -> WorkerRow:
        """Start one worker of the job on the first free slots and record it in the store."""
        slots = tuple(self.free_slots()[: slots_per_worker(row.job)])
        index = self.store.take_worker_index(row.key)
        name = f"{row.key.replace('/', '.')}.worker-{index}"
        spec = worker_process(
            row.job,
            name,
            slots,
            row.port,
            credentials_of(row),
            row.workdir,
            self.config.log_dir,
            self.config.gpus,
            self.files(row),
        )
        return self._started(row, spec, slots, now, Role.WORKER)

    def start_server(self, row: JobRow, now: float) -> WorkerRow:
        """Start one parameter server of a ``ps`` job (it holds no slot) and record it."""
        index = self.store.take_worker_index(row.key)
        name = f"{row.key.replace('/', '.')}.pserver-{index}"
        spec = server_process(
            row.job,
            name,
            row.port,
            credentials_of(row),
            row.workdir,
            self.config.log_dir,
            self.files(row),
        )
        return self._started(row, spec, (), now, Role.PSERVER)

    def _started(
        self, row: JobRow, spec: ProcessSpec, slots: tuple[int, ...], now: float, role: Role
    ) -> WorkerRow:
        if spec.name in self.supervisor:
            self.supervisor.forget(spec.name)
        status = self.supervisor.start(spec)
        replica = WorkerRow(
            spec.name, row.key, status.pid, status.create_time, slots, now, False, None, role
        )
        self.store.add_worker(replica)
        return replica

    def enforce_drain_deadline(self, row: JobRow, worker: WorkerRow, now: float) -> None:
        """A drain that overran ``timeouts.drainSeconds``: SIGTERM, then SIGKILL after the grace."""
        if not worker.draining or worker.drain_since is None:
            return
        overdue = now - worker.drain_since - row.job.spec.timeouts.drain_seconds
        if overdue > KILL_GRACE_S:
            self.supervisor.signal(worker.name, 9)
        elif overdue > 0:
            self.supervisor.signal(worker.name, 15)

    # -- stopping ------------------------------------------------------------------------

    def stop_in_background(self, names: list[str], thread_name: str) -> None:
        """SIGTERM the named processes now; wait out their grace on a thread of its own."""
        for name in names:
            if name in self.supervisor:
                self.supervisor.signal(name, 15)
        threading.Thread(
            target=self._stop_all, args=(names,), name=thread_name, daemon=True
        ).start()

    def _stop_all(self, names: Iterable[str]) -> None:
        for name in names:
            if name in self.supervisor:
                self.supervisor.stop(name, grace_s=KILL_GRACE_S)
                self.supervisor.forget(name)

    def release_all(self) -> None:
        """Let every process go without stopping it (a restarted service adopts them)."""
        for name in self.supervisor.names():
            self.supervisor.release(name)
        self.close_clients()


def last_line(path: Path) -> str:
    """The last line of a log, cut short: the reason a process gave for its exit."""
    try:
        with path.open("rb") as f:
            f.seek(0, 2)
            size = f.tell()
            f.seek(max(0, size - LOG_TAIL_BYTES))
            lines = f.read().decode(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return lines[-1][:LOG_TAIL_CHARS] if lines else ""
