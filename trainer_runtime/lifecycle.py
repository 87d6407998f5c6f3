"""A worker session's life as a context manager, the same for every adapter (the PyTorch and
Paddle data-parallel sessions and the parameter-server worker): register on entering, and
on leaving stop the committer, say goodbye when the worker is really done, close the
coordinator client, and let the framework's resources go.

Why in this order: the committer stops first (after its last commits landed, where an
adapter asks for that: `closing_flush_s`), so that no commit is sent for a worker that has
already left, whose generation may have closed meanwhile; goodbye comes before the client
closes; the framework's group goes last, after everything that might still use it.

What must stay true: a worker says goodbye (`agent.leaving`) only when it ended as the job
meant it to (`ended_cleanly`): a worker that fails says nothing, so that its departure is
what the coordinator's lease finds, and its peers re-form without it; the session closes
the client and releases its resources however it ends.
"""

from __future__ import annotations

import abc
import logging
from types import TracebackType
from typing import ClassVar, Self

from trainer_runtime.agent import WorkerAgent
from trainer_runtime.committing import Committer

LOG = logging.getLogger(__name__)


class WorkerSession(abc.ABC):
    """A session's entry and exit; a framework's session says what it prepares, where its
    peers reach it, and what it releases (the hooks)."""

    agent: WorkerAgent
    #: Rank 0's (or the leader's) committer, once there is one.
    committer: Committer | None
    #: How long leaving waits for the commits still waiting to be answered (0: not at all).
    closing_flush_s: ClassVar[float] = 0.0

    @property
    @abc.abstractmethod
    def store_address(self) -> str:
        """Where this worker's peers reach it to form a group (registered on entering)."""

    def preparing(self) -> None:
        """What to do before asking to join (nothing by default)."""
        return None

    def started(self) -> None:
        """What to do once registered (nothing by default)."""
        return None

    def ended_cleanly(self, kind: type[BaseException] | None) -> bool:
        """Whether a session left with `kind` (None: no exception) says goodbye."""
        return kind is None

    def releasing(self) -> None:
        """Let the framework's resources go (nothing by default)."""
        return None

    def __enter__(self) -> Self:
        self.preparing()
        self.agent.starting(self.store_address)
        self.started()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        if self.committer is not None:
            if self.closing_flush_s > 0:
                self.committer.flushing(self.closing_flush_s)
            self.committer.closing()
        if self.ended_cleanly(kind):
            self.agent.leaving()
        self.agent.closing()
        self.releasing()
