"""The worker agent: a worker's side of membership, shared by every framework adapter.

It registers the worker, keeps one `Watch` stream open to the coordinator (the stream is
the worker's liveness, and it brings generation changes and drain requests), and answers
the only question asked on the hot path of every step, "has anything changed?", from memory,
without an RPC.

What must stay true:
- `changed()` is a memory read.
- Every wait is bounded by the contract's timeout; a coordinator that stays unreachable
  longer raises `CoordinatorUnreachable`.
- A worker the coordinator no longer knows stops (`Fenced`), it never trains on alone.
- A worker whose coordinator was replaced (another incarnation answers: ``changed()``, the
  reply to ``awaiting_assignment``, or a refused lease or commit) registers again, reporting
  the newest generation it was a member of and what it trained in its latest epoch
  (``journal.py``), before it asks for work: the replacement may have started from a state
  older than that (``coordinator/recovering.py``).
- A watch the coordinator refuses for good (a wrong token: `TokenRefused`) is said in an
  error line and stops the worker at its next step boundary; only a dropped stream (the
  coordinator restarting) is retried quietly.
- SIGTERM (what the kubelet sends a pod it deletes or evicts, and the local backend a
  process it stops) is a drain this worker gives itself: `changed()` turns true, the next
  `awaiting_assignment` answers DRAINED without asking, and the worker leaves at its next
  step boundary, its last complete step committed, and exits 0, as if the controller had
  drained it. Its calls then stop retrying after `TERMINATING_RETRY_S`: the coordinator
  may be stopping in the same deletion, and the grace period is short.
"""

from __future__ import annotations

import enum
import logging
import signal
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from types import FrameType
from typing import Any

import grpc

from trainer_runtime.client import (
    CoordinatorClient,
    CoordinatorError,
    CoordinatorUnreachable,
    Fenced,
    Reincarnated,
    Rejoining,
    TokenRefused,
    translating,
)
from trainer_runtime.environment import WorkerContract
from trainer_runtime.journal import TrainedJournal
from trainer_runtime.protocol import pb
from trainer_runtime.sharding import SampleRange

LOG = logging.getLogger(__name__)
RECONNECT_PAUSE_S = 0.1
#: How long a worker told to terminate keeps retrying a call to an unreachable coordinator.
TERMINATING_RETRY_S = 2.0


class Outcome(enum.Enum):
    """What a worker learns when it asks for the next generation (terminal but MEMBER).

    ```
    MEMBER --(generation changes)--> ask again --> MEMBER | DRAINED | FINISHED | FENCED
    DRAINED, FINISHED: leave and exit 0.   FENCED: stop with an error.
    ```
    """

    MEMBER = "member"
    DRAINED = "drained"
    FINISHED = "finished"
    FENCED = "fenced"


@dataclass(frozen=True, slots=True)
class Peer:
    worker_id: str
    rank: int
    store_address: str


@dataclass(frozen=True, slots=True)
class Assignment:
    """One worker's place in one generation."""

    outcome: Outcome
    generation: int
    rank: int = -1
    peers: tuple[Peer, ...] = ()

    @property
    def world_size(self) -> int:
        return len(self.peers)


def assignment_of(reply: Any) -> Assignment:
    """A member's place, from the coordinator's answer that names its generation."""
    peers = tuple(Peer(m.worker_id, m.rank, m.store_address) for m in reply.members)
    return Assignment(Outcome.MEMBER, int(reply.number), int(reply.rank), peers)


class WorkerAgent:
    """Membership of one worker process, over one coordinator client."""

    def __init__(self, contract: WorkerContract, client: CoordinatorClient | None = None) -> None:
        self.contract = contract
        self.client = client or CoordinatorClient(
            contract.coordinator,
            contract.token,
            timeout_s=5.0,
            retry_s=contract.timeout_s,
            tls=contract.tls,
        )
        self.generation = 0
        self.notice: Any = pb.Notice(generation=0)
        self.lost_since: float | None = None
        #: Why the coordinator refused the watch for good (a wrong token): raised at
        #: the next ``awaiting_assignment``.
        self.refused: CoordinatorError | None = None
        self.stopping = threading.Event()
        self.watcher = threading.Thread(target=self.watching, name="edl-watch", daemon=True)
        #: Set by SIGTERM: this worker drains itself (see the module docstring).
        self.terminating = False
        self.sigterm_handled = False
        #: What this worker trained in its latest epoch (independent mode), reported to a
        #: coordinator that replaced the one it registered with.
        self.journal = TrainedJournal()

    @property
    def worker_id(self) -> str:
        return self.contract.worker_id

    def starting(self, store_address: str) -> None:
        """Register (retrying while the coordinator is unreachable) and open the watch."""
        self.store_address = store_address
        self.handling_sigterm()
        try:
            self.client.register(self.worker_id, self.contract.node, store_address)
        except BaseException:
            self.releasing_sigterm()  # no `closing` follows a failed start in a session
            raise
        self.watcher.start()

    def handling_sigterm(self) -> None:
        """Make SIGTERM a drain of this worker (the module docstring says what follows). Only
        from the main thread (Python's rule for signal handlers), and only over the default
        handler: a program that handles SIGTERM itself keeps its handler."""
        if threading.current_thread() is not threading.main_thread():
            return
        if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
            return
        signal.signal(signal.SIGTERM, self.terminated)
        self.sigterm_handled = True

    def terminated(self, signum: int, frame: FrameType | None) -> None:
        """The SIGTERM handler: flags only (it runs between two bytecodes of the main
        thread, which may hold any lock); `awaiting_assignment` says it in the log."""
        self.terminating = True
        self.client.retry_s = min(self.client.retry_s, TERMINATING_RETRY_S)

    def releasing_sigterm(self) -> None:
        """Give SIGTERM back to Python's default, if this agent took it (from the main
        thread: elsewhere it stays, harmless once the agent is closed)."""
        if threading.current_thread() is not threading.main_thread():
            return
        if self.sigterm_handled and signal.getsignal(signal.SIGTERM) == self.terminated:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
        self.sigterm_handled = False

    def is_terminating(self) -> bool:
        return self.terminating

    def watching(self) -> None:
        while not self.stopping.is_set():
            try:
                for notice in self.client.watch(self.worker_id):
                    self.notice = notice
                    self.lost_since = None
                    if self.stopping.is_set():
                        return
            except grpc.RpcError as error:
                problem = translating(error)
                if isinstance(problem, TokenRefused):
                    # No retry mends a refused token: said, and told to the training loop
                    # at its next step boundary (``changed``).
                    LOG.error("the coordinator refuses this worker's token: %s", problem)
                    self.refused = problem
                    return
                if isinstance(problem, CoordinatorUnreachable):  # it restarts: quietly
                    LOG.debug("watch stream ended: %s", problem)
                else:
                    LOG.warning("watch stream failed: %s; opening it again", problem)
            except Exception:
                LOG.exception("watch stream failed; opening it again")
            if self.stopping.is_set():
                return
            if self.lost_since is None:
                self.lost_since = time.monotonic()
            self.stopping.wait(RECONNECT_PAUSE_S)

    def changed(self) -> bool:
        """Whether the worker must stop at this step boundary and ask for its generation."""
        return self.changed_since(self.generation)

    def changed_since(self, generation: int) -> bool:
        """Whether anything changed since `generation`: a newer one opened, or this worker
        must stop (drained, terminating, finished, refused, its coordinator replaced)."""
        notice = self.notice
        return bool(notice.generation > generation or not self.only_newer_generation())

    def only_newer_generation(self) -> bool:
        """Whether the only news, if any, is that a newer generation opened: nothing asks
        this worker to stop or to register again (a memory read)."""
        notice = self.notice
        return not (
            self.terminating
            or self.refused is not None
            or notice.generation < 0
            or notice.draining
            or notice.finished
            or self.is_replaced(notice.incarnation)
        )

    def is_replaced(self, incarnation: str) -> bool:
        """Whether `incarnation`, named by a coordinator's answer, is not the one this
        worker registered with."""
        return bool(incarnation) and incarnation != self.client.incarnation

    def awaiting_assignment(self) -> Assignment:
        """The next generation this worker belongs to, or why it must stop; bounded wait."""
        deadline = time.monotonic() + self.contract.timeout_s
        if self.refused is not None:
            raise self.refused
        while True:
            if self.terminating:
                LOG.info("%s: SIGTERM: leaving at this step boundary", self.worker_id)
                return Assignment(Outcome.DRAINED, self.generation)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise CoordinatorUnreachable(
                    f"no generation formed within {self.contract.timeout_s:.0f} s"
                )
            reply = self.client.awaiting_generation(
                self.worker_id, self.generation, timeout_s=min(remaining, 5.0)
            )
            if self.is_replaced(reply.incarnation):
                self.rejoining()
                continue
            if reply.status == pb.PENDING:
                continue
            if reply.status == pb.FENCED:
                self.re_registering()
                continue
            if reply.status == pb.DRAINED:
                return Assignment(Outcome.DRAINED, reply.number)
            if reply.status == pb.FINISHED:
                return Assignment(Outcome.FINISHED, reply.number)
            self.generation = int(reply.number)
            return assignment_of(reply)

    def peeking_assignment(self, timeout_s: float) -> Assignment | None:
        """The newer generation this worker is a member of, asked while it still trains in
        its own, without taking it (`awaiting_assignment` takes it at the step boundary);
        None when there is none within `timeout_s`, or when the answer is anything but a
        membership (a drain, the end, a fence, a replaced coordinator: the boundary's own
        question handles each)."""
        reply = self.client.awaiting_generation(self.worker_id, self.generation, timeout_s)
        if self.is_replaced(reply.incarnation) or reply.status != pb.MEMBER:
            return None
        return assignment_of(reply)

    def rejoining(self) -> None:
        """Register again with the coordinator that replaced the one this worker knew,
        reporting what it may lack; its next generation is newer than this worker's."""
        LOG.info("%s: the coordinator was replaced: registering again", self.worker_id)
        report = Rejoining(self.generation, self.journal.report(), self.journal.last_lease_id)
        self.client.register(self.worker_id, self.contract.node, self.store_address, rejoin=report)
        # The notice of the old incarnation's stream must not look like a replacement.
        self.notice = pb.Notice(generation=self.generation, incarnation=self.client.incarnation)

    def committing_leases(self, leases: Sequence[Any], step_time_s: float) -> None:
        """Commit trained leases (independent mode) and keep them in the journal. A
        coordinator that replaced the one that granted them refuses the commit: they are
        then reported to it with the rest of the journal, which commits them there."""
        try:
            self.client.commit_leases(
                self.worker_id, [lease.lease_id for lease in leases], step_time_s
            )
            replaced = False
        except Reincarnated:
            replaced = True
        for lease in leases:
            samples = SampleRange(lease.range.start, lease.range.stop)
            self.journal.recording(int(lease.epoch), samples, int(lease.lease_id))
        if replaced:
            self.rejoining()

    def re_registering(self) -> None:
        """The coordinator does not know this worker. A worker that was never a member (its
        registration was lost with a coordinator's memory) may register again; a member that
        was removed must not come back with its old state: it is fenced."""
        if self.generation > 0:
            raise Fenced(f"{self.worker_id} was removed from the job; stopping")
        self.client.register(self.worker_id, self.contract.node, self.store_address)

    def leaving(self) -> None:
        """Hand back everything and say goodbye; the coordinator forgets this worker."""
        self.stopping.set()
        try:
            self.client.leave(self.worker_id)
        except CoordinatorUnreachable:
            LOG.warning("could not say goodbye: the coordinator is unreachable")

    def closing(self) -> None:
        self.stopping.set()
        self.releasing_sigterm()
        self.client.close()
        if self.watcher.is_alive():  # never started when registering failed
            self.watcher.join(timeout=1.0)
