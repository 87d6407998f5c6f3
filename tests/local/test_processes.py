"""The process supervisor, on real processes.

Aspects tested:
- a process's exit code becomes SUCCEEDED or FAILED; its output (stdout and stderr) lands in
  its log, appended across restarts; env is laid over the inherited environment, or replaces
  it; cwd is honoured
- a command that cannot be executed is FAILED with 127/126, a message and a log line
- stop: SIGTERM to the whole process group first, SIGKILL after the grace period
- a leader that exits takes the rest of its group with it (no orphaned helpers)
- names: a running name cannot be started twice; a finished one can; unknown names raise
- adoption after a restart: the same pid and start time are adopted, stopped and seen to exit;
  a recycled pid (other start time) and a vanished pid are refused
- thread safety: concurrent starts, reads and a stop waiting out its grace period
- close() stops everything, and a closed supervisor refuses new work; a record forgotten
  by another thread while close() waits counts as stopped
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from edl_scheduler.local.processes import (
    AdoptionError,
    ProcessAlreadyRunning,
    ProcessSpec,
    ProcessState,
    ProcessSupervisor,
    UnknownProcess,
)

PY = sys.executable


def python(name: str, code: str, tmp_path: Path, **kwargs: object) -> ProcessSpec:
    return ProcessSpec(
        name=name,
        argv=[PY, "-c", code],
        log_path=tmp_path / f"{name}.log",
        **kwargs,  # type: ignore[arg-type]
    )


def wait_for(predicate: object, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return
        time.sleep(0.02)
    raise AssertionError("condition not met in time")


def wait_for_file(path: Path, timeout: float = 10.0) -> str:
    wait_for(lambda: path.exists() and path.read_text().strip() != "", timeout)
    return path.read_text().strip()


@pytest.fixture
def supervisor() -> Iterator[ProcessSupervisor]:
    with ProcessSupervisor() as sup:
        yield sup


def test_exit_codes_logs_env_and_cwd(supervisor: ProcessSupervisor, tmp_path: Path) -> None:
    workdir = tmp_path / "work"
    workdir.mkdir()
    code = (
        "import os, sys; print('out', os.environ['EDL_X'], os.getcwd()); "
        "print('err', file=sys.stderr)"
    )
    started = supervisor.start(python("ok", code, tmp_path, env={"EDL_X": "42"}, cwd=workdir))
    assert started.state is ProcessState.RUNNING
    assert started.pid is not None and started.create_time is not None
    done = supervisor.wait("ok", timeout=20)
    assert done.state is ProcessState.SUCCEEDED and done.exit_code == 0
    assert done.finished_at is not None and done.finished_at >= done.started_at
    log = (tmp_path / "ok.log").read_text()
    assert f"out 42 {workdir}" in log and "err" in log

    supervisor.start(python("bad", "import sys; sys.exit(3)", tmp_path))
    failed = supervisor.wait("bad", timeout=20)
    assert failed.state is ProcessState.FAILED and failed.exit_code == 3


def test_env_replaces_the_environment_when_not_inherited(
    supervisor: ProcessSupervisor, tmp_path: Path
) -> None:
    os.environ["EDL_TEST_INHERITED"] = "yes"
    try:
        code = "import os; print(sorted(k for k in os.environ if k.startswith('EDL_')))"
        supervisor.start(python("bare", code, tmp_path, env={"EDL_ONLY": "1"}, inherit_env=False))
        supervisor.start(python("full", code, tmp_path, env={"EDL_ONLY": "1"}))
        supervisor.wait("bare", timeout=20)
        supervisor.wait("full", timeout=20)
    finally:
        del os.environ["EDL_TEST_INHERITED"]
    assert "['EDL_ONLY']" in (tmp_path / "bare.log").read_text()
    assert "EDL_TEST_INHERITED" in (tmp_path / "full.log").read_text()


def test_command_that_cannot_run_fails_with_shell_codes(
    supervisor: ProcessSupervisor, tmp_path: Path
) -> None:
    missing = supervisor.start(
        ProcessSpec("missing", ["/no/such/command"], log_path=tmp_path / "m.log")
    )
    assert missing.state is ProcessState.FAILED and missing.exit_code == 127
    assert missing.pid is None
    assert "/no/such/command" in missing.message
    assert "/no/such/command" in (tmp_path / "m.log").read_text()

    script = tmp_path / "not-executable.sh"
    script.write_text("echo hi\n")
    denied = supervisor.start(ProcessSpec("denied", [str(script)], log_path=tmp_path / "d.log"))
    assert denied.state is ProcessState.FAILED and denied.exit_code == 126

    nodir = supervisor.start(
        ProcessSpec("nodir", [PY, "-c", "pass"], cwd=tmp_path / "absent", log_path=None)
    )
    assert nodir.state is ProcessState.FAILED and "absent" in nodir.message


def test_spec_validation_names_the_field() -> None:
    with pytest.raises(ValueError, match="argv is empty"):
        ProcessSpec("x", [])
    with pytest.raises(ValueError, match="name is empty"):
        ProcessSpec("", ["true"])


def test_stop_is_graceful_when_the_process_listens(
    supervisor: ProcessSupervisor, tmp_path: Path
) -> None:
    ready = tmp_path / "ready"
    code = (
        "import signal, sys, time, pathlib\n"
        "signal.signal(signal.SIGTERM, lambda *a: (print('drained', flush=True), sys.exit(7)))\n"
        f"pathlib.Path({str(ready)!r}).write_text('1')\n"
        "time.sleep(60)\n"
    )
    supervisor.start(python("graceful", code, tmp_path))
    wait_for_file(ready)
    began = time.monotonic()
    stopped = supervisor.stop("graceful", grace_s=20)
    assert time.monotonic() - began < 10
    assert stopped.state is ProcessState.FAILED and stopped.exit_code == 7
    assert "drained" in (tmp_path / "graceful.log").read_text()


def test_stop_kills_after_the_grace_period(supervisor: ProcessSupervisor, tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    code = (
        "import signal, time, pathlib\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        f"pathlib.Path({str(ready)!r}).write_text('1')\n"
        "time.sleep(60)\n"
    )
    supervisor.start(python("stubborn", code, tmp_path))
    wait_for_file(ready)
    began = time.monotonic()
    stopped = supervisor.stop("stubborn", grace_s=0.5)
    elapsed = time.monotonic() - began
    assert 0.5 <= elapsed < 10
    assert stopped.state is ProcessState.FAILED
    assert stopped.exit_code == -signal.SIGKILL and "SIGKILL" in stopped.message
    # Stopping a finished process returns its status again.
    assert supervisor.stop("stubborn").exit_code == -signal.SIGKILL


def _grandchild_code(pidfile: Path, leader_sleep: float) -> str:
    return (
        "import subprocess, sys, time, pathlib\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        f"pathlib.Path({str(pidfile)!r}).write_text(str(child.pid))\n"
        f"time.sleep({leader_sleep})\n"
    )


def test_stop_reaches_the_whole_group(supervisor: ProcessSupervisor, tmp_path: Path) -> None:
    pidfile = tmp_path / "grandchild"
    supervisor.start(python("tree", _grandchild_code(pidfile, 60), tmp_path))
    grandchild = psutil.Process(int(wait_for_file(pidfile)))
    supervisor.stop("tree", grace_s=5)
    grandchild.wait(timeout=10)
    assert not grandchild.is_running()


def test_a_leader_that_exits_takes_its_group_along(
    supervisor: ProcessSupervisor, tmp_path: Path
) -> None:
    pidfile = tmp_path / "grandchild"
    supervisor.start(python("short", _grandchild_code(pidfile, 0), tmp_path))
    grandchild = psutil.Process(int(wait_for_file(pidfile)))
    done = supervisor.wait("short", timeout=20)
    assert done.state is ProcessState.SUCCEEDED
    grandchild.wait(timeout=10)
    assert not grandchild.is_running()


def test_names_are_unique_while_running_and_reusable_after(
    supervisor: ProcessSupervisor, tmp_path: Path
) -> None:
    spec = python("job", "import time; print('run', flush=True); time.sleep(60)", tmp_path)
    first = supervisor.start(spec)
    wait_for(lambda: "run" in (tmp_path / "job.log").read_text())
    with pytest.raises(ProcessAlreadyRunning, match="still running"):
        supervisor.start(spec)
    with pytest.raises(ProcessAlreadyRunning):
        supervisor.forget("job")
    supervisor.stop("job", grace_s=5)
    second = supervisor.start(spec)
    assert second.pid != first.pid and second.running
    wait_for(lambda: (tmp_path / "job.log").read_text().count("run") == 2)
    supervisor.stop("job", grace_s=5)
    supervisor.forget("job")
    assert "job" not in supervisor
    with pytest.raises(UnknownProcess, match="'job'"):
        supervisor.status("job")
    with pytest.raises(UnknownProcess):
        supervisor.stop("job")


def test_adopt_after_a_restart(tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    code = f"import time, pathlib; pathlib.Path({str(ready)!r}).write_text('1'); time.sleep(60)"
    with ProcessSupervisor() as before:
        started = before.start(python("worker", code, tmp_path))
        wait_for_file(ready)
        before.release("worker")
        assert "worker" not in before
        assert started.pid is not None and started.create_time is not None

        with ProcessSupervisor() as after:
            adopted = after.adopt("worker", started.pid, started.create_time)
            assert adopted.running and adopted.adopted and adopted.pid == started.pid
            with pytest.raises(ProcessAlreadyRunning):
                after.adopt("worker", started.pid, started.create_time)
            stopped = after.stop("worker", grace_s=5)
            assert stopped.state is ProcessState.EXITED and stopped.exit_code is None
            before.statuses()  # the first supervisor reaps the child it released


def test_adopted_process_seen_to_exit_on_its_own(tmp_path: Path) -> None:
    # It exits once adopted (not after a fixed second, which a loaded machine could spend
    # before the adoption, refused then: a zombie cannot be adopted); at most 60 s alone.
    go = tmp_path / "go"
    code = (
        "import pathlib, time\n"
        "deadline = time.monotonic() + 60\n"
        f"while not pathlib.Path({str(go)!r}).exists() and time.monotonic() < deadline:\n"
        "    time.sleep(0.02)\n"
    )
    with ProcessSupervisor() as before, ProcessSupervisor() as after:
        started = before.start(python("brief", code, tmp_path))
        before.release("brief")
        assert started.pid is not None and started.create_time is not None
        after.adopt("brief", started.pid, started.create_time)
        assert after.status("brief").running
        go.write_text("1")
        wait_for(lambda: (before.statuses(), after.status("brief").state)[1].finished, 20)
        assert after.status("brief").state is ProcessState.EXITED


def test_adoption_refuses_recycled_and_vanished_pids(
    supervisor: ProcessSupervisor, tmp_path: Path
) -> None:
    started = supervisor.start(python("sleeper", "import time; time.sleep(60)", tmp_path))
    assert started.pid is not None and started.create_time is not None
    with ProcessSupervisor() as other:
        with pytest.raises(AdoptionError, match="another process"):
            other.adopt("sleeper", started.pid, started.create_time - 100.0)
        supervisor.stop("sleeper", grace_s=5)
        with pytest.raises(AdoptionError, match="no longer exists"):
            other.adopt("sleeper", started.pid, started.create_time)
        assert "sleeper" not in other


def test_threads_share_one_supervisor(supervisor: ProcessSupervisor, tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    stubborn = (
        "import signal, time, pathlib\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        f"pathlib.Path({str(ready)!r}).write_text('1')\n"
        "time.sleep(60)\n"
    )
    supervisor.start(python("slow-stop", stubborn, tmp_path))
    wait_for_file(ready)
    stopper = threading.Thread(target=supervisor.stop, args=("slow-stop",), kwargs={"grace_s": 2})
    stopper.start()
    errors: list[BaseException] = []

    def starter(i: int) -> None:
        try:
            supervisor.start(python(f"t{i}", f"print({i})", tmp_path))
            supervisor.wait(f"t{i}", timeout=30)
        except BaseException as error:
            errors.append(error)

    began = time.monotonic()
    threads = [threading.Thread(target=starter, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    # Reads are not blocked by the stop that is waiting out its grace period.
    assert supervisor.status("slow-stop").running
    assert time.monotonic() - began < 1.5
    for thread in threads:
        thread.join(timeout=60)
    stopper.join(timeout=30)
    assert not errors
    statuses = supervisor.statuses()
    assert all(statuses[f"t{i}"].state is ProcessState.SUCCEEDED for i in range(4))
    assert statuses["slow-stop"].exit_code == -signal.SIGKILL


def test_close_takes_a_record_forgotten_meanwhile_as_stopped(tmp_path: Path) -> None:
    """A backend's loop may forget a process that exited while close() waits for it."""
    supervisor = ProcessSupervisor()
    deaf = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)"
    status = supervisor.start(python("deaf", deaf, tmp_path))
    other = supervisor.start(python("other", "import time; time.sleep(60)", tmp_path))
    assert status.pid is not None and other.pid is not None
    wait_for(lambda: "SIG_IGN" in " ".join(psutil.Process(status.pid).cmdline()))
    time.sleep(0.3)  # the handler is set before the sleep starts

    def reconcile() -> None:  # as a backend's loop would, once close() asked for the stop
        wait_for(lambda: supervisor._closed)
        os.kill(status.pid, signal.SIGKILL)  # type: ignore[arg-type]
        wait_for(lambda: supervisor.status("deaf").state.finished)
        supervisor.forget("deaf")

    loop = threading.Thread(target=reconcile)
    loop.start()
    supervisor.close(grace_s=5)
    loop.join(timeout=10)
    assert "deaf" not in supervisor.statuses()
    assert supervisor.status("other").state is ProcessState.FAILED
    assert not psutil.pid_exists(status.pid) and not psutil.pid_exists(other.pid)


def test_close_stops_everything_and_refuses_new_work(tmp_path: Path) -> None:
    supervisor = ProcessSupervisor()
    pids = []
    for i in range(3):
        status = supervisor.start(python(f"s{i}", "import time; time.sleep(60)", tmp_path))
        assert status.pid is not None
        pids.append(status.pid)
    supervisor.close(grace_s=5)
    assert all(s.state is ProcessState.FAILED for s in supervisor.statuses().values())
    assert not any(psutil.pid_exists(pid) for pid in pids)
    with pytest.raises(RuntimeError, match="closed"):
        supervisor.start(python("late", "pass", tmp_path))
