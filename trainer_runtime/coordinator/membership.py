"""Membership of a job's workers, and the generations that give them ranks.

Pure: the clock is an argument (`now`, seconds), so every decision here is unit-tested
without sleeping. The coordinator's server calls these methods under one lock.

What must stay true:
- A generation's members are ranked oldest first, so its rank 0 is the longest-serving
  member (the one whose state every new generation broadcasts).
- Joins are batched: newcomers wait in `pending` until the join window closes (or the planned
  count has registered), then enter one new generation together.
- A departure (leave, drain, failure) opens a new generation at once, with any pending
  newcomers in it.
- A generation's number is told with the members it opened with, or not at all: a
  departure takes its worker out of `ranked` at once, but the generation that replaces it
  opens at the coordinator's next tick, so until then nobody is told a generation
  (`is_as_opened`).
- A worker that is neither a member, pending, nor drained is fenced: it must stop.
- Parameter servers (strategy: ps) share the namespace of ids, liveness and generations with
  the workers, but never take a worker rank: a generation lists them apart, oldest first (the
  partition layout order). A drained server is `retiring` until it leaves, so that the new
  generation's leader can still move its partition out.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any


class WorkerPhase(enum.Enum):
    """Where one worker stands, as the coordinator sees it.

    ```
    (register) -> PENDING --join window closes--> MEMBER --drain--> DRAINED --leave--> (gone)
                     |                              |
                     +--leave / failure--> (gone) <-+--leave / failure / lease expiry
    (unknown) = FENCED: a worker the coordinator does not know, or no longer knows
    ```
    """

    PENDING = "pending"
    MEMBER = "member"
    DRAINED = "drained"
    FENCED = "fenced"


@dataclass(slots=True)
class Worker:
    worker_id: str
    node: str
    store_address: str
    seniority: int
    last_seen: float
    connected: bool = False


@dataclass(slots=True)
class Membership:
    join_window_s: float
    lease_timeout_s: float
    generation: int = 0
    ranked: list[str] = field(default_factory=list)
    workers: dict[str, Worker] = field(default_factory=dict)
    pending_since: float | None = None
    drained: set[str] = field(default_factory=set)
    servers: dict[str, Worker] = field(default_factory=dict)
    server_ranked: list[str] = field(default_factory=list)
    retiring: dict[str, Worker] = field(default_factory=dict)
    target: int | None = None
    departed: bool = False
    next_seniority: int = 0

    # ----- reading -----

    def phase_of(self, worker_id: str) -> WorkerPhase:
        if worker_id in self.drained or worker_id in self.retiring:
            return WorkerPhase.DRAINED
        if worker_id in self.ranked or worker_id in self.server_ranked:
            return WorkerPhase.MEMBER
        if worker_id in self.workers or worker_id in self.servers:
            return WorkerPhase.PENDING
        return WorkerPhase.FENCED

    def is_server(self, worker_id: str) -> bool:
        return worker_id in self.servers or worker_id in self.retiring

    def rank_of(self, worker_id: str) -> int:
        return self.ranked.index(worker_id)

    def members(self) -> list[Worker]:
        return [self.workers[worker_id] for worker_id in self.ranked]

    def pending(self) -> list[Worker]:
        waiting = [w for w in self.workers.values() if w.worker_id not in self.ranked]
        waiting += [s for s in self.servers.values() if s.worker_id not in self.server_ranked]
        return sorted(waiting, key=lambda w: w.seniority)

    def is_as_opened(self) -> bool:
        """Whether `ranked` and `server_ranked` are still the lists generation `generation`
        opened with. A departure takes its worker out at once (and a late rejoin moves
        `generation` on) while the generation that replaces them opens at the next tick
        (`opening_due`); in between, the number names lists it was not opened with. Told
        then, a late worker would disagree with its peers, told the same number earlier,
        on the world size and the ranks: a parameter server refuses the pushes of one of
        them ("step 45 expects 4 contributions"), the ranks of a collective group would
        not agree on its size."""
        return not self.departed

    def server_members(self) -> list[Worker]:
        return [self.servers[server_id] for server_id in self.server_ranked]

    def nodes(self) -> int:
        return len({w.node for w in self.members()})

    # ----- changing -----

    def registering(self, worker_id: str, node: str, store_address: str, now: float) -> None:
        """A worker asks to join; a known worker re-registering (after a reconnect) keeps
        its place."""
        self.drained.discard(worker_id)
        known = self.workers.get(worker_id) or self.servers.get(worker_id)
        if known is not None:
            known.node, known.store_address, known.last_seen = node, store_address, now
            return
        self.workers[worker_id] = Worker(
            worker_id, node, store_address, self.next_seniority, last_seen=now
        )
        self.next_seniority += 1
        if self.pending_since is None:
            self.pending_since = now

    def registering_server(self, server_id: str, node: str, address: str, now: float) -> None:
        """A parameter server asks to join; like a worker, it enters at the next generation."""
        if server_id in self.workers:
            raise ValueError(f"{server_id} is registered as a worker: a server needs its own id")
        if server_id in self.retiring:
            raise ValueError(f"{server_id} is retiring: a replacement needs a new id")
        known = self.servers.get(server_id)
        if known is not None:
            known.node, known.store_address, known.last_seen = node, address, now
            return
        self.servers[server_id] = Worker(
            server_id, node, address, self.next_seniority, last_seen=now
        )
        self.next_seniority += 1
        if self.pending_since is None:
            self.pending_since = now

    def seeing(self, worker_id: str, now: float, connected: bool | None = None) -> None:
        worker = (
            self.workers.get(worker_id)
            or self.servers.get(worker_id)
            or self.retiring.get(worker_id)
        )
        if worker is None:
            return
        worker.last_seen = now
        if connected is not None:
            worker.connected = connected

    def draining(self, worker_id: str) -> bool:
        """Ask a member to leave at its next step boundary; False if it is not a member. A
        drained server retires: it leaves the next generation but stays listed (and alive)
        until the leader has moved its partition and released it."""
        server = self.servers.get(worker_id)
        if server is not None:
            self.removing(worker_id)
            self.retiring[worker_id] = server
            return True
        if worker_id not in self.workers:
            return False
        self.removing(worker_id)
        self.drained.add(worker_id)
        return True

    def removing(self, worker_id: str) -> bool:
        """Forget a worker (it left or failed); True if it was a member of the generation."""
        self.drained.discard(worker_id)
        self.retiring.pop(worker_id, None)
        if self.servers.pop(worker_id, None) is not None:
            if worker_id in self.server_ranked:
                self.server_ranked.remove(worker_id)
                self.departed = True
                return True
            if not self.pending():
                self.pending_since = None
            return False
        if self.workers.pop(worker_id, None) is None:
            return False
        if worker_id in self.ranked:
            self.ranked.remove(worker_id)
            self.departed = True
            return True
        if not self.pending():
            self.pending_since = None
        return False

    def expiring(self, now: float) -> list[str]:
        """Remove the workers not heard from within the lease timeout; returns their ids."""
        everyone = [*self.workers.values(), *self.servers.values(), *self.retiring.values()]
        expired = [
            w.worker_id
            for w in everyone
            if not w.connected and now - w.last_seen > self.lease_timeout_s
        ]
        for worker_id in expired:
            self.removing(worker_id)
        return expired

    def targeting(self, workers: int | None) -> None:
        self.target = workers

    def opening_due(self, now: float) -> bool:
        """Whether a new generation must open now."""
        if self.departed:
            return True
        if self.pending_since is None or not self.pending():
            return False
        if self.target is not None and len(self.workers) >= self.target:
            return True
        return now - self.pending_since >= self.join_window_s

    def opening(self) -> int:
        """Open a new generation with every known worker, oldest first; returns its number."""
        self.ranked = [
            w.worker_id for w in sorted(self.workers.values(), key=lambda w: w.seniority)
        ]
        self.server_ranked = [
            s.worker_id for s in sorted(self.servers.values(), key=lambda s: s.seniority)
        ]
        self.generation += 1
        self.pending_since = None
        self.departed = False
        return self.generation

    def restoring_after_restart(self, now: float) -> None:
        """After a coordinator restart, give every worker a full lease to reconnect."""
        for worker in [*self.workers.values(), *self.servers.values(), *self.retiring.values()]:
            worker.connected = False
            worker.last_seen = now

    # ----- persistence -----

    def to_dict(self) -> dict[str, Any]:
        return {
            "join_window_s": self.join_window_s,
            "lease_timeout_s": self.lease_timeout_s,
            "generation": self.generation,
            "ranked": list(self.ranked),
            "workers": [
                [w.worker_id, w.node, w.store_address, w.seniority] for w in self.workers.values()
            ],
            "pending": self.pending_since is not None,
            "drained": sorted(self.drained),
            "servers": [
                [s.worker_id, s.node, s.store_address, s.seniority] for s in self.servers.values()
            ],
            "server_ranked": list(self.server_ranked),
            "retiring": [
                [s.worker_id, s.node, s.store_address, s.seniority] for s in self.retiring.values()
            ],
            "target": self.target,
            "departed": self.departed,
            "next_seniority": self.next_seniority,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any], now: float) -> Membership:
        def reading(rows: list[list[Any]]) -> dict[str, Worker]:
            return {
                str(wid): Worker(str(wid), str(node), str(address), int(seniority), last_seen=now)
                for wid, node, address, seniority in rows
            }

        workers = reading(data["workers"])
        return cls(
            join_window_s=float(data["join_window_s"]),
            lease_timeout_s=float(data["lease_timeout_s"]),
            generation=int(data["generation"]),
            ranked=[str(w) for w in data["ranked"]],
            workers=workers,
            pending_since=now if data["pending"] else None,
            drained={str(w) for w in data["drained"]},
            servers=reading(data.get("servers", [])),
            server_ranked=[str(s) for s in data.get("server_ranked", [])],
            retiring=reading(data.get("retiring", [])),
            target=data["target"],
            departed=bool(data["departed"]),
            next_seniority=int(data["next_seniority"]),
        )
