"""Step 1 of the local cluster's cycle: what happens to a job's processes that exit.

``controlling.LocalCluster`` runs the cycle; this module observes the processes of one job
at a time and handles those that ended (workers, and a ``ps`` job's parameter servers
alike): a drained one leaves, one that exited 0 undrained says the job is done, a failed
one is charged to the job's restart budget
(``failurePolicy.maxRestarts``; past it the job fails), a drain that overran its deadline is
ended, a coordinator that exited after the last epoch makes its job Succeeded and one that
crashed is restarted from its state file, charged to the same budget.

What must stay true: a worker or coordinator is charged only when the job is to blame (not
when it exits after the last epoch was committed, nor when it was adopted after a service
restart and its exit code is unknown); a job's final status is written once, with an Event;
nothing here decides what runs (that is the planner's, in ``controlling``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace

from edl_scheduler.api import JobPhase
from edl_scheduler.core import Role
from edl_scheduler.local.config import LocalConfig, coordinator_name
from edl_scheduler.local.processes import ProcessState, ProcessStatus, ProcessSupervisor
from edl_scheduler.local.spawning import Spawner
from edl_scheduler.local.statusing import final_status
from edl_scheduler.local.storing import JobRow, Store, WorkerRow

#: Records an Event of a job: (job key, "Normal" or "Warning", reason, message).
EventSink = Callable[[str, str, str, str], None]


class Exits:
    """Observes one job's processes each cycle and handles those that exited. ``finished``
    holds the jobs one of whose workers exited 0 undrained (the runtime says the job is
    done); ``finishing(row)`` says whether the job's coordinator has committed its last
    epoch; ``ensure_coordinator(row)`` starts a job's coordinator again."""

    def __init__(
        self,
        config: LocalConfig,
        store: Store,
        supervisor: ProcessSupervisor,
        spawner: Spawner,
        event: EventSink,
        finishing: Callable[[JobRow], bool],
        ensure_coordinator: Callable[[JobRow], None],
        clock: Callable[[], float],
    ) -> None:
        self.config = config
        self.store = store
        self.supervisor = supervisor
        self.spawner = spawner
        self.event = event
        self.finishing = finishing
        self.ensure_coordinator = ensure_coordinator
        self.clock = clock
        self.finished: set[str] = set()

    def observe(self, row: JobRow, now: float) -> None:
        """Step 1 of the cycle for one job (see the module docstring)."""
        key = row.key
        coordinator = self.spawner.state(coordinator_name(key))
        for replica in self.store.replicas(key):
            state = self.spawner.state(replica.name)
            if state is None:
                self.store.remove_worker(replica.name)
                continue
            status, log_tail = state
            if status.running:
                self.spawner.enforce_drain_deadline(row, replica, now)
                continue
            self.store.remove_worker(replica.name)
            self.supervisor.forget(replica.name)
            self.ended(row, replica, status, log_tail)
        row = self.store.job(key) or row
        if row.job.status.phase.final or coordinator is None:
            return
        status, log_tail = coordinator
        if status.running:
            return
        if status.state is ProcessState.SUCCEEDED or (
            status.state is ProcessState.EXITED and self.ledger_finished(row)
        ):
            self.finished.add(key)
            if not self.store.replicas(key):
                self.supervisor.forget(coordinator_name(key))
                self.finish(row, JobPhase.SUCCEEDED, "the last epoch is committed", now)
            return
        self.supervisor.forget(coordinator_name(key))
        self.store.set_coordinator(key, None, None)
        if status.state is ProcessState.EXITED or self.ledger_finished(row):
            # Adopted after a service restart (how it ended is unknown), or failed after the
            # last epoch was committed (restarted to tell the workers): not the job's fault.
            code = "unknown" if status.exit_code is None else str(status.exit_code)
            self.event(
                key,
                "Warning",
                "CoordinatorExited",
                f"coordinator exited ({code}); it restarts from its state file, not charged "
                f"to the restart budget. {log_tail}".strip(),
            )
        else:
            # Charged like a worker: one that keeps failing would otherwise restart forever.
            why = _why(status.exit_code, status.message)
            detail = f"coordinator failed ({why}); it restarts from its state file"
            row = self.charge(
                row, "CoordinatorFailed", detail + (f": {log_tail}" if log_tail else "")
            )
            if row.job.status.phase.final:
                return
        self.ensure_coordinator(row)

    def ended(self, row: JobRow, replica: WorkerRow, status: ProcessStatus, tail: str) -> None:
        """A worker or parameter server that exited: a drained one left; one that exited 0
        undrained says the job is done (a server exits 0 undrained only then); one that
        failed is charged, unless the job had finished or its exit code is unknown."""
        key, name = row.key, replica.name
        what = "Server" if replica.role is Role.PSERVER else "Worker"
        if replica.draining:
            self.event(key, "Normal", "Drained", f"{name} left the job")
        elif status.state is ProcessState.SUCCEEDED:
            self.finished.add(key)
            self.event(key, "Normal", f"{what}Finished", f"{name} exited 0")
        elif status.state is ProcessState.EXITED:
            # Adopted after a service restart: its exit code is unknown. The
            # coordinator's saved ledger tells whether the job had finished.
            if self.ledger_finished(row):
                self.finished.add(key)
                self.event(key, "Normal", f"{what}Finished", f"{name} exited")
            else:
                self.event(
                    key,
                    "Warning",
                    f"{what}Lost",
                    f"{name} exited while adopted (exit code unknown); it is replaced "
                    "without charging the restart budget",
                )
        elif self.finishing(row) or self.ledger_finished(row):
            self.event(
                key,
                "Warning",
                f"{what}ExitedAtFinish",
                f"{name} exited with {status.exit_code} after the last epoch was committed; "
                f"not charged to the restart budget. {tail}".strip(),
            )
        else:
            detail = f"{name} failed ({_why(status.exit_code, status.message)})"
            self.charge(row, f"{what}Failed", detail + (f": {tail}" if tail else ""))

    def ledger_finished(self, row: JobRow) -> bool:
        """Whether the coordinator's saved state has committed the last epoch."""
        from trainer_runtime.coordinator.state import CoordinatorState

        try:
            text = self.spawner.files(row).state_file.read_text(encoding="utf-8")
            return bool(CoordinatorState.from_json(text, now=time.monotonic()).ledger.finished)
        except (OSError, ValueError, KeyError):
            return False

    def charge(self, row: JobRow, reason: str, detail: str) -> JobRow:
        """One failure the job caused (a worker's or its coordinator's) against its restart
        budget, with a Warning Event; past the budget the job fails. Returns the job's row
        as saved."""
        restarts = row.job.status.restarts + 1
        budget = row.job.spec.failure_policy.max_restarts
        self.event(row.key, "Warning", reason, f"{detail} [{restarts}/{budget}]")
        status = row.job.status.model_copy(update={"restarts": restarts})
        row = replace(row, job=row.job.model_copy(update={"status": status}))
        self.store.save_job(row.key, row.job)
        if restarts > budget:
            self.finish(
                row,
                JobPhase.FAILED,
                f"{restarts} failures exceed failurePolicy.maxRestarts ({budget}); last: {detail}",
                self.clock(),
            )
        return self.store.job(row.key) or row

    def finish(self, row: JobRow, phase: JobPhase, message: str, now: float) -> None:
        """The job ends in ``phase``: its workers are stopped (a failed job's coordinator
        too; a succeeded one has exited), its final status and an Event written."""
        names = [w.name for w in self.store.replicas(row.key)]
        if phase is JobPhase.FAILED:
            names.append(coordinator_name(row.key))
        for worker in self.store.replicas(row.key):
            self.store.remove_worker(worker.name)
        if names:
            self.spawner.stop_in_background(names, f"edl-finish-{row.key}")
        status = final_status(row.job.status, phase, message, now)
        self.store.save_job(row.key, row.job.model_copy(update={"status": status}))
        self.store.set_coordinator(row.key, None, None)
        kind = "Normal" if phase is JobPhase.SUCCEEDED else "Warning"
        self.event(row.key, kind, phase.value, message)


def _why(code: int | None, message: str) -> str:
    why = f"exit code {code}" if code is not None else "exit code unknown"
    return f"{why}, {message}" if message else why
