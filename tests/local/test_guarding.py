"""No other user of the machine can use, read or take over the local service.

Aspects tested:
- a service started by ``edlctl local start`` leaves its home ``0700`` and its socket, its
  database (the job tokens), its log, its pid file and every job's logs and coordinator
  state readable and writable by its owner only, and narrows what an older version left
  open;
- a home another user owns, or others may write, is refused at start with the fix;
- a process of another uid that reaches the socket (its mode and the home's opened up by
  hand) gets 403 naming the owner, and no request of it is carried out (no job is
  submitted, the service keeps running); the owner is still answered;
- one whose request comes after the refusal was written still reads it (seen to fail, a
  broken pipe instead of the answer, with the connection closed as the refusal was sent).
"""

from __future__ import annotations

import json
import os
import socket
import stat
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from edl_scheduler.local.guarding import HomeError, prepare_home
from edl_scheduler.local.serving import SOCKET_NAME
from edl_scheduler.sdk.local import LocalClient, start_service, stop_service

from .jobs import plain_job

pytestmark = pytest.mark.slow

NOBODY = 65534


def mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


@pytest.fixture
def home(tmp_path: Path) -> Iterator[Path]:
    home = tmp_path / "edl"
    home.mkdir(mode=0o755)
    (home / "service.log").write_text("from an older version\n")
    os.chmod(home / "service.log", 0o644)
    start_service(home, slots=2)
    yield home
    stop_service(home)


def test_the_home_and_everything_in_it_are_the_owners_only(home: Path) -> None:
    with LocalClient(home) as client:
        client.submit(plain_job("modes", 1, 1, samples=200), home)
        deadline = time.monotonic() + 60
        while not list((home / "logs").glob("*worker*.log")) and time.monotonic() < deadline:
            time.sleep(0.2)
    assert mode(home) == 0o700
    assert mode(home / SOCKET_NAME) == 0o600
    files = [p for p in home.rglob("*") if not p.is_symlink()]
    assert {p.name for p in files} >= {"state.db", "service.log", "service.pid", "logs"}
    assert list((home / "logs").glob("*worker*.log"))
    for path in files:
        assert mode(path) & 0o077 == 0, f"{path} is {mode(path):o}"


def test_a_home_others_may_write_or_own_is_refused(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    with pytest.raises(HomeError, match=r"writable by others.*chmod 700"):
        prepare_home(shared)
    if os.geteuid() == 0:  # only root can give a folder away
        theirs = tmp_path / "theirs"
        theirs.mkdir(mode=0o700)
        os.chown(theirs, NOBODY, NOBODY)
        with pytest.raises(HomeError, match="belongs to uid 65534"):
            prepare_home(theirs)


def call_as(uid: int, home: Path, pause_s: float = 0.0) -> str:
    """What the service answers a submission from a process of ``uid``: a child of this
    process that enters ``home`` as root, becomes ``uid`` and connects to the socket by its
    name there (so no folder above it need let that user through), and sends its request
    ``pause_s`` after connecting."""
    body = json.dumps({"manifest": plain_job("intruder", samples=100), "workdir": "/"}).encode()
    request = (
        b"POST /jobs HTTP/1.1\r\nhost: edl\r\ncontent-type: application/json\r\n"
        + b"content-length: %d\r\n\r\n" % len(body)
        + body
    )
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: only system calls, then out
        try:
            os.close(read)
            os.chdir(home)
            os.setgid(uid)
            os.setuid(uid)
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.settimeout(20)
                s.connect(SOCKET_NAME)
                time.sleep(pause_s)
                s.sendall(request)
                while chunk := s.recv(4096):
                    os.write(write, chunk)
        except BaseException as error:  # told to the parent
            os.write(write, f"child failed: {error!r}".encode())
        finally:
            os._exit(0)
    os.close(write)
    answer = b""
    while chunk := os.read(read, 4096):
        answer += chunk
    os.close(read)
    os.waitpid(pid, 0)
    return answer.decode()


@pytest.mark.skipif(os.geteuid() != 0, reason="running a process as another uid needs root")
def test_a_refused_peer_that_sends_late_still_reads_why(home: Path) -> None:
    os.chmod(home, 0o711)
    os.chmod(home / SOCKET_NAME, 0o666)
    answer = call_as(NOBODY, home, pause_s=0.5)
    assert answer.startswith("HTTP/1.1 403"), answer
    with LocalClient(home) as client:
        assert client.list() == []


@pytest.mark.skipif(os.geteuid() != 0, reason="running a process as another uid needs root")
def test_a_peer_of_another_uid_is_refused(home: Path) -> None:
    # Open both the way an older version (or a careless chmod) would: only the peer check
    # is left between the other user and the service.
    os.chmod(home, 0o711)
    os.chmod(home / SOCKET_NAME, 0o666)
    answer = call_as(NOBODY, home)
    assert answer.startswith("HTTP/1.1 403"), answer
    assert f"answers only its owner (uid {os.geteuid()})" in answer
    assert f"uid {NOBODY}" in answer
    with LocalClient(home) as client:  # the owner is answered, and nothing was submitted
        assert client.list() == []
        # (The same request from the owner is carried out: the refusal was the peer's.)
        client.submit(plain_job("owners", samples=100), home)
        assert [j.name for j in client.list()] == ["owners"]
