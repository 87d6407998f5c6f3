"""The local cluster: the controller's observe-plan-act loop over local processes.

Each cycle, in this order:

1. Observe the processes: drained workers that exited leave; a worker that failed is
   charged to its job's restart budget (``failurePolicy.maxRestarts``) and the planner
   replaces it; a drain that overran ``timeouts.drainSeconds`` is ended by SIGTERM, then
   SIGKILL; a coordinator that exited after the last epoch makes its job Succeeded, one that
   crashed is restarted from its state file.
2. Build the planner's Snapshot (``snapshotting``): one node, ``local``, of ``slots``
   GPUs; each job as ``core.building.job_from_training_job`` makes it, a worker taking its
   slots, a parameter server none.
3. ``plan(snapshot, policy, now)``: the same planner as on Kubernetes.
4. Act: victims are drained through the coordinator (``CoordinatorClient.drain``), so they
   leave at a step boundary and survivors keep their processes; new workers (and a ``ps``
   job's servers, first) start with the runtime's environment contract; the coordinator
   learns the target (``set_target``). A suspended ``ps`` job's servers stop once its
   workers have left (their snapshots keep the model).
   A job the planner set aside (its state is one it cannot accept) is left as it is, with
   a Warning Event that names the problem and the fix; the others are planned as usual.
5. Write each job's status (phase, message, replicas, progress, throughput), its Events
   and its resize history to SQLite.

Processes are started, reached and stopped through ``spawning.Spawner``; step 1 is
``exiting.Exits``; the status a cycle writes is computed by the pure functions of
``statusing``.

What must stay true:
- Requests (submit, scale, ...) and cycles take one lock, so a cycle acts on one state.
- Nothing in a request can stop the service: bad input raises ``LocalError`` with the field
  and the fix, and the store is unchanged.
- A restarted service adopts every process that still runs (``recover``), so no job and no
  worker is lost by restarting the service.
"""

from __future__ import annotations

import enum
import logging
import secrets
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from edl_scheduler.api import JobPhase, TrainingJob, TrainingJobError, load_training_job
from edl_scheduler.core import (
    Plan,
    Reason,
    Reservation,
    plan,
)
from edl_scheduler.local.config import LocalConfig, coordinator_name
from edl_scheduler.local.exiting import Exits
from edl_scheduler.local.launching import (
    LaunchError,
    check_launchable,
    free_port,
    legacy_files,
    slots_per_worker,
)
from edl_scheduler.local.logs import LogNotFound, find_log, log_names
from edl_scheduler.local.processes import AdoptionError, ProcessSupervisor
from edl_scheduler.local.snapshotting import (
    load_reservations,
    local_snapshot,
    save_reservations,
)
from edl_scheduler.local.spawning import Spawner
from edl_scheduler.local.statusing import (
    RESIZE_EVENTS,
    at,
    observed_status,
    resized_status,
)
from edl_scheduler.local.storing import EventRow, JobRow, ResizeRow, Store

LOG = logging.getLogger("edl.local")


class ErrorKind(enum.Enum):
    """What went wrong with a request; the endpoint maps it to an HTTP status."""

    INVALID = 422
    NOT_FOUND = 404
    CONFLICT = 409


class LocalError(Exception):
    """A request the local cluster refuses; ``str()`` names the problem and the fix."""

    def __init__(self, kind: ErrorKind, message: str) -> None:
        super().__init__(message)
        self.kind = kind


class LocalCluster:
    """The local backend's controller: requests, recovery, and the planning cycle."""

    def __init__(
        self,
        config: LocalConfig,
        store: Store,
        supervisor: ProcessSupervisor,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.config = config
        self.store = store
        self.supervisor = supervisor
        self.clock = clock
        self.lock = threading.RLock()
        self.reservations: tuple[Reservation, ...] = ()
        self.last_plan: Plan | None = None
        self.spawner = Spawner(config, store, supervisor)
        self._progress: dict[str, Any] = {}
        self.exits = Exits(
            config,
            store,
            supervisor,
            self.spawner,
            self._event,
            self._finishing,
            self._ensure_coordinator,
            clock,
        )
        self._last_cycle = clock()
        #: Job -> the message of the SetAside decision last told in an Event.
        self._aside: dict[str, str] = {}
        config.log_dir.mkdir(parents=True, exist_ok=True)
        config.state_dir.mkdir(parents=True, exist_ok=True)

    # -- requests --------------------------------------------------------------------------

    def submit(self, job: TrainingJob, workdir: str) -> TrainingJob:
        """Accept a new job, or refuse it (bad spec, name taken) without changing anything."""
        try:
            check_launchable(job, self.config.slots)
        except LaunchError as error:
            raise LocalError(ErrorKind.INVALID, str(error)) from None
        with self.lock:
            if self.store.job(job.key) is not None:
                raise LocalError(
                    ErrorKind.CONFLICT,
                    f"job {job.key} already exists: delete it first, or use another metadata.name",
                )
            for path in legacy_files(self.config.state_dir, job):  # a predecessor's, never ours
                if path.is_dir():
                    shutil.rmtree(path, ignore_errors=True)
                else:
                    path.unlink(missing_ok=True)
            now = self.clock()
            status = job.status.model_copy(
                update={
                    "phase": JobPhase.PENDING,
                    "submit_time": at(now),
                    "message": "submitted",
                    "priority": job.spec.priority or 0,
                }
            )
            meta = job.metadata.model_copy(update={"creation_timestamp": at(now)})
            job = job.model_copy(update={"status": status, "metadata": meta})
            row = JobRow(
                key=job.key,
                job=job,
                token=secrets.token_hex(16),
                workdir=workdir,
                port=free_port(),
                coordinator_pid=None,
                coordinator_ctime=None,
                next_worker=0,
                target=0,
                created=now,
            )
            self.store.add_job(row)
            self._event(job.key, "Normal", "Submitted", "accepted by the local backend")
            return job

    def get(self, key: str) -> JobRow:
        row = self.store.job(key)
        if row is None:
            known = ", ".join(r.key for r in self.store.jobs()) or "none"
            raise LocalError(
                ErrorKind.NOT_FOUND,
                f"job {key} does not exist (known jobs: {known}): check the name with `edlctl ls`",
            )
        return row

    def scale(self, key: str, min_replicas: int | None, max_replicas: int | None) -> TrainingJob:
        """Change a job's bounds; the next cycle resizes it."""
        with self.lock:
            row = self.get(key)
            spec = row.job.spec
            lo = spec.min_replicas if min_replicas is None else min_replicas
            hi = spec.max_replicas if max_replicas is None else max_replicas
            if lo < 1:
                raise LocalError(ErrorKind.INVALID, f"min: {lo} is below 1: give at least 1")
            if hi < lo:
                raise LocalError(
                    ErrorKind.INVALID,
                    f"max: {hi} is below min ({lo}): raise max or lower min",
                )
            changed = row.job.model_copy(
                update={"spec": spec.model_copy(update={"min_replicas": lo, "max_replicas": hi})}
            )
            try:  # validated as a submission is (model_copy checks nothing)
                updated = load_training_job(changed.to_dict())
            except TrainingJobError as error:
                raise LocalError(ErrorKind.INVALID, str(error).replace("\n", " ")) from None
            try:
                check_launchable(updated, self.config.slots)
            except LaunchError as error:
                raise LocalError(ErrorKind.INVALID, str(error)) from None
            self._require_not_final(row)
            self.store.save_job(key, updated)
            self._event(key, "Normal", "Scaled", f"bounds set to min {lo}, max {hi}")
            return updated

    def set_suspended(self, key: str, suspend: bool) -> TrainingJob:
        with self.lock:
            row = self.get(key)
            self._require_not_final(row)
            spec = row.job.spec.model_copy(update={"suspend": suspend})
            updated = row.job.model_copy(update={"spec": spec})
            self.store.save_job(key, updated)
            what = "Suspended" if suspend else "Resumed"
            self._event(key, "Normal", what, f"{what.lower()} by the user")
            return updated

    def delete(self, key: str) -> None:
        """Stop the job's processes (SIGTERM, SIGKILL after the grace) and forget it."""
        with self.lock:
            row = self.get(key)
            names = [w.name for w in self.store.replicas(key)] + [coordinator_name(key)]
            self.store.delete_job(key)
            self.spawner.drop_client(key)
            self._progress.pop(key, None)
            self._aside.pop(key, None)
            self.exits.finished.discard(key)  # a job submitted again under its name runs
            self.spawner.stop_in_background(names, f"edl-delete-{row.key}")

    def _require_not_final(self, row: JobRow) -> None:
        if row.job.status.phase.final:
            raise LocalError(
                ErrorKind.CONFLICT,
                f"job {row.key} has ended ({row.job.status.phase.value}): submit it again "
                "to rerun it",
            )

    def log_names(self, key: str) -> list[str]:
        """The short names of the job's logs kept on disk (``logs.log_names``)."""
        self.get(key)
        return log_names(self.config.log_dir, key)

    def log_path(self, key: str, worker: str | None) -> Path:
        """The log of ``worker`` of job ``key`` (``logs.find_log``)."""
        row = self.get(key)
        progress = self._progress.get(row.key)
        members = getattr(progress, "members", None) or ()
        ranks = {str(m.worker_id): int(getattr(m, "rank", 0)) for m in members}
        live = [w.name for w in self.store.workers(key) if not w.draining]
        try:
            return find_log(self.config.log_dir, key, worker, ranks, live)
        except LogNotFound as error:
            raise LocalError(ErrorKind.NOT_FOUND, str(error)) from None

    # -- recovery --------------------------------------------------------------------------

    def recover(self) -> None:
        """Adopt the processes an earlier service left running; forget those that ended."""
        with self.lock:
            for row in self.store.jobs():
                if row.coordinator_pid is not None and row.coordinator_ctime is not None:
                    try:
                        self.supervisor.adopt(
                            coordinator_name(row.key), row.coordinator_pid, row.coordinator_ctime
                        )
                    except AdoptionError as error:
                        self._event(row.key, "Warning", "CoordinatorLost", str(error))
                        self.store.set_coordinator(row.key, None, None)
                for worker in self.store.replicas(row.key):
                    if worker.pid is None or worker.ctime is None:
                        self.store.remove_worker(worker.name)
                        continue
                    try:
                        self.supervisor.adopt(worker.name, worker.pid, worker.ctime)
                    except AdoptionError as error:
                        self.store.remove_worker(worker.name)
                        self._event(row.key, "Warning", "WorkerLost", str(error))
            self.reservations = load_reservations(self.store)

    # -- the cycle -------------------------------------------------------------------------

    def cycle(self) -> Plan:
        """One observe-plan-act round (see the module docstring)."""
        with self.lock:
            now = self.clock()
            elapsed = max(0.0, now - self._last_cycle)
            self._last_cycle = now
            rows = [r for r in self.store.jobs() if not r.job.status.phase.final]
            for row in rows:
                self.exits.observe(row, now)
            rows = [r for r in self.store.jobs() if not r.job.status.phase.final]
            snapshot = local_snapshot(rows, self.store, self.config.slots, self.reservations)
            result = plan(snapshot, self.config.policy, now)
            self.reservations = result.reservations
            save_reservations(self.store, self.reservations)
            aside: dict[str, str] = {}
            for decision in result.decisions:
                found = self.store.job(decision.job)
                if found is None:
                    continue
                if decision.reason is Reason.SET_ASIDE:
                    aside[decision.job] = decision.message
                    if self._aside.get(decision.job) != decision.message:  # once, not per cycle
                        self._event(decision.job, "Warning", "SetAside", decision.message)
                    if self.store.replicas(found.key):  # kept as it is, its coordinator too
                        self._ensure_coordinator(found)
                    continue  # nothing is started or drained
                self._act(found, decision, now)
            self._aside = aside
            for row in self.store.jobs():
                if not row.job.status.phase.final:
                    self._write_status(row, result, now, elapsed)
            self.last_plan = result
            return result

    # 4. act --------------------------------------------------------------------------------

    def _act(self, row: JobRow, decision: Any, now: float) -> None:
        if self._finishing(row):
            return  # its workers leave on their own; nothing is started or drained
        change = decision.workers
        servers = decision.pservers
        remove = list(change.remove)
        if row.job.spec.suspend:
            # The planner gives a suspended job no new workers; taking its running ones away
            # is the driver's part (as the Kubernetes controller deletes its pods).
            remove += [w.name for w in self.store.workers(row.key) if not w.draining]
            remove = list(dict.fromkeys(remove))
            change = replace(change, target=0)
        if remove:
            self._drain(row, remove, now)
        if servers is not None and servers.remove and not row.job.spec.suspend:
            self._drain(row, list(servers.remove), now)  # the leader moves their partitions
        if row.job.spec.suspend and not self.store.workers(row.key):
            # Its servers serve the draining workers to their last step, then stop: no
            # leader is left to move their partitions, and the snapshots keep the model.
            for server in self.store.servers(row.key):
                if not server.draining:
                    self.store.mark_draining(server.name, now)
                    self.spawner.stop_in_background([server.name], f"edl-stop-{server.name}")
        if change.add_nodes or self.store.replicas(row.key):
            self._ensure_coordinator(row)
            row = self.store.job(row.key) or row
        if servers is not None and not row.job.spec.suspend:
            for _ in servers.add_nodes:  # before the workers, which wait for them
                self._start_server(row, now)
        started = 0
        if change.add_nodes:
            need = slots_per_worker(row.job) * len(change.add_nodes)
            if len(self.spawner.free_slots()) >= need:
                for _ in change.add_nodes:
                    self._start_worker(row, now)
                started = len(change.add_nodes)
            # else: the victims are still draining; the planner holds their slots for this
            # job (a reservation) and plans the start again once they have left.
        if change.target != row.target and self.spawner.coordinator_up(row):
            try:
                self.spawner.client(row).set_target(change.target)
                self.store.set_target(row.key, change.target)
            except Exception:  # told again next cycle
                pass
        if remove and row.job.spec.suspend:
            self._record_resize(row, decision, now, len(remove), 0, "suspended by its spec")
        elif remove or started:
            self._record_resize(row, decision, now)

    def _drain(self, row: JobRow, names: list[str], now: float) -> None:
        """Victims leave through the coordinator, at a step boundary (a server once its
        partitions moved); one that overruns its drain deadline is stopped (``exiting``)."""
        client = self.spawner.client(row) if self.spawner.coordinator_up(row) else None
        for name in names:
            self.store.mark_draining(name, now)
            if client is None:
                continue  # the drain deadline ends it
            try:
                client.drain(name)
            except Exception as error:  # the drain deadline ends it anyway
                self._event(row.key, "Warning", "DrainFailed", f"{name}: {error}")

    def _finishing(self, row: JobRow) -> bool:
        """The coordinator has committed the last epoch (or exited after it)."""
        if row.key in self.exits.finished:
            return True
        progress = self._progress.get(row.key)
        if progress is not None and progress.finished:
            return True
        return self.spawner.coordinator_succeeded(row.key)

    def _ensure_coordinator(self, row: JobRow) -> None:
        failure = self.spawner.ensure_coordinator(row)
        if failure is not None:
            self._event(row.key, "Warning", "CoordinatorFailed", failure)

    def _start_worker(self, row: JobRow, now: float) -> None:
        worker = self.spawner.start_worker(row, now)
        where = f"{worker.name} (pid {worker.pid}) on {worker.slots}"
        self._event(row.key, "Normal", "WorkerStarted", where)

    def _start_server(self, row: JobRow, now: float) -> None:
        server = self.spawner.start_server(row, now)
        self._event(row.key, "Normal", "ServerStarted", f"{server.name} (pid {server.pid})")

    def _record_resize(
        self,
        row: JobRow,
        decision: Any,
        now: float,
        before: int | None = None,
        after: int | None = None,
        message: str | None = None,
    ) -> None:
        change = decision.workers
        before = change.current if before is None else before
        after = change.target if after is None else after
        message = decision.message if message is None else message
        reason = f"{decision.reason.value}: {message}"
        self.store.add_resize(ResizeRow(row.key, now, before, after, reason))
        what = RESIZE_EVENTS.get(decision.action, "Resized")
        if row.job.spec.suspend:
            what = "Suspending"
        self._event(row.key, "Normal", what, f"{before} -> {after} workers: {message}")
        current = self.store.job(row.key) or row
        status = resized_status(current.job.status, now, before, after, reason)
        self.store.save_job(row.key, current.job.model_copy(update={"status": status}))

    # 5. status -----------------------------------------------------------------------------

    def _write_status(self, row: JobRow, result: Plan, now: float, elapsed: float) -> None:
        progress = self._poll_progress(row) if self.spawner.coordinator_up(row) else None
        try:
            message = result.decision(row.key).message
        except KeyError:
            message = row.job.status.message
        current = self.store.job(row.key) or row
        new = observed_status(
            current.job.status,
            suspend=row.job.spec.suspend,
            workers=self.store.workers(row.key),
            progress=progress,
            message=message,
            finishing=self._finishing(row),
            elapsed=elapsed,
            servers=sum(1 for s in self.store.servers(row.key) if not s.draining),
        )
        if new != current.job.status:
            if new.phase is not current.job.status.phase:
                self._event(row.key, "Normal", new.phase.value, new.message)
            self.store.save_job(row.key, current.job.model_copy(update={"status": new}))

    def _poll_progress(self, row: JobRow) -> Any:
        try:
            progress = self.spawner.client(row).progress()
        except Exception:  # not up yet, or restarting: keep the last one
            return self._progress.get(row.key)
        self._progress[row.key] = progress
        return progress

    def progress(self, key: str) -> Any:
        return self._progress.get(key)

    # -- events ----------------------------------------------------------------------------

    def _event(self, key: str, kind: str, reason: str, message: str) -> None:
        LOG.info("%s %s %s: %s", key, kind, reason, message)
        self.store.add_event(EventRow(key, self.clock(), kind, reason, message))

    # -- shutdown --------------------------------------------------------------------------

    def release_all(self) -> None:
        """Let every process go without stopping it (a restart adopts them again)."""
        with self.lock:
            self.spawner.release_all()
