"""The flush rule and the lag bound of the committer every adapter uses
(`trainer_runtime/committing.py`).

Aspects:
- fewer than `FLUSH_WINDOWS` waiting windows are not sent before `FLUSH_INTERVAL_S`;
- the `FLUSH_WINDOWS`-th window sends them all at once, well before the interval;
- a lone window goes out within the interval, unasked;
- a batch carries its mean step time, counted from the last window sent of its generation;
- the windows of each generation go out in their own call, oldest generation first;
- a rank 0 whose commits go unanswered waits once it is `ahead` windows past them;
- a window handed over with its step's device work (a CUDA event) is sent only once that
  work ran, waiting on the last one of the batch; steps the device failed are not sent,
  and the failure is kept for the training thread.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from trainer_runtime.committing import FLUSH_INTERVAL_S, FLUSH_WINDOWS, Committer, DeviceFailed
from trainer_runtime.sharding import SampleRange, StepWindow


class RecordingClient:
    """Answers every `Commit` at once and records what it carried and when."""

    def __init__(self) -> None:
        self.calls: list[tuple[float, int, list[StepWindow], float]] = []
        self.called = threading.Event()
        self.started = 0.0  # when the committer's sender started its first interval

    def commit(
        self,
        worker_id: str,
        generation: int,
        windows: list[StepWindow],
        step_time_s: float,
        **options: Any,
    ) -> None:
        self.calls.append((time.monotonic(), generation, list(windows), step_time_s))
        self.called.set()


@pytest.fixture
def sent() -> Iterator[tuple[Committer, RecordingClient]]:
    client = RecordingClient()
    client.started = time.monotonic()
    committer = Committer(SimpleNamespace(client=client, worker_id="w0"))  # type: ignore[arg-type]
    time.sleep(0.01)  # the sender is asleep in its interval, as it mostly is
    yield committer, client
    committer.closing()


def window(step: int) -> StepWindow:
    return StepWindow(step, 0, (SampleRange(step * 4, step * 4 + 4),))


def test_fewer_windows_than_the_bound_wait_and_the_bound_sends_them_at_once(
    sent: tuple[Committer, RecordingClient],
) -> None:
    committer, client = sent
    for step in range(1, FLUSH_WINDOWS):
        committer.enqueue(1, window(step), float(step))
    quiet = client.started + 0.8 * FLUSH_INTERVAL_S - time.monotonic()
    assert not client.called.wait(quiet), "sent before its interval"
    handed = time.monotonic()
    committer.enqueue(1, window(FLUSH_WINDOWS), float(FLUSH_WINDOWS))
    assert client.called.wait(FLUSH_INTERVAL_S / 2), "the bound did not send at once"
    when, generation, windows, _ = client.calls[0]
    assert when - handed < FLUSH_INTERVAL_S / 2
    assert generation == 1
    assert [w.step for w in windows] == list(range(1, FLUSH_WINDOWS + 1))


def test_a_lone_window_goes_out_within_the_interval(
    sent: tuple[Committer, RecordingClient],
) -> None:
    committer, client = sent
    committer.enqueue(1, window(1), 0.0)
    assert client.called.wait(FLUSH_INTERVAL_S + 0.5)
    assert committer.answered == 1


def test_a_batch_carries_its_mean_step_time_and_each_generation_its_own_call(
    sent: tuple[Committer, RecordingClient],
) -> None:
    committer, client = sent
    for step, at in ((1, 10.0), (2, 10.5), (3, 11.0)):
        committer.enqueue(1, window(step), at)
    assert committer.flushing(5.0)
    for step, at in ((4, 12.0), (5, 12.0)):
        committer.enqueue(1, window(step), at)
    committer.enqueue(2, window(6), 20.0)
    assert committer.flushing(5.0)
    assert [(g, [w.step for w in ws], t) for _, g, ws, t in client.calls] == [
        (1, [1, 2, 3], pytest.approx(0.5)),  # from the first window: 1 s over 2 steps
        (1, [4, 5], pytest.approx(0.5)),  # from step 3's 11.0: 1 s over 2 steps
        (2, [6], 0.0),  # a new generation: nothing to count from
    ]


class HeldClient(RecordingClient):
    """Answers no `Commit` until `release` is set: a coordinator that is slow or away."""

    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()

    def commit(self, *args: Any, **options: Any) -> None:
        assert self.release.wait(30), "the test never released the coordinator"
        super().commit(*args, **options)


def test_rank_0_waits_before_it_runs_further_ahead_than_it_may() -> None:
    """Past the windows every worker keeps, a reconcile could no longer carry what the
    coordinator lacks, and the job could never form a generation again: a rank 0 that is
    `ahead` windows past the coordinator's answers waits until it is half that."""
    client = HeldClient()
    committer = Committer(SimpleNamespace(client=client, worker_id="w0"), ahead=8)  # type: ignore[arg-type]
    done = threading.Event()

    def training() -> None:
        for step in range(1, 21):
            committer.enqueue(1, window(step), float(step))
        done.set()

    thread = threading.Thread(target=training, daemon=True)
    try:
        thread.start()
        assert not done.wait(1.0), "rank 0 ran on while the coordinator did not answer"
        assert committer.handed == 8
        client.release.set()
        assert done.wait(10.0)
        assert committer.flushing(10.0)
        assert [w.step for _, _, ws, _ in client.calls for w in ws] == list(range(1, 21))
    finally:
        client.release.set()
        committer.closing()


class DeviceWork:
    """A step's queued device work (a CUDA event's stand-in): `synchronize` waits until
    the test lets the device finish."""

    def __init__(self) -> None:
        self.ran = threading.Event()
        self.waited = False

    def synchronize(self) -> None:
        self.waited = True
        assert self.ran.wait(30), "the test never let the device finish"


def test_a_step_counts_only_once_its_device_work_ran(
    sent: tuple[Committer, RecordingClient],
) -> None:
    committer, client = sent
    works = [DeviceWork(), DeviceWork()]
    for step, work in enumerate(works, start=1):
        committer.enqueue(1, window(step), float(step), work)
    committer.hurry.set()
    assert not client.called.wait(0.3), "sent before the device ran the step"
    assert works[-1].waited and not works[0].waited  # the last one's completion is enough
    works[-1].ran.set()
    assert committer.flushing(5.0)
    assert [w.step for w in client.calls[0][2]] == [1, 2]


class FailedWork:
    """A step's device work that the device failed (a CUDA error at `synchronize`)."""

    def synchronize(self) -> None:
        raise RuntimeError("CUDA error: an illegal memory access was encountered")


def test_steps_the_device_failed_are_not_committed_and_stop_the_worker(
    sent: tuple[Committer, RecordingClient],
) -> None:
    committer, client = sent
    committer.enqueue(1, window(1), 1.0, FailedWork())
    assert committer.flushing(5.0), "the sender stopped answering"
    assert client.calls == []
    assert isinstance(committer.failure, DeviceFailed)
    committer.enqueue(1, window(2), 2.0)  # the sender still runs
    assert committer.flushing(5.0) and [w.step for w in client.calls[0][2]] == [2]
