"""The background sender of applied step windows, one for every adapter (PyTorch, Paddle and
the parameter-server leader); no framework is imported here.

The training thread hands each applied window over with one `deque.append` (atomic, no
lock, no wake-up); a sender thread sends the waiting windows in one `Commit` call per
generation. The flush rule, the same for every adapter: the sender sends what waits every
`FLUSH_INTERVAL_S`, or at once when `FLUSH_WINDOWS` wait, or when asked (`flushing`).

Why these values: each `Commit` costs the coordinator about the same whatever its size (it
checks the windows against its todo list and saves its whole state, about 14 ms under load),
so one call a second bounds that cost per job whatever the step time; measured with one call
per 0.2 s or 64 windows, the coordinator took 0.45 ms per tiny step and ours cost 1.26 times
DDP's CPU (`docs/runtime.md`, Hot path). The planner reads a job's throughput over much
longer than a second, so the delay costs it nothing. `FLUSH_WINDOWS` is a quarter of
`WINDOWS_KEPT`, the applied windows every data-parallel session keeps for a later reconcile,
so that while the coordinator answers, every window not committed yet is among those kept.

The ledger's correctness does not depend on these values: a step counts only once the
coordinator committed it, and a window waiting here is not counted yet. If rank 0 dies, its
waiting windows are lost with it and the next generation's rank 0 reconciles the ledger with
the step its state has reached (see `CoordinatorState.reconciling`); before a reconcile, a
drain and the end of the walk a session flushes explicitly, so nothing waits on the
interval. A batch of a generation that closed meanwhile is fenced and dropped for the same
reason.

On a GPU the optimizer step is queued on the device when `s.step` returns; a window handed
over with its step's completion (a CUDA event) is sent only once the device ran it, so a
step counts only once its update is in rank 0's memory, with no device-wide wait on the
training thread; steps the device failed are not sent, and the failure is kept
(`DeviceFailed`).

What must stay true: windows go out in the order they were applied; `flushing` returns True
only once every window handed over before the call is answered; a failure other than a
fence is kept in `failure`, for the training thread to raise or ignore at its step
boundary; the step time sent is the batch's mean (`mean_step_time`), counted only between
windows of one generation (the coordinator measures every job's throughput from it, a
parameter-server job's as an allreduce job's, and the planner learns how the job scales).
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from dataclasses import dataclass
from typing import Protocol

from edl_gradients.goodput import BatchLimits
from trainer_runtime.agent import WorkerAgent
from trainer_runtime.client import CoordinatorError, Fenced
from trainer_runtime.noise import NoiseEstimate, noise_message
from trainer_runtime.protocol import pb
from trainer_runtime.sharding import StepWindow

LOG = logging.getLogger(__name__)
#: Send what waits at least this often (see the module docstring for why).
FLUSH_INTERVAL_S = 1.0
#: Send at once when this many windows wait.
FLUSH_WINDOWS = 1024
#: The applied windows each data-parallel worker keeps for the reconcile of a later
#: generation (the same on every rank: rank 0 hands them over when a generation forms): the
#: steps its state holds that the coordinator may lack, not committed yet or lost with a
#: coordinator replaced from an older snapshot (one snapshot period, about 5 s); more are
#: kept to ride out a slow or restarting coordinator.
WINDOWS_KEPT = 4096
#: How far a data-parallel rank 0 may run ahead of its commits' answers, in windows: the
#: windows kept for a reconcile, less one batch that may wait unsent (``waiting_for_answers``).
AHEAD_WINDOWS = WINDOWS_KEPT - FLUSH_WINDOWS
#: The longest the training thread waits for answers before it goes on (and says so).
AHEAD_WAIT_S = 120.0
#: How long `closing` waits for the sender to end (a call in flight ends within its own
#: timeout; this bounds a worker's exit, not the commit).
CLOSING_S = 5.0


@dataclass(frozen=True, slots=True)
class BatchInUse:
    """What rank 0 runs at (`Member.batch_in_use`): the global batch, its accumulation
    steps, and the goodput its batch policy predicts there (samples per second at the
    initial batch's efficiency; 0 when it cannot predict). Sent with the commits, so that
    the planner's model of the job and the runtime's own choice are read side by side.
    ``limits``: the bounds an adaptive batch policy chooses within (None: the batch does not
    adapt); the planner predicts each size at the batch the job would choose there."""

    global_batch: int
    accumulation: int
    goodput: float
    limits: BatchLimits | None = None

    def message(self) -> pb.BatchInUse:
        """As the coordinator protocol carries it (`CommitRequest.batch`)."""
        limits = self.limits
        return pb.BatchInUse(
            global_batch=self.global_batch,
            accumulation=self.accumulation,
            goodput=self.goodput,
            max_batch=0 if limits is None else limits.max_batch,
            max_local=0 if limits is None else limits.max_local,
            min_local=0 if limits is None else limits.min_local,
        )


def mean_step_time(since: float | None, applied: list[float]) -> float:
    """Seconds per step over windows applied at the times ``applied`` (in order), counted
    from ``since`` (the previous window's time, same generation) when known, else from the
    first of them; 0.0 (nothing measured) when no time passed between them."""
    if not applied:
        return 0.0
    if since is not None:
        return max(0.0, applied[-1] - since) / len(applied)
    if len(applied) < 2:
        return 0.0
    return max(0.0, applied[-1] - applied[0]) / (len(applied) - 1)


class Completion(Protocol):
    """The device's work of an applied step (a CUDA event recorded after its optimizer step):
    the sender waits for it before the step counts."""

    def synchronize(self) -> None: ...


class DeviceFailed(RuntimeError):
    """The device failed applied steps before they ran (a CUDA error): they are not
    committed, and the training thread stops at its next step boundary."""


class Committer:
    """Sends the windows that `enqueue` hands over, in batches, from its own thread.

    `retry`: whether a call rides out an unreachable coordinator within the client's retry
    budget (the data-parallel sessions) or gives up at once, leaving the windows to the next
    reconcile (the parameter-server leader, which never waits on its commits)."""

    def __init__(
        self,
        agent: WorkerAgent,
        *,
        retry: bool = True,
        name: str = "edl-commit",
        ahead: int | None = None,
    ):
        self.agent = agent
        self.retry = retry
        self.ahead = ahead
        self.waiting: deque[tuple[int, StepWindow, float, Completion | None]] = deque()
        self.handed = 0  # windows handed over; written by the training thread only
        self.answered = 0  # windows answered (committed or fenced); by the sender only
        self.answers = threading.Condition()
        self.hurry = threading.Event()
        self.closed = False
        self.failure: CoordinatorError | DeviceFailed | None = None
        # the job's gradient statistics now, set by the training thread (one assignment)
        # and sent with the next batch of windows
        self.noise: NoiseEstimate | None = None
        # what rank 0 runs at now, set and sent the same way
        self.batch: BatchInUse | None = None
        # (generation, when applied) of the last window sent: where the next batch's step
        # time is counted from; the sender's only
        self.last_sent: tuple[int, float] | None = None
        self.thread = threading.Thread(target=self.sending, name=name, daemon=True)
        self.thread.start()

    def enqueue(
        self,
        generation: int,
        window: StepWindow,
        applied_at: float,
        done: Completion | None = None,
    ) -> None:
        """Hand over one window applied at `applied_at` (`time.monotonic()`); the hot path:
        no lock, no RPC. `done`: the step's device work, queued and maybe not run yet (a
        CUDA event); the window is sent once it completed."""
        self.waiting.append((generation, window, applied_at, done))
        self.handed += 1
        if len(self.waiting) == FLUSH_WINDOWS:
            self.hurry.set()
        if self.ahead is not None and self.handed - self.answered >= self.ahead:
            self.waiting_for_answers(self.ahead)

    def waiting_for_answers(self, ahead: int) -> None:
        """The hot path's one wait: a worker ``ahead`` windows past the coordinator's
        answers waits until it is at most half that ahead. The windows not answered yet are
        what a later reconcile must carry, from the windows every worker keeps
        (``WINDOWS_KEPT``); a rank 0 stepping faster than its coordinator commits (a slow or
        restarting coordinator) ran past them, and the job could never form a generation
        again. Every call is answered within the client's own timeout (committed, fenced or
        failed), so this wait ends; ``AHEAD_WAIT_S`` bounds it should the sender be gone."""
        self.hurry.set()
        with self.answers:
            caught_up = self.answers.wait_for(
                lambda: self.closed or self.handed - self.answered <= ahead // 2, AHEAD_WAIT_S
            )
        if not caught_up:
            LOG.warning("%d windows still unanswered after %.0f s", ahead, AHEAD_WAIT_S)

    def sending(self) -> None:
        while not self.closed:
            self.hurry.wait(FLUSH_INTERVAL_S)
            self.hurry.clear()
            while self.waiting and not self.closed:
                self.sending_batch()

    def sending_batch(self) -> None:
        """Send the windows of the oldest waiting generation that are waiting now."""
        generation = self.waiting[0][0]
        batch: list[StepWindow] = []
        applied: list[float] = []
        last_done: Completion | None = None
        while self.waiting and self.waiting[0][0] == generation:
            _, window, applied_at, done = self.waiting.popleft()
            batch.append(window)
            applied.append(applied_at)
            last_done = done or last_done
        last = self.last_sent
        since = last[1] if last is not None and last[0] == generation else None
        self.last_sent = (generation, applied[-1])
        in_use = self.batch
        try:
            self.waiting_for_device(last_done)
            self.agent.client.commit(
                self.agent.worker_id,
                generation,
                batch,
                mean_step_time(since, applied),
                noise=noise_message(self.noise),
                retry=self.retry,
                batch=None if in_use is None else in_use.message(),
            )
        except Fenced:
            LOG.info("commits of generation %d fenced; the next reconcile carries them", generation)
        except CoordinatorError as error:
            LOG.info("commit of %d windows failed: %s", len(batch), error)
            self.failure = error
        except ValueError:  # the session closed its channel: nothing more can be sent
            self.closed = True
        except DeviceFailed as error:  # the steps never count: the worker stops
            LOG.warning("the device failed %d applied steps: %s", len(batch), error)
            self.failure = error
        with self.answers:
            self.answered += len(batch)
            self.answers.notify_all()

    @staticmethod
    def waiting_for_device(done: Completion | None) -> None:
        """Wait until the device ran a batch's steps (in order: the last one's completion
        is every earlier one's too); `DeviceFailed` when it failed them."""
        if done is None:
            return
        try:
            done.synchronize()
        except RuntimeError as error:
            raise DeviceFailed(str(error)) from error

    def flushing(self, timeout_s: float) -> bool:
        """Send what is waiting now; whether it was all answered within `timeout_s`."""
        target = self.handed
        self.hurry.set()
        with self.answers:
            return self.answers.wait_for(lambda: self.answered >= target, timeout_s)

    def closing(self, timeout_s: float = CLOSING_S) -> None:
        """Stop sending (what still waits is left to the next reconcile), and let the sender
        end within `timeout_s`: a sender still waking at the interpreter's exit would be
        killed there, which aborts a process that hosts a framework's threads (seen with
        Paddle: `terminate called without an active exception`)."""
        self.closed = True
        self.hurry.set()
        if self.thread is not threading.current_thread():
            self.thread.join(timeout_s)
