"""A TCP proxy that plays a faulty network between a worker and its coordinator (tests).

`FaultyProxy(("127.0.0.1", port))` listens on 127.0.0.1 (a free port) and relays every
connection to the coordinator, one thread per connection. What the network does is set at
any moment, for every connection at once:
- `passing()`: bytes go through as they come;
- `delaying(ms)`: each chunk is delivered `ms` milliseconds after it arrived, in order, in
  both directions (latency, not a bandwidth limit);
- `blackholing()`: a partition: nothing is relayed either way, and nothing is closed;
  connections (new ones too: accepted, not yet relayed) wait as TCP would while its
  retransmissions go unanswered, and what was sent meanwhile is delivered when the
  partition heals (`passing()`), unless a side closed its end, which is then relayed;
- `cutting()`: every connection is closed at once, and new ones as soon as accepted.

What must stay true: the proxy never closes a connection on its own except when cut or
stopped, or when one side closed it; bytes are never reordered or altered; `stop()` ends
every thread it started, within a bound.
"""

from __future__ import annotations

import contextlib
import enum
import select
import socket
import threading
import time
from collections import deque

POLL_S = 0.02
SEND_TIMEOUT_S = 5.0


class Network(enum.Enum):
    """What the proxy does to the bytes it relays (the module docstring says how)."""

    PASSING = "passing"
    DELAYING = "delaying"
    BLACKHOLING = "blackholing"
    CUTTING = "cutting"


class FaultyProxy:
    """A faulty network in front of one upstream address; a context manager."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.network = Network.PASSING
        self.delay_s = 0.0
        self.changed = threading.Condition()
        self.stopping = threading.Event()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(POLL_S * 5)
        self.port: int = self.listener.getsockname()[1]
        self.threads: list[threading.Thread] = []
        self.accepting = threading.Thread(target=self.accepting_forever, name="proxy-accept")
        #: Connections accepted, ever (a test can tell its client reconnected).
        self.accepted = 0

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    # ----- what the network does -----

    def setting(self, network: Network, delay_s: float = 0.0) -> None:
        with self.changed:
            self.network, self.delay_s = network, delay_s
            self.changed.notify_all()

    def passing(self) -> None:
        self.setting(Network.PASSING)

    def delaying(self, milliseconds: float) -> None:
        self.setting(Network.DELAYING, milliseconds / 1000.0)

    def blackholing(self) -> None:
        self.setting(Network.BLACKHOLING)

    def cutting(self) -> None:
        self.setting(Network.CUTTING)

    # ----- lifecycle -----

    def start(self) -> FaultyProxy:
        self.accepting.start()
        return self

    def stop(self) -> None:
        self.stopping.set()
        with self.changed:
            self.changed.notify_all()
        self.accepting.join(5.0)
        for thread in self.threads:
            thread.join(5.0)
        self.listener.close()

    def __enter__(self) -> FaultyProxy:
        return self.start()

    def __exit__(self, *_exc: object) -> None:
        self.stop()

    # ----- relaying -----

    def accepting_forever(self) -> None:
        while not self.stopping.is_set():
            try:
                down, _ = self.listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.accepted += 1
            down.settimeout(SEND_TIMEOUT_S)
            if self.network is Network.CUTTING:
                down.close()
                continue
            thread = threading.Thread(
                target=self.relaying, args=(down,), name="proxy-relay", daemon=True
            )
            self.threads = [t for t in self.threads if t.is_alive()]
            self.threads.append(thread)
            thread.start()

    def held(self) -> bool:
        """Wait (bounded) while the network is partitioned; whether it still is."""
        with self.changed:
            if self.network is Network.BLACKHOLING and not self.stopping.is_set():
                self.changed.wait(POLL_S * 5)
            return self.network is Network.BLACKHOLING

    def relaying(self, down: socket.socket) -> None:
        up: socket.socket | None = None
        try:
            up = self.relaying_until_closed(down)
        except OSError:
            pass  # a side reset its end: the connection is over, as on a real network
        finally:
            for end in (down, up):
                if end is not None:
                    with contextlib.suppress(OSError):
                        end.close()

    def relaying_until_closed(self, down: socket.socket) -> socket.socket | None:
        """Relay until a side closes, the network cuts or the proxy stops; the upstream
        socket, once opened (only when the network first lets bytes through)."""
        up: socket.socket | None = None
        outbox: dict[socket.socket, deque[tuple[float, bytes]]] = {down: deque()}
        closed: set[socket.socket] = set()
        while not self.stopping.is_set():
            if self.network is Network.CUTTING:
                return up
            if self.held():
                continue
            if up is None:
                up = socket.create_connection(self.upstream, timeout=SEND_TIMEOUT_S)
                outbox[up] = deque()
            peer = {down: up, up: down}
            now = time.monotonic()
            for end, queue in outbox.items():
                while queue and queue[0][0] <= now:
                    end.sendall(queue.popleft()[1])
            if closed and not outbox[peer[next(iter(closed))]]:
                return up  # a side closed and all it sent was delivered: close the other
            due = [queue[0][0] for queue in outbox.values() if queue]
            wait_s = min([POLL_S, *(d - now for d in due)])
            open_ends = [end for end in (down, up) if end not in closed]
            readable, _, _ = select.select(open_ends, [], [], max(wait_s, 0.0))
            for end in readable:
                data = end.recv(65536)
                if not data:
                    closed.add(end)
                    continue
                delay_s = self.delay_s if self.network is Network.DELAYING else 0.0
                outbox[peer[end]].append((time.monotonic() + delay_s, data))
        return up
