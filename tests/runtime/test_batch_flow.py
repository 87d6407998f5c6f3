"""What flows back from a job about its batch: the coordinator's throughput records and
what rank 0 reports it runs at.

Aspects:
- a size's throughput record carries the global batch it was measured at (a committed
  window's samples); another batch at that size starts the record again; an epoch's last
  window (what was left, shorter) neither resets nor pollutes it;
- what rank 0 runs at (`BatchInUse`) rides a commit to `Progress`; an invalid report is
  dropped, the commit lands;
- both survive the state's JSON, and a state saved before them loads (batch 0, none);
- the committer sends the latest report; a worker computes it from its policy (an adaptive
  one's decision and predicted goodput, another's batch with no goodput).
"""

from __future__ import annotations

import json
import logging
import threading
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import pytest

from edl_gradients.goodput import BatchLimits, StepTimes, gain
from trainer_runtime import adaptive, generations
from trainer_runtime.batching import KeepGlobalBatch
from trainer_runtime.client import CoordinatorClient
from trainer_runtime.committing import BatchInUse, Committer
from trainer_runtime.coordinator.records import BatchRecord
from trainer_runtime.coordinator.serving import CoordinatorServer, CoordinatorService
from trainer_runtime.coordinator.state import CoordinatorState
from trainer_runtime.coordinator.storing import MemoryStore
from trainer_runtime.noise import NoiseEstimate
from trainer_runtime.protocol import pb
from trainer_runtime.sharding import DatasetPlan, StepWindow, Walk

from .harness import TOKEN, VERIFIER


def group_state(samples: int = 10) -> CoordinatorState:
    state = CoordinatorState.starting(DatasetPlan(samples, 2, 2, seed=7), join_window_s=0.2)
    state.registering("w0", "node-a", "w0:1", now=0.0)
    state.ticking(now=1.0)
    return state


def windows(state: CoordinatorState, batch: int, count: int) -> list[StepWindow]:
    """The next `count` windows rank 0 would cut at global `batch`."""
    ledger = state.ledger
    walk = Walk(ledger.plan, ledger.epoch, ledger.committed_step, list(ledger.todo))
    cut = [walk.next_window(batch) for _ in range(count)]
    assert all(w is not None for w in cut)
    return [w for w in cut if w is not None]


def committing(state: CoordinatorState, cut: list[StepWindow], step_time_s: float) -> None:
    state.committing_windows("w0", state.membership.generation, cut, step_time_s)


def record(state: CoordinatorState) -> tuple[int, int, float]:
    """(batch, steps, samples/s) of the state's only size."""
    (only,) = state.throughput.values()
    return only.batch, only.steps, round(only.samples_per_s, 6)


def test_a_record_carries_its_batch_and_starts_again_when_the_batch_changes() -> None:
    state = group_state(samples=40)
    committing(state, windows(state, 4, 2), 0.1)
    assert record(state) == (4, 1, 40.0)
    committing(state, windows(state, 4, 1), 0.2)  # smoothed: 40 + 0.2 * (20 - 40)
    assert record(state) == (4, 2, 36.0)
    committing(state, windows(state, 8, 1), 0.1)  # another batch: not smoothed into 36
    assert record(state) == (8, 1, 80.0)


def test_an_epochs_short_last_window_neither_resets_nor_pollutes_the_record() -> None:
    state = group_state(samples=10)  # at batch 4: windows of 4, 4, then the 2 left
    committing(state, windows(state, 4, 1), 0.1)
    first, short = windows(state, 4, 2)
    assert len(first.ranges) and sum(r.stop - r.start for r in short.ranges) == 2
    committing(state, [first, short], 0.1)  # the record is the last whole window's
    assert record(state) == (4, 2, 40.0)
    assert state.ledger.epoch == 1
    alone = group_state(samples=10)
    committing(alone, windows(alone, 4, 2), 0.1)
    committing(alone, windows(alone, 4, 1), 0.05)  # only the short window: not recorded
    assert record(alone) == (4, 1, 40.0)


def test_the_batch_in_use_is_kept_an_invalid_report_dropped(
    caplog: pytest.LogCaptureFixture,
) -> None:
    state = group_state(samples=40)
    generation = state.membership.generation
    good = BatchRecord(16, 2, 123.5)
    state.committing_windows("w0", generation, windows(state, 4, 1), 0.1, batch=good)
    with caplog.at_level(logging.WARNING):
        bad = BatchRecord(0, 1, 10.0)
        state.committing_windows("w0", generation, windows(state, 4, 1), 0.1, batch=bad)
        state.committing_windows(
            "w0", generation, windows(state, 4, 1), 0.1, batch=BatchRecord(8, 1, float("nan"))
        )
        unbounded = BatchRecord(8, 1, 10.0, max_batch=64, max_local=4, min_local=8)
        state.committing_windows("w0", generation, windows(state, 4, 1), 0.1, batch=unbounded)
    assert caplog.text.count("batch in use dropped") == 3
    assert "min_local (8) and max_local (4)" in caplog.text
    assert state.ledger.committed_step == 4  # the commits landed all the same
    assert state.batch == good


def test_batches_survive_the_state_json_and_an_older_state_loads() -> None:
    state = group_state(samples=40)
    generation = state.membership.generation
    bounded = BatchRecord(8, 2, 50.0, max_batch=64, max_local=4, min_local=1)
    state.committing_windows("w0", generation, windows(state, 8, 1), 0.1, batch=bounded)
    restored = CoordinatorState.from_json(state.to_json(), now=5.0)
    assert record(restored) == record(state) == (8, 1, 80.0)
    assert restored.batch == bounded
    before_bounds = json.loads(state.to_json())
    before_bounds["batch"] = before_bounds["batch"][:3]  # saved before the bounds were kept
    assert CoordinatorState.from_json(json.dumps(before_bounds), now=5.0).batch == BatchRecord(
        8, 2, 50.0
    )
    older = json.loads(state.to_json())
    older["throughput"] = [row[:5] for row in older["throughput"]]  # before the batch
    del older["batch"]
    legacy = CoordinatorState.from_json(json.dumps(older), now=5.0)
    assert record(legacy) == (0, 1, 80.0)
    assert legacy.batch is None
    committing(legacy, windows(legacy, 8, 1), 0.2)  # a measured batch starts it again
    assert record(legacy) == (8, 1, 40.0)


def test_a_commits_batch_in_use_reaches_progress() -> None:
    state = CoordinatorState.starting(DatasetPlan(40, 4, 1), join_window_s=0.05)
    server = CoordinatorServer(CoordinatorService(state, MemoryStore(), VERIFIER)).start()
    client = CoordinatorClient(server.address, TOKEN, timeout_s=2.0, retry_s=2.0)
    try:
        client.register("w0", "node-a", "")
        generation = client.awaiting_generation("w0", 0, 2.0).number
        assert not client.progress().HasField("batch")
        in_use = pb.BatchInUse(
            global_batch=8, accumulation=2, goodput=321.0, max_batch=64, max_local=8, min_local=1
        )
        client.commit("w0", generation, windows(state, 8, 1), 0.1, batch=in_use)
        progress = client.progress()
        assert progress.HasField("batch") and progress.batch == in_use
        assert [(t.workers, t.batch) for t in progress.throughput] == [(1, 8)]
    finally:
        client.close()
        server.stop(0.1)


class RecordingClient:
    def __init__(self) -> None:
        self.batches: list[Any] = []
        self.called = threading.Event()

    def commit(self, *args: Any, **options: Any) -> None:
        self.batches.append(options.get("batch"))
        self.called.set()


def test_the_committer_sends_the_latest_batch_in_use() -> None:
    client = RecordingClient()
    committer = Committer(SimpleNamespace(client=client, worker_id="w0"))  # type: ignore[arg-type]
    try:
        committer.batch = BatchInUse(32, 4, 12.5)
        committer.enqueue(1, StepWindow(1, 0, ()), 1.0)
        assert committer.flushing(5.0)
        committer.batch = BatchInUse(32, 4, 12.5, BatchLimits(8, 512, 16, 2))
        committer.enqueue(2, StepWindow(2, 0, ()), 1.0)
        assert committer.flushing(5.0)
        assert client.batches == [
            pb.BatchInUse(global_batch=32, accumulation=4, goodput=12.5),
            pb.BatchInUse(
                global_batch=32,
                accumulation=4,
                goodput=12.5,
                max_batch=512,
                max_local=16,
                min_local=2,
            ),
        ]
    finally:
        committer.closing()


@dataclass(slots=True)
class Adaptive(adaptive.AdaptiveBatch[object]):
    """A framework-free adaptive policy: no optimizer is stepped here."""

    def read_lr(self, optimizer: object) -> float:
        return 0.1

    def set_lr(self, optimizer: object, lr: float) -> None:
        return None

    def rescale_momentum(self, optimizer: object, factor: float) -> None:
        return None


@dataclass(slots=True)
class Accumulating:
    samples: int

    def global_batch(self, world_size: int) -> int:
        return self.samples

    def accumulation(self, world_size: int) -> int:
        return 3


def batch_in_use(policy: Any, noise: NoiseEstimate | None, world_size: int) -> BatchInUse:
    """`Member.batch_in_use` on a member holding only a policy and a noise estimate."""
    member = SimpleNamespace(policy=policy, noise=SimpleNamespace(estimate=lambda: noise))
    return generations.Member.batch_in_use(member, world_size)  # type: ignore[arg-type]


def test_a_worker_reports_its_policys_batch_and_goodput() -> None:
    assert batch_in_use(KeepGlobalBatch(24), None, 4) == BatchInUse(24, 1, 0.0)
    assert batch_in_use(Accumulating(24), None, 4) == BatchInUse(24, 3, 0.0)
    policy = Adaptive(initial_batch=64, max_batch=4096, max_local=256, base_lr=0.1)
    noise = NoiseEstimate(64, 1.0, 50.0, steps=100)
    # No step time yet; the bounds it adapts within, for the planner's model.
    assert batch_in_use(policy, noise, 4) == BatchInUse(64, 1, 0.0, policy.limits)
    assert policy.limits == BatchLimits(64, 4096, 256)
    model = StepTimes(fixed=1.0, per_sample=0.0001, alpha=0.5, beta=0.0)
    for _ in range(3):
        policy.observing(4, model.step_time(4, 16, 1))
    policy.deciding(4, noise, now=0.0)
    chosen = policy.decision(4)
    seconds = model.step_time(4, chosen.local, chosen.accumulation)
    for _ in range(3):  # measured at the batch in force: the prediction is the measurement
        policy.observing(4, seconds)
    batch = chosen.local * chosen.accumulation * 4
    expected = 64 * gain(64, 1.0, 50.0, batch) / seconds  # samples/s at the initial batch
    reported = batch_in_use(policy, noise, 4)
    assert reported.global_batch == policy.global_batch(4) == batch
    assert reported.accumulation == chosen.accumulation
    assert reported.goodput == pytest.approx(expected)
    assert reported.global_batch > 64 and reported.goodput > 0
    few = NoiseEstimate(64, 1.0, 50.0, steps=adaptive.MIN_NOISE_STEPS - 1)
    assert batch_in_use(policy, few, 4).goodput == 0.0  # noise the policy does not use yet
