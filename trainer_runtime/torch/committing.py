"""Rank 0's background sender of applied step windows.

The training thread hands each applied window over with one `deque.append` (atomic, no
lock, no wake-up); a sender thread wakes every `COMMIT_INTERVAL_S` (or as soon as
`COMMIT_BATCH` windows wait) and sends all waiting windows in one `Commit` call. So the
coordinator sees about one call a second whatever the step time, and the training thread
never waits for an RPC.

A step counts only once the coordinator has committed it: a window waiting here is not
counted yet. If the worker dies, its waiting windows are lost with it, and the next
generation's rank 0 reconciles the ledger with the step its state has reached (see
`CoordinatorState.reconciling`), so nothing is lost or repeated. A batch of a generation
that closed meanwhile is fenced and dropped for the same reason.

What must stay true: windows go out in the order they were applied; `flushing` returns True
only once every window handed over before the call is answered; a failure other than a
fence is kept in `failure`, for the training thread to raise at its next step boundary.
"""

from __future__ import annotations

import logging
import threading
from collections import deque

from trainer_runtime.agent import WorkerAgent
from trainer_runtime.client import CoordinatorError, Fenced
from trainer_runtime.noise import NoiseEstimate, noise_message
from trainer_runtime.sharding import StepWindow

LOG = logging.getLogger(__name__)
# Each `Commit` costs the coordinator about the same whatever its size (it checks the windows
# against its todo list and saves its whole state), so windows are sent once a second, or
# sooner when 1024 wait (a quarter of what the session keeps for a reconcile).
COMMIT_INTERVAL_S = 1.0
COMMIT_BATCH = 1024


class Committer:
    """Sends the windows that `enqueue` hands over, in batches, from its own thread."""

    def __init__(self, agent: WorkerAgent) -> None:
        self.agent = agent
        self.waiting: deque[tuple[int, StepWindow, float]] = deque()
        self.handed = 0  # windows handed over; written by the training thread only
        self.answered = 0  # windows answered (committed or fenced); by the sender only
        self.answers = threading.Condition()
        self.hurry = threading.Event()
        self.closed = False
        self.failure: CoordinatorError | None = None
        # the job's gradient statistics now, set by the training thread (one assignment)
        # and sent with the next batch of windows
        self.noise: NoiseEstimate | None = None
        self.thread = threading.Thread(target=self.sending, name="edl-commit", daemon=True)
        self.thread.start()

    def enqueue(self, generation: int, window: StepWindow, step_time_s: float) -> None:
        """Hand over one applied window (the hot path: no lock, no RPC)."""
        self.waiting.append((generation, window, step_time_s))
        self.handed += 1
        if len(self.waiting) == COMMIT_BATCH:
            self.hurry.set()

    def sending(self) -> None:
        while not self.closed:
            self.hurry.wait(COMMIT_INTERVAL_S)
            self.hurry.clear()
            while self.waiting and not self.closed:
                self.sending_batch()

    def sending_batch(self) -> None:
        """Send the windows of the oldest waiting generation that are waiting now."""
        generation = self.waiting[0][0]
        batch: list[StepWindow] = []
        step_time_s = 0.0
        while self.waiting and self.waiting[0][0] == generation:
            _, window, step_time_s = self.waiting.popleft()
            batch.append(window)
        try:
            self.agent.client.commit(
                self.agent.worker_id,
                generation,
                batch,
                step_time_s,
                noise=noise_message(self.noise),
            )
        except Fenced:
            LOG.info("commits of generation %d fenced; the next reconcile carries them", generation)
        except CoordinatorError as error:
            self.failure = error
        except ValueError:  # the session closed its channel: nothing more can be sent
            self.closed = True
        with self.answers:
            self.answered += len(batch)
            self.answers.notify_all()

    def flushing(self, timeout_s: float) -> bool:
        """Send what is waiting now; whether it was all answered within `timeout_s`."""
        target = self.handed
        self.hurry.set()
        with self.answers:
            return self.answers.wait_for(lambda: self.answered >= target, timeout_s)

    def closing(self) -> None:
        self.closed = True
        self.hurry.set()
