"""Rank 0's background sender of applied step windows, for the Paddle adapter.

The same behaviour as the PyTorch adapter's committer (`trainer_runtime.torch.session`),
kept framework-free here so that a Paddle job never imports torch: one `Commit` call
carries the windows of up to `COMMIT_INTERVAL_S` (or `COMMIT_BATCH` windows), so the
coordinator sees a few calls a second whatever the step time, and the training thread
never waits for an RPC.

What must stay true: a fenced batch is dropped, never retried into a newer generation (the
next generation's reconcile carries it); `flushing` tells whether everything queued was
acknowledged within its bound.
"""

from __future__ import annotations

import logging
import queue
import threading

from trainer_runtime.agent import WorkerAgent
from trainer_runtime.client import CoordinatorError, Fenced
from trainer_runtime.noise import NoiseEstimate, noise_message
from trainer_runtime.sharding import StepWindow

LOG = logging.getLogger(__name__)
COMMIT_INTERVAL_S = 0.2
COMMIT_BATCH = 64


class Committer:
    """Sends (generation, window, step time) triples in batches from its own thread."""

    def __init__(self, agent: WorkerAgent) -> None:
        self.agent = agent
        self.queue: queue.Queue[tuple[int, StepWindow, float]] = queue.Queue()
        self.idle = threading.Event()
        self.idle.set()
        self.hurry = threading.Event()
        self.failure: BaseException | None = None
        # the job's gradient statistics now, set by the training thread (one assignment)
        # and sent with the next batch of windows
        self.noise: NoiseEstimate | None = None
        self.thread = threading.Thread(target=self.sending, name="edl-commit", daemon=True)
        self.thread.start()

    def enqueue(self, generation: int, window: StepWindow, step_time_s: float) -> None:
        self.idle.clear()
        self.queue.put((generation, window, step_time_s))
        if self.queue.qsize() >= COMMIT_BATCH:
            self.hurry.set()

    def sending(self) -> None:
        while True:
            batch = [self.queue.get()]
            self.hurry.wait(COMMIT_INTERVAL_S)
            self.hurry.clear()
            while not self.queue.empty():
                batch.append(self.queue.get_nowait())
            generation = batch[-1][0]
            windows = [w for g, w, _ in batch if g == generation]
            try:
                self.agent.client.commit(
                    self.agent.worker_id,
                    generation,
                    windows,
                    batch[-1][2],
                    noise=noise_message(self.noise),
                )
            except Fenced:
                LOG.info(
                    "commits of generation %d fenced; the next reconcile carries them", generation
                )
            except CoordinatorError as error:
                self.failure = error
            except ValueError:  # the session closed its channel: nothing more to send
                self.idle.set()
                return
            if self.queue.empty():
                self.idle.set()

    def flushing(self, timeout_s: float) -> bool:
        """Send what is queued now; whether it was all sent within `timeout_s`."""
        self.hurry.set()
        return self.idle.wait(timeout_s)
