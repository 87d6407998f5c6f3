"""Supervise local processes: start, watch, stop and adopt them by name.

The local backend runs every worker and coordinator as a process on this machine, and the
Kubernetes test suite's kubelet in miniature runs pods the same way; both use this one
supervisor so that the hard parts (process groups, grace periods, reaping, pid reuse) are
written once.

What must stay true:

- Every process starts in its own session, hence its own process group whose id is its pid.
  Stopping signals the whole group, so a worker's helpers (data loaders, shells) go with it,
  and a process survives the death of the supervisor that started it (it can be adopted).
- A child is reaped only after the rest of its group has been killed. While the leader is an
  unreaped zombie its pid, and so its group id, cannot be reused, so a signal to the group
  never reaches a stranger.
- An adopted process (started by an earlier supervisor, found again by pid) is recognised by
  its pid *and* its start time, so a recycled pid is never mistaken for it. Its exit code
  cannot be known (it is not our child): it ends in ``EXITED``.
- Every public method is thread-safe; waiting (grace periods) never holds the lock, so one
  thread stopping a process does not block another from reading statuses.

The state diagram of one process::

    start() ──> RUNNING ──exit 0──────────────> SUCCEEDED
                   │ ────exit != 0 or signal──> FAILED
    adopt() ──> RUNNING ──gone────────────────> EXITED   (exit code unknown)
    start() that cannot exec ─────────────────> FAILED   (exit code 126/127, message says why)
"""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from types import TracebackType
from typing import IO

import psutil

from edl_scheduler.local.process_types import (
    AdoptionError,
    ProcessAlreadyRunning,
    ProcessSpec,
    ProcessState,
    ProcessStatus,
    UnknownProcess,
)

__all__ = [
    "DEFAULT_GRACE_S",
    "AdoptionError",
    "ProcessAlreadyRunning",
    "ProcessSpec",
    "ProcessState",
    "ProcessStatus",
    "ProcessSupervisor",
    "UnknownProcess",
]

DEFAULT_GRACE_S = 10.0
"""How long a stopped process may take to exit after SIGTERM before it gets SIGKILL."""

_POLL_INTERVAL_S = 0.02
_CREATE_TIME_TOLERANCE_S = 0.05
"""Start times come from clock ticks (1/100 s); a recycled pid starts far later than that."""

_EXIT_NOT_EXECUTABLE = 126
_EXIT_NOT_FOUND = 127


@dataclass(slots=True)
class _Entry:
    spec: ProcessSpec | None
    status: ProcessStatus
    popen: subprocess.Popen[bytes] | None = None
    handle: psutil.Process | None = None
    """For adopted processes: psutil remembers the start time and checks it on every call."""


class ProcessSupervisor:
    """Starts, watches and stops named local processes; safe to share between threads.

    Use it as a context manager, or call :meth:`close`, so that no process outlives it by
    accident. A process that should outlive it (the local backend's workers across a service
    restart) is let go with :meth:`release` first.
    """

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._entries: dict[str, _Entry] = {}
        self._released: list[subprocess.Popen[bytes]] = []
        """Children let go by release(): still reaped here, never reported or stopped."""
        self._closed = False

    # -- starting ------------------------------------------------------------------------

    def start(self, spec: ProcessSpec) -> ProcessStatus:
        """Start ``spec`` in a new session and process group; return its first status.

        A command that cannot be executed (missing, not executable) does not raise: it is
        recorded as FAILED with exit code 127 or 126 and the reason in ``message`` and in the
        log, exactly as a shell would report it, so callers handle one kind of failure.
        """
        with self._lock:
            self._check_open()
            self._refresh_locked(spec.name)
            old = self._entries.get(spec.name)
            if old is not None and old.status.running:
                raise ProcessAlreadyRunning(
                    f"process {spec.name!r} is still running (pid {old.status.pid}): "
                    "stop it before starting it again, or use another name"
                )
            entry = self._spawn(spec)
            self._entries[spec.name] = entry
            return entry.status

    def _spawn(self, spec: ProcessSpec) -> _Entry:
        env = {**os.environ, **spec.env} if spec.inherit_env else dict(spec.env)
        log = self._open_log(spec)
        started = time.time()
        try:
            popen = subprocess.Popen(
                spec.argv,
                env=env,
                cwd=spec.cwd,
                stdin=subprocess.DEVNULL,
                stdout=log if log is not None else subprocess.DEVNULL,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                close_fds=True,
            )
        except OSError as error:
            code = _EXIT_NOT_FOUND if _is_not_found(error) else _EXIT_NOT_EXECUTABLE
            message = f"cannot run {spec.argv[0]!r}: {error.strerror or error}"
            if spec.cwd is not None and not Path(spec.cwd).is_dir():
                message = f"working directory {str(spec.cwd)!r} does not exist"
            if log is not None:
                log.write(f"[edl] {message}\n".encode())
            status = ProcessStatus(
                name=spec.name,
                pid=None,
                state=ProcessState.FAILED,
                exit_code=code,
                started_at=started,
                finished_at=time.time(),
                create_time=None,
                message=message,
            )
            return _Entry(spec=spec, status=status)
        finally:
            if log is not None:
                log.close()
        try:
            create_time: float | None = psutil.Process(popen.pid).create_time()
        except psutil.Error:  # exited and reaped already: impossible for an unreaped child
            create_time = None
        status = ProcessStatus(
            name=spec.name,
            pid=popen.pid,
            state=ProcessState.RUNNING,
            exit_code=None,
            started_at=started,
            finished_at=None,
            create_time=create_time,
        )
        return _Entry(spec=spec, status=status, popen=popen)

    @staticmethod
    def _open_log(spec: ProcessSpec) -> IO[bytes] | None:
        if spec.log_path is None:
            return None
        path = Path(spec.log_path)
        path.parent.mkdir(parents=True, exist_ok=True)
        return path.open("ab", buffering=0)

    # -- adopting ------------------------------------------------------------------------

    def adopt(self, name: str, pid: int, create_time: float) -> ProcessStatus:
        """Supervise a process that an earlier supervisor started (e.g. before a restart).

        ``create_time`` is the one its status reported when it was started; a process with
        that pid but another start time is a stranger that reused the pid, and is refused
        with :class:`AdoptionError`, as is a pid that no longer exists. The caller decides
        what a vanished process means (usually: it ended while nobody watched).
        """
        with self._lock:
            self._check_open()
            self._refresh_locked(name)
            old = self._entries.get(name)
            if old is not None and old.status.running:
                raise ProcessAlreadyRunning(
                    f"process {name!r} is already supervised and running (pid "
                    f"{old.status.pid}); adopt it only once"
                )
            try:
                handle = psutil.Process(pid)
                actual = handle.create_time()
                alive = handle.status() != psutil.STATUS_ZOMBIE
            except psutil.NoSuchProcess:
                raise AdoptionError(
                    f"cannot adopt {name!r}: pid {pid} no longer exists (the process ended "
                    "while it was not supervised)"
                ) from None
            if abs(actual - create_time) > _CREATE_TIME_TOLERANCE_S:
                raise AdoptionError(
                    f"cannot adopt {name!r}: pid {pid} now belongs to another process (started "
                    f"at {actual:.2f}, expected {create_time:.2f}); the original has ended"
                )
            if not alive:
                raise AdoptionError(
                    f"cannot adopt {name!r}: pid {pid} has exited (zombie awaiting its parent)"
                )
            status = ProcessStatus(
                name=name,
                pid=pid,
                state=ProcessState.RUNNING,
                exit_code=None,
                started_at=actual,
                finished_at=None,
                create_time=actual,
                adopted=True,
            )
            self._entries[name] = _Entry(spec=None, status=status, handle=handle)
            return status

    # -- observing -----------------------------------------------------------------------

    def status(self, name: str) -> ProcessStatus:
        """The current status of ``name``; raises :class:`UnknownProcess` if never started."""
        with self._lock:
            self._refresh_locked(name)
            entry = self._entries.get(name)
            if entry is None:
                raise UnknownProcess(name)
            return entry.status

    def statuses(self) -> dict[str, ProcessStatus]:
        """Every supervised process (running or finished), reaping those that have ended."""
        with self._lock:
            for name in list(self._entries):
                self._refresh_locked(name)
            return {name: entry.status for name, entry in self._entries.items()}

    def names(self) -> list[str]:
        with self._lock:
            return list(self._entries)

    def __contains__(self, name: object) -> bool:
        with self._lock:
            return name in self._entries

    def __iter__(self) -> Iterator[ProcessStatus]:
        return iter(list(self.statuses().values()))

    def wait(self, name: str, timeout: float | None = None) -> ProcessStatus:
        """Block until ``name`` has finished or ``timeout`` seconds passed; return its status."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            status = self.status(name)
            if status.state.finished:
                return status
            if deadline is not None and time.monotonic() >= deadline:
                return status
            time.sleep(_POLL_INTERVAL_S)

    def _refresh_locked(self, name: str) -> None:
        if self._released:
            self._released = [p for p in self._released if p.poll() is None]
        entry = self._entries.get(name)
        if entry is None or entry.status.state.finished:
            return
        if entry.popen is not None:
            self._refresh_child(entry, entry.popen)
        elif entry.handle is not None:
            self._refresh_adopted(entry, entry.handle)

    def _refresh_child(self, entry: _Entry, popen: subprocess.Popen[bytes]) -> None:
        if not _has_exited(popen.pid):
            return
        # The leader is a zombie: its group id cannot be reused, so the group is safe to
        # signal. Kill what it left behind, then reap it.
        _signal_group(popen.pid, signal.SIGKILL)
        code = popen.wait()
        entry.status = _finished(entry.status, code)

    @staticmethod
    def _refresh_adopted(entry: _Entry, handle: psutil.Process) -> None:
        try:
            gone = not handle.is_running() or handle.status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            gone = True
        if gone:
            entry.status = replace(entry.status, state=ProcessState.EXITED, finished_at=time.time())

    # -- stopping ------------------------------------------------------------------------

    def stop(self, name: str, grace_s: float = DEFAULT_GRACE_S) -> ProcessStatus:
        """Stop ``name``: SIGTERM to its group, SIGKILL after ``grace_s``; return the status.

        Stopping a finished process just returns its status. The lock is not held while
        waiting for the grace period.
        """
        with self._lock:
            self._refresh_locked(name)
            entry = self._entries.get(name)
            if entry is None:
                raise UnknownProcess(name)
            if entry.status.state.finished:
                return entry.status
            self._send_locked(entry, signal.SIGTERM)
        deadline = time.monotonic() + max(0.0, grace_s)
        while time.monotonic() < deadline:
            if self.status(name).state.finished:
                break
            time.sleep(_POLL_INTERVAL_S)
        with self._lock:
            self._refresh_locked(name)
            if self._entries[name].status.running:
                self._send_locked(self._entries[name], signal.SIGKILL)
        return self.wait(name, timeout=max(5.0, grace_s))

    def signal(self, name: str, signum: int) -> None:
        """Send ``signum`` to the process group of ``name`` if it is running."""
        with self._lock:
            self._refresh_locked(name)
            entry = self._entries.get(name)
            if entry is None:
                raise UnknownProcess(name)
            if entry.status.running:
                self._send_locked(entry, signum)

    def _send_locked(self, entry: _Entry, signum: int) -> None:
        pid = entry.status.pid
        if pid is None:
            return
        if entry.popen is not None:
            # Unreaped child: the group id is ours until we reap it.
            _signal_group(pid, signum)
            return
        if entry.handle is None:
            return
        try:
            # psutil checks the start time before signalling, so a recycled pid is safe.
            if not entry.handle.is_running():
                return
            if os.getpgid(pid) == pid:
                _signal_group(pid, signum)
            else:
                entry.handle.send_signal(signum)
        except (psutil.NoSuchProcess, ProcessLookupError):
            return

    def forget(self, name: str) -> None:
        """Drop a finished process's record; a running one must be stopped first."""
        with self._lock:
            self._refresh_locked(name)
            entry = self._entries.get(name)
            if entry is None:
                raise UnknownProcess(name)
            if entry.status.running:
                raise ProcessAlreadyRunning(
                    f"process {name!r} is still running (pid {entry.status.pid}): stop it "
                    "before forgetting it"
                )
            del self._entries[name]

    def release(self, name: str) -> ProcessStatus:
        """Stop supervising ``name`` without stopping it, so that a later supervisor adopts it.

        A released child is still reaped here when it exits (until this supervisor's process
        ends and the operating system hands it to init), but it is no longer reported,
        signalled or stopped by :meth:`close`.
        """
        with self._lock:
            self._refresh_locked(name)
            entry = self._entries.pop(name, None)
            if entry is None:
                raise UnknownProcess(name)
            if entry.popen is not None and entry.popen.returncode is None:
                self._released.append(entry.popen)
            return entry.status

    def close(self, grace_s: float = DEFAULT_GRACE_S) -> None:
        """Stop every running process (SIGTERM to all at once, then SIGKILL after the grace).

        Another thread may still reconcile while this runs (a backend's loop that sees a
        process exit and ``forget``s it, or ``release``s one): a process whose record goes
        meanwhile is no longer this supervisor's to stop, and counts as stopped."""
        with self._lock:
            self._closed = True
            running = [n for n, e in self._entries.items() if e.status.running]
        for signum, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
            with self._lock:
                for name in running:
                    entry = self._live_locked(name)
                    if entry is not None:
                        self._send_locked(entry, signum)
            deadline = time.monotonic() + max(0.0, wait_s)
            while True:
                with self._lock:
                    running = [n for n in running if self._live_locked(n) is not None]
                if not running or time.monotonic() >= deadline:
                    break
                time.sleep(_POLL_INTERVAL_S)

    def _live_locked(self, name: str) -> _Entry | None:
        """``name``'s record if it is still running, else None (finished or gone)."""
        self._refresh_locked(name)
        entry = self._entries.get(name)
        return entry if entry is not None and entry.status.running else None

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("the process supervisor is closed: create a new one")

    def __enter__(self) -> ProcessSupervisor:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def _has_exited(pid: int) -> bool:
    """Whether our child ``pid`` has exited, without reaping it (so its pid stays ours)."""
    try:
        result = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return True
    return result is not None


def _signal_group(pgid: int, signum: int) -> None:
    try:
        os.killpg(pgid, signum)
    except ProcessLookupError:
        pass
    except PermissionError:
        # Only a zombie leader is left and the group is empty of live members on some
        # systems; nothing to signal.
        pass


def _finished(status: ProcessStatus, code: int) -> ProcessStatus:
    message = ""
    if code < 0:
        try:
            message = f"killed by {signal.Signals(-code).name}"
        except ValueError:
            message = f"killed by signal {-code}"
    return replace(
        status,
        state=ProcessState.SUCCEEDED if code == 0 else ProcessState.FAILED,
        exit_code=code,
        finished_at=time.time(),
        message=message,
    )


def _is_not_found(error: OSError) -> bool:
    return error.errno in (errno.ENOENT, errno.ENOTDIR)
