"""The coordinator under faults of its disk and its state file.

Aspects tested:
- a save that fails once (a full disk for a moment) is tried again and the call succeeds;
- a save that keeps failing: the call that made the change is refused (UNAVAILABLE, which
  workers retry) rather than answered as if kept, the change is undone in memory, no later
  call is answered, nor one that was waiting meanwhile, the ticker thread ends with an
  error line, and the process exits 3, its file holding exactly the
  changes that were answered (the state a restart loads);
- a failed fsync is a failed save, whichever fsync fails (the temporary file's, or the
  directory's after the rename): once, it is tried again and the call succeeds; for good,
  the change is refused and the coordinator stops, no temporary file is left behind, and a
  coordinator restarted from the file takes the worker's retried call as the same worker
  (after a failed directory fsync the refused change may be in the file already: only its
  durability was unknown);
- a state file that is not a coordinator state (``null``, a list, a wrong format, a
  negative epoch, junk) is refused at start with the file's name and exit 2, no traceback.
"""

from __future__ import annotations

import errno
import json
import os
import resource
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from trainer_runtime.client import CoordinatorClient, CoordinatorUnreachable
from trainer_runtime.coordinator.serving import CoordinatorServer, CoordinatorService
from trainer_runtime.coordinator.state import CoordinatorState
from trainer_runtime.coordinator.storing import FileStore
from trainer_runtime.sharding import DatasetPlan

from .harness import TOKEN, TRUST, VERIFIER, waiting_for


class FlakyStore(FileStore):
    """A file store whose next ``fail`` saves raise, as on a full disk."""

    def __init__(self, path: Path) -> None:
        super().__init__(path, durable=False)
        self.fail = 0

    def save(self, document: str) -> None:
        if self.fail > 0:
            self.fail -= 1
            raise OSError(28, "No space left on device")
        super().save(document)


def saved_workers(store: FileStore) -> list[str]:
    return [str(row[0]) for row in json.loads(store.path.read_text())["membership"]["workers"]]


def _serve(store: FileStore) -> CoordinatorServer:
    """A coordinator over `store`: afresh, or from the state the store holds."""
    saved = store.load()
    state = (
        CoordinatorState.starting(DatasetPlan(40, 4, 1), join_window_s=0.05)
        if saved is None
        else CoordinatorState.from_json(saved, now=time.monotonic())
    )
    return CoordinatorServer(CoordinatorService(state, store, VERIFIER)).start()


class FailingFsync:
    """``os.fsync`` whose next ``fail`` calls on a file (or, ``directory``, on a directory)
    raise EIO, as a disk that lost a write does."""

    def __init__(self, directory: bool) -> None:
        self.directory = directory
        self.fail = 0
        self.real = os.fsync

    def __call__(self, descriptor: int) -> None:
        if self.fail > 0 and stat.S_ISDIR(os.fstat(descriptor).st_mode) == self.directory:
            self.fail -= 1
            raise OSError(errno.EIO, "Input/output error")
        self.real(descriptor)


def leftovers(directory: Path) -> list[Path]:
    return sorted(directory.glob(".state.json.*.tmp"))


@pytest.mark.parametrize("directory", [False, True], ids=["file", "directory"])
def test_a_failed_fsync_once_is_tried_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, directory: bool
) -> None:
    fsync = FailingFsync(directory)
    monkeypatch.setattr(os, "fsync", fsync)
    store = FileStore(tmp_path / "state.json")  # durable: every save fsyncs
    server = _serve(store)
    try:
        fsync.fail = 1
        CoordinatorClient(server.address, TOKEN, retry_s=2.0).register("w0", "n", "")
        assert fsync.fail == 0, "no fsync failed"
        assert server.service.failure is None
        assert saved_workers(store) == ["w0"]
    finally:
        server.stop()
    assert leftovers(tmp_path) == []  # once stopped: the ticker may be saving till then


@pytest.mark.parametrize("directory", [False, True], ids=["file", "directory"])
def test_an_fsync_that_keeps_failing_refuses_the_change_and_stops(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, directory: bool
) -> None:
    fsync = FailingFsync(directory)
    monkeypatch.setattr(os, "fsync", fsync)
    store = FileStore(tmp_path / "state.json")
    server = _serve(store)
    client = CoordinatorClient(server.address, TOKEN, timeout_s=1.0, retry_s=1.0)
    try:
        client.register("w0", "n", "")
        fsync.fail = 10**6
        with pytest.raises(CoordinatorUnreachable):
            client.register("w1", "n", "")
        assert isinstance(server.service.failure, OSError)
        with pytest.raises(CoordinatorUnreachable):
            client.progress()
    finally:
        server.stop()
    assert leftovers(tmp_path) == []
    # The temporary file's fsync fails before the rename: the file holds what was answered.
    # The directory's fails after it: the refused change is there too, not known durable.
    assert saved_workers(store) == (["w0", "w1"] if directory else ["w0"])
    fsync.fail = 0  # the disk mended: a coordinator restarted from the file
    restarted = _serve(store)
    try:
        again = CoordinatorClient(restarted.address, TOKEN, timeout_s=1.0, retry_s=2.0)
        again.register("w1", "n", "")  # the worker's retry of the refused call
        assert saved_workers(store) == ["w0", "w1"]
    finally:
        restarted.stop()


def test_a_save_that_fails_once_is_tried_again(tmp_path: Path) -> None:
    store = FlakyStore(tmp_path / "state.json")
    server = _serve(store)
    try:
        store.fail = 1
        CoordinatorClient(server.address, TOKEN, retry_s=2.0).register("w0", "n", "")
        assert server.service.failure is None
        assert saved_workers(store) == ["w0"]
    finally:
        server.stop()


def test_a_save_that_keeps_failing_refuses_the_change_and_stops(tmp_path: Path) -> None:
    store = FlakyStore(tmp_path / "state.json")
    server = _serve(store)
    client = CoordinatorClient(server.address, TOKEN, timeout_s=1.0, retry_s=1.0)
    try:
        store.fail = 10**6
        with pytest.raises(CoordinatorUnreachable):
            client.register("w0", "n", "")
        assert isinstance(server.service.failure, OSError)
        assert saved_workers(store) == []
        # The change was undone in memory too: what the process holds is what the disk holds.
        assert server.service.state.to_json() == store.path.read_text()
        assert server.service.state.membership.workers == {}
        with pytest.raises(CoordinatorUnreachable):
            client.progress()  # nothing more is answered from a memory ahead of the disk
        waiting_for(lambda: not server.ticker.is_alive(), 5.0, "the ticker to end")
    finally:
        server.stop()


def test_a_call_waiting_while_a_save_fails_is_not_answered(tmp_path: Path) -> None:
    """w0 waits for the generation after its first; w1's registration opens one, whose save
    fails for good: w0 must not be told of a generation the disk never held."""
    store = FlakyStore(tmp_path / "state.json")
    server = _serve(store)
    try:
        first = CoordinatorClient(server.address, TOKEN, timeout_s=2.0, retry_s=1.0)
        first.register("w0", "n", "")
        assert first.awaiting_generation("w0", 0, 5.0).number == 1
        told: list[Any] = []

        def waiting() -> None:
            try:
                told.append(first.awaiting_generation("w0", 1, 5.0))
            except CoordinatorUnreachable as error:
                told.append(error)

        waiter = threading.Thread(target=waiting)
        waiter.start()
        time.sleep(0.3)  # w0 waits in the coordinator
        store.fail = 10**6
        second = CoordinatorClient(server.address, TOKEN, timeout_s=1.0, retry_s=1.0)
        with pytest.raises(CoordinatorUnreachable):
            second.register("w1", "n", "")
        waiter.join(15)
        assert len(told) == 1 and isinstance(told[0], CoordinatorUnreachable), told
        assert saved_workers(store) == ["w0"]
    finally:
        server.stop()


def _coordinator(state_file: Path, *extra: str, timeout: float = 30) -> Any:
    return subprocess.run(
        [sys.executable, "-m", "trainer_runtime.coordinator", "--samples", "40",
         "--shard-size", "4", "--state-file", str(state_file), *extra],
        env={**os.environ, **TRUST}, capture_output=True, text=True, timeout=timeout,
        check=False,
    )  # fmt: skip


@pytest.mark.parametrize(
    "text",
    [
        "null",
        "[1, 2]",
        '{"format": 1}',
        '{"format": 7}',
        "not json at all",
        "NEGATIVE_EPOCH",
    ],
)
def test_a_state_file_that_is_not_a_state_is_refused_by_name(tmp_path: Path, text: str) -> None:
    state_file = tmp_path / "state.json"
    if text == "NEGATIVE_EPOCH":
        good = CoordinatorState.starting(DatasetPlan(40, 4, 1), join_window_s=0.05)
        data = json.loads(good.to_json())
        data["ledger"]["epoch"] = -1
        text = json.dumps(data)
    state_file.write_text(text)
    done = _coordinator(state_file)
    assert done.returncode == 2, done.stderr
    assert str(state_file) in done.stderr and "is not a coordinator state" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_coordinator_that_cannot_save_exits_3_and_restarts_from_the_saved_state(
    tmp_path: Path,
) -> None:
    """A file size limit (RLIMIT_FSIZE) lets the first saves through and refuses the one
    that grows the state past it: the process exits 3, and the state file it leaves (what
    a restart loads) holds every worker whose registration was answered, and none that was
    refused."""
    state_file, port_file = tmp_path / "state.json", tmp_path / "port"

    def limited() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))

    process = subprocess.Popen(
        [sys.executable, "-m", "trainer_runtime.coordinator", "--samples", "40",
         "--shard-size", "4", "--state-file", str(state_file), "--port-file", str(port_file)],
        env={**os.environ, **TRUST}, stderr=subprocess.PIPE, text=True,
        preexec_fn=limited,
    )  # fmt: skip
    try:
        waiting_for(lambda: port_file.exists() and port_file.read_text() != "", 20.0, "a port")
        client = CoordinatorClient(
            f"127.0.0.1:{port_file.read_text()}", TOKEN, timeout_s=1.0, retry_s=1.0
        )
        answered: list[str] = []
        with pytest.raises(CoordinatorUnreachable):
            for i in range(100):
                name = f"w{i}-" + "x" * 200
                client.register(name, "n", "")
                answered.append(name)
        assert process.wait(20) == 3
        assert process.stderr is not None and "could not be saved" in process.stderr.read()
    finally:
        process.kill()
        process.wait()
    assert answered and saved_workers(FileStore(state_file)) == answered
