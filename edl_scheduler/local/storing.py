"""The local backend's memory: jobs, their processes, events and resizes, in SQLite.

Why SQLite: the local service must survive its own restart without losing a job or a
running worker (it adopts them again by pid and start time), and a single-file embedded
database gives atomic writes without a server; the standard library's ``sqlite3`` is enough.

What must stay true:
- Every change a request or a cycle makes is committed before it is reported, so a crash
  between two cycles loses at most the observations of one cycle, never a submitted job.
- A job's TrainingJob (spec and status) is stored whole, as the API's JSON, and read back
  through the API's loader, so the local backend and Kubernetes hold the same document.
- One connection, one lock: the HTTP handlers and the control loop share this object.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edl_scheduler.api import TrainingJob, load_training_job
from edl_scheduler.core import Role

#: Whether a process is a worker or a ``ps`` job's parameter server (``core.Role``); a store
#: written before servers ran locally gains it when opened.
_ROLE_COLUMN = "role TEXT NOT NULL DEFAULT 'worker'"

_SCHEMA = f"""
CREATE TABLE IF NOT EXISTS jobs (
    key TEXT PRIMARY KEY,
    manifest TEXT NOT NULL,
    token TEXT NOT NULL,
    workdir TEXT NOT NULL,
    port INTEGER NOT NULL,
    coordinator_pid INTEGER,
    coordinator_ctime REAL,
    next_worker INTEGER NOT NULL DEFAULT 0,
    target INTEGER NOT NULL DEFAULT 0,
    created REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS workers (
    name TEXT PRIMARY KEY,
    job TEXT NOT NULL,
    pid INTEGER,
    ctime REAL,
    slots TEXT NOT NULL,
    started REAL NOT NULL,
    draining INTEGER NOT NULL DEFAULT 0,
    drain_since REAL,
    {_ROLE_COLUMN}
);
CREATE TABLE IF NOT EXISTS events (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    job TEXT NOT NULL,
    time REAL NOT NULL,
    type TEXT NOT NULL,
    reason TEXT NOT NULL,
    message TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS resizes (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    job TEXT NOT NULL,
    time REAL NOT NULL,
    from_replicas INTEGER NOT NULL,
    to_replicas INTEGER NOT NULL,
    reason TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS meta (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
"""


@dataclass(frozen=True, slots=True)
class JobRow:
    """A job and what the local backend keeps beside its TrainingJob."""

    key: str
    job: TrainingJob
    token: str
    workdir: str
    port: int
    coordinator_pid: int | None
    coordinator_ctime: float | None
    next_worker: int
    target: int
    created: float


@dataclass(frozen=True, slots=True)
class WorkerRow:
    """One process of a job the planner places: a worker, or a ``ps`` job's parameter
    server (``role``); ``slots`` are the slot (GPU) indices it holds (a server holds none)."""

    name: str
    job: str
    pid: int | None
    ctime: float | None
    slots: tuple[int, ...]
    started: float
    draining: bool
    drain_since: float | None
    role: Role = Role.WORKER


@dataclass(frozen=True, slots=True)
class EventRow:
    job: str
    time: float
    type: str
    reason: str
    message: str


@dataclass(frozen=True, slots=True)
class ResizeRow:
    job: str
    time: float
    from_replicas: int
    to_replicas: int
    reason: str


class Store:
    """The SQLite file under the service's home; thread-safe."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._lock = threading.RLock()
        self._db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(_SCHEMA)
        columns = {r[1] for r in self._db.execute("PRAGMA table_info(workers)")}
        if "role" not in columns:
            self._db.execute(f"ALTER TABLE workers ADD COLUMN {_ROLE_COLUMN}")

    def close(self) -> None:
        with self._lock:
            self._db.close()

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """All writes inside commit together, or not at all."""
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    # -- jobs ------------------------------------------------------------------------------

    def add_job(self, row: JobRow) -> None:
        with self.transaction() as db:
            db.execute(
                "INSERT INTO jobs VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    row.key,
                    json.dumps(row.job.to_dict()),
                    row.token,
                    row.workdir,
                    row.port,
                    row.coordinator_pid,
                    row.coordinator_ctime,
                    row.next_worker,
                    row.target,
                    row.created,
                ),
            )

    def save_job(self, key: str, job: TrainingJob) -> None:
        with self.transaction() as db:
            db.execute(
                "UPDATE jobs SET manifest = ? WHERE key = ?", (json.dumps(job.to_dict()), key)
            )

    def set_coordinator(self, key: str, pid: int | None, ctime: float | None) -> None:
        with self.transaction() as db:
            db.execute(
                "UPDATE jobs SET coordinator_pid = ?, coordinator_ctime = ? WHERE key = ?",
                (pid, ctime, key),
            )

    def set_target(self, key: str, target: int) -> None:
        with self.transaction() as db:
            db.execute("UPDATE jobs SET target = ? WHERE key = ?", (target, key))

    def take_worker_index(self, key: str) -> int:
        """A fresh worker index for the job (names are never reused within a job)."""
        with self.transaction() as db:
            (index,) = db.execute("SELECT next_worker FROM jobs WHERE key = ?", (key,)).fetchone()
            db.execute("UPDATE jobs SET next_worker = ? WHERE key = ?", (index + 1, key))
            return int(index)

    def delete_job(self, key: str) -> None:
        with self.transaction() as db:
            for table, column in (("jobs", "key"), ("workers", "job"), ("events", "job")):
                db.execute(f"DELETE FROM {table} WHERE {column} = ?", (key,))
            db.execute("DELETE FROM resizes WHERE job = ?", (key,))

    def job(self, key: str) -> JobRow | None:
        with self._lock:
            found = self._db.execute("SELECT * FROM jobs WHERE key = ?", (key,)).fetchone()
        return _job_row(found) if found else None

    def jobs(self) -> list[JobRow]:
        with self._lock:
            rows = self._db.execute("SELECT * FROM jobs ORDER BY created, key").fetchall()
        return [_job_row(r) for r in rows]

    # -- workers ---------------------------------------------------------------------------

    def add_worker(self, row: WorkerRow) -> None:
        with self.transaction() as db:
            db.execute(
                "INSERT OR REPLACE INTO workers VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    row.name,
                    row.job,
                    row.pid,
                    row.ctime,
                    ",".join(str(s) for s in row.slots),
                    row.started,
                    int(row.draining),
                    row.drain_since,
                    row.role.value,
                ),
            )

    def mark_draining(self, name: str, since: float) -> None:
        with self.transaction() as db:
            db.execute(
                "UPDATE workers SET draining = 1, drain_since = ? WHERE name = ?", (since, name)
            )

    def remove_worker(self, name: str) -> None:
        with self.transaction() as db:
            db.execute("DELETE FROM workers WHERE name = ?", (name,))

    def workers(self, job: str | None = None) -> list[WorkerRow]:
        """The workers (of ``job``, or of every job), oldest first."""
        return [r for r in self.replicas(job) if r.role is Role.WORKER]

    def servers(self, job: str) -> list[WorkerRow]:
        """The parameter servers of a ``ps`` job, oldest first."""
        return [r for r in self.replicas(job) if r.role is Role.PSERVER]

    def replicas(self, job: str | None = None) -> list[WorkerRow]:
        """Every process the planner placed (of ``job``, or of every job): workers and
        parameter servers, oldest first."""
        with self._lock:
            if job is None:
                rows = self._db.execute("SELECT * FROM workers ORDER BY started, name")
            else:
                rows = self._db.execute(
                    "SELECT * FROM workers WHERE job = ? ORDER BY started, name", (job,)
                )
            found = rows.fetchall()
        return [_worker_row(r) for r in found]

    # -- history ---------------------------------------------------------------------------

    def add_event(self, event: EventRow) -> None:
        with self.transaction() as db:
            db.execute(
                "INSERT INTO events (job, time, type, reason, message) VALUES (?, ?, ?, ?, ?)",
                (event.job, event.time, event.type, event.reason, event.message),
            )

    def events(self, job: str) -> list[EventRow]:
        with self._lock:
            rows = self._db.execute(
                "SELECT job, time, type, reason, message FROM events WHERE job = ? ORDER BY id",
                (job,),
            ).fetchall()
        return [EventRow(*r) for r in rows]

    def add_resize(self, resize: ResizeRow) -> None:
        with self.transaction() as db:
            db.execute(
                "INSERT INTO resizes (job, time, from_replicas, to_replicas, reason) "
                "VALUES (?, ?, ?, ?, ?)",
                (resize.job, resize.time, resize.from_replicas, resize.to_replicas, resize.reason),
            )

    def resizes(self, job: str) -> list[ResizeRow]:
        with self._lock:
            rows = self._db.execute(
                "SELECT job, time, from_replicas, to_replicas, reason FROM resizes "
                "WHERE job = ? ORDER BY id",
                (job,),
            ).fetchall()
        return [ResizeRow(*r) for r in rows]

    # -- meta ------------------------------------------------------------------------------

    def get_meta(self, key: str) -> str | None:
        with self._lock:
            found = self._db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return str(found[0]) if found else None

    def set_meta(self, key: str, value: str) -> None:
        with self.transaction() as db:
            db.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (key, value))


def _job_row(r: Any) -> JobRow:
    key, manifest, token, workdir, port, pid, ctime, next_worker, target, created = r
    return JobRow(
        key=str(key),
        job=load_training_job(json.loads(str(manifest))),
        token=str(token),
        workdir=str(workdir),
        port=int(port),
        coordinator_pid=int(pid) if pid is not None else None,
        coordinator_ctime=float(ctime) if ctime is not None else None,
        next_worker=int(next_worker),
        target=int(target),
        created=float(created),
    )


def _worker_row(r: Any) -> WorkerRow:
    name, job, pid, ctime, slots, started, draining, drain_since, role = r
    return WorkerRow(
        name=str(name),
        job=str(job),
        pid=int(pid) if pid is not None else None,
        ctime=float(ctime) if ctime is not None else None,
        slots=tuple(int(s) for s in str(slots).split(",") if s),
        started=float(started),
        draining=bool(draining),
        drain_since=float(drain_since) if drain_since is not None else None,
        role=Role(role),
    )
