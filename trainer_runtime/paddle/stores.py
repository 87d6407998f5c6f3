"""This worker's Paddle stores, and calls into Paddle that cannot be bounded otherwise.

Paddle's TCPStore cannot listen on port 0, so a worker picks a free port and tries again
when another process took it meanwhile (`StoreHost`). Two of Paddle's calls wait without a
bound of their own: a client's connection (`connecting`: it retries whatever its timeout
says) and a group's constructor (it waits for every member's address). Both run in a
helper thread that the caller stops waiting for at a deadline or once a newer generation
opened (`helping`); a thread given up on stays behind, harmlessly, and the process lets it
end before the interpreter finalizes.

What must stay true: every call made through `helping` returns or raises by its deadline,
or at once after `given_up()` turns true; no client connection is read by two threads.
"""

from __future__ import annotations

import atexit
import queue
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from paddle.base import core

STORE_PORT_ATTEMPTS = 8
HELP_POLL_S = 0.05
#: How long one check that a store's port answers waits (``_answering``).
PROBE_TIMEOUT_S = 1.0
#: How long a process about to exit lets the helper threads it gave up on end first.
ABANDONED_GRACE_S = 5.0

#: Helper threads given up on that may still run (``helping``: group constructors and
#: store connections).
_abandoned: list[threading.Thread] = []
_abandoned_lock = threading.Lock()


def _letting_abandoned_helpers_end() -> None:
    """At exit, before the interpreter finalizes: wait (bounded) for the helper threads
    ``helping`` gave up on. A call that returns once the interpreter is finalizing (its
    peers gone, its store closed) has its thread ended under C++ frames that do not allow
    it, and the process aborts ("terminate called without an active exception", seen on
    drained workers: a clean exit reported as SIGABRT). One still blocked after the grace
    period stays blocked in its store's wait or its connection, which is harmless."""
    deadline = time.monotonic() + ABANDONED_GRACE_S
    with _abandoned_lock:
        threads = list(_abandoned)
    for thread in threads:
        thread.join(timeout=max(0.0, deadline - time.monotonic()))


def _abandoning(thread: threading.Thread) -> None:
    with _abandoned_lock:
        if not _abandoned:
            atexit.register(_letting_abandoned_helpers_end)
        _abandoned[:] = [t for t in _abandoned if t.is_alive()]
        _abandoned.append(thread)


def free_port(host: str) -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


class StoreHost:
    """This worker's store server, and one client connection to each other worker's store.

    Paddle's TCPStore cannot listen on port 0 and report the port it got, so a free port
    is picked first; another process may take it in between, hence a few attempts. A
    connection that a given-up formation may still be blocked on is dropped (`forgetting`),
    so that no connection is ever read by two threads.
    """

    def __init__(self, host: str, timeout_s: float) -> None:
        self.timeout_s = max(1, round(timeout_s))
        self.server: Any = None
        error: Exception | None = None
        for _ in range(STORE_PORT_ATTEMPTS):
            port = free_port(host)
            try:
                self.server = core.TCPStore(host, port, True, 1, self.timeout_s)
                break
            except (RuntimeError, OSError) as failure:  # the port was taken meanwhile
                error = failure
        if self.server is None:
            raise RuntimeError(f"could not host a store on {host}: {error}")
        self.host = host
        self.address = f"{host}:{port}"
        self.clients: dict[str, Any] = {}

    def hosting(self) -> tuple[Any, int]:
        """A new store server on a free port, for one generation's rendezvous alone."""
        error: Exception | None = None
        for _ in range(STORE_PORT_ATTEMPTS):
            port = free_port(self.host)
            try:
                return core.TCPStore(self.host, port, True, 1, self.timeout_s), port
            except (RuntimeError, OSError) as failure:  # the port was taken meanwhile
                error = failure
        raise RuntimeError(f"could not host a store on {self.host}: {error}")

    def store_of(self, address: str, given_up: Callable[[], bool], deadline: float) -> Any:
        """This worker's connection to the store at `address` (made once, bounded as
        `connecting` is)."""
        if address == self.address:
            return self.server
        if address not in self.clients:
            host, port = address.rsplit(":", 1)
            self.clients[address] = connecting(host, int(port), self.timeout_s, given_up, deadline)
        return self.clients[address]

    def forgetting(self, address: str) -> None:
        self.clients.pop(address, None)


def connecting(
    host: str, port: int, timeout_s: int, given_up: Callable[[], bool], deadline: float
) -> Any:
    """A client of the TCPStore at `host:port`, or `RuntimeError` at `deadline` or once
    `given_up()`.

    Paddle's client retries its connection without a bound, whatever its timeout says
    (measured: still connecting to a dead worker's port 200 s after it was made with a
    30 s timeout), and a formation reaches stores whose worker may just have died: the
    registered store of a rank 0 SIGKILLed a moment ago, or the store a rank 0 started
    for an attempt it has since given up. So the client is made only once a plain socket
    reaches the port (`_answering`, bounded as the rest), and in a helper thread
    (`helping`), as the group is, for a store that dies in between: one given up on keeps
    retrying there. Without the first check such threads piled up, and one still inside
    Paddle's code when the process finalizes can abort it."""
    giving_up = (
        f"the store at {host}:{port} did not answer: its worker left or died, or gave "
        "the attempt up"
    )
    if not _answering(host, port, given_up, deadline):
        raise RuntimeError(giving_up)
    return helping(
        lambda: core.TCPStore(host, port, False, 1, timeout_s),
        given_up,
        deadline,
        giving_up,
    )


def _answering(host: str, port: int, given_up: Callable[[], bool], deadline: float) -> bool:
    """Whether something accepts a connection at `host:port`, asked again every
    `HELP_POLL_S` until `deadline` or `given_up()`."""
    while True:
        try:
            with socket.create_connection((host, port), timeout=PROBE_TIMEOUT_S):
                return True
        except OSError:
            if given_up() or time.monotonic() > deadline:
                return False
            time.sleep(HELP_POLL_S)


def helping(
    make: Callable[[], Any], given_up: Callable[[], bool], deadline: float, giving_up: str
) -> Any:
    """Run `make` in a (daemon) helper thread; what it returns or raises, or
    `RuntimeError(giving_up)` at `deadline` or once `given_up()`. A thread given up on is
    left to run; at exit the process gives it a few seconds to end first
    (``_letting_abandoned_helpers_end``)."""
    outcome: queue.Queue[tuple[bool, Any]] = queue.Queue(maxsize=1)

    def running() -> None:
        try:
            outcome.put((True, make()))
        except Exception as error:  # handed to the waiting caller
            outcome.put((False, error))

    thread = threading.Thread(target=running, name="edl-group-help", daemon=True)
    thread.start()
    while True:
        try:
            made, value = outcome.get(timeout=HELP_POLL_S)
        except queue.Empty:
            if given_up() or time.monotonic() > deadline:
                _abandoning(thread)
                raise RuntimeError(giving_up) from None
            continue
        if made:
            return value
        raise value
