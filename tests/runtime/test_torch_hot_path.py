"""What the PyTorch adapter does on every step, beside DistributedDataParallel.

Aspects:
- `slice_of` cuts exactly this rank's part of `splitting_among`, without the others;
- a walk cuts the windows `taking_window` cuts from the rest of the todo list, across
  epochs, from a cursor (no copy of the list per step);
- rank 0's committer sends handed-over windows in order, and `flushing` returns once the
  coordinator answered them (the step is then committed in the ledger);
- a batch of a closed generation is dropped (the next reconcile carries it), while any
  other refusal is kept for the training thread, which raises it at its next step boundary;
- in a real session (one worker, in-process coordinator), commits that cannot reach the
  coordinator stop the worker with `CommitFailed` instead of training on uncounted steps.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch import nn
from torch.utils.data import TensorDataset

from trainer_runtime.agent import WorkerAgent
from trainer_runtime.client import CoordinatorClient, LedgerConflict
from trainer_runtime.committing import Committer
from trainer_runtime.coordinator.serving import CoordinatorServer, CoordinatorService
from trainer_runtime.coordinator.state import CoordinatorState
from trainer_runtime.coordinator.storing import MemoryStore
from trainer_runtime.environment import WorkerContract
from trainer_runtime.sharding import (
    DatasetPlan,
    SampleRange,
    StepWindow,
    Walk,
    slice_of,
    splitting_among,
    taking_window,
)
from trainer_runtime.torch import KeepGlobalBatch, session
from trainer_runtime.torch.session import CommitFailed

from .harness import TOKEN, VERIFIER


@st.composite
def windows(draw: st.DrawFn) -> list[SampleRange]:
    """Disjoint ranges in any order, as a todo list hands them out."""
    lengths = draw(st.lists(st.integers(1, 9), min_size=1, max_size=6))
    gaps = draw(st.lists(st.integers(0, 3), min_size=len(lengths), max_size=len(lengths)))
    ranges, start = [], 0
    for length, gap in zip(lengths, gaps, strict=True):
        start += gap
        ranges.append(SampleRange(start, start + length))
        start += length
    return draw(st.permutations(ranges))


@given(window=windows(), parts=st.integers(1, 12))
def test_slice_of_is_the_part_splitting_among_cuts(window: list[SampleRange], parts: int) -> None:
    expected = splitting_among(window, parts)
    assert [slice_of(window, parts, part) for part in range(parts)] == expected


@given(
    samples=st.integers(1, 300),
    shard=st.integers(1, 40),
    epochs=st.integers(1, 3),
    batches=st.lists(st.integers(1, 50), min_size=1, max_size=8),
)
def test_a_walk_cuts_the_windows_of_taking_window(
    samples: int, shard: int, epochs: int, batches: list[int]
) -> None:
    """The walk's cursor (a step's cost independent of the dataset's size) cuts the same
    windows, epoch after epoch, as `taking_window` applied to the rest of the list."""
    plan = DatasetPlan(samples, shard, epochs, seed=7)
    walk = Walk(plan, 0, 0, plan.epoch_order(0))
    epoch, todo = 0, plan.epoch_order(0)
    for index in range(samples * epochs + 2):
        batch = batches[index % len(batches)]
        while not todo and epoch < epochs:
            epoch += 1
            todo = plan.epoch_order(epoch) if epoch < epochs else []
        got = walk.next_window(batch)
        if not todo:
            assert got is None
            return
        taken, todo = taking_window(todo, batch)
        assert got == StepWindow(index + 1, epoch, tuple(taken))
    raise AssertionError("the walk never ended")


def test_slice_of_refuses_a_part_out_of_range() -> None:
    with pytest.raises(ValueError, match="part 2 is not one of 2 parts"):
        slice_of([SampleRange(0, 4)], 2, 2)


@pytest.fixture
def group() -> Iterator[tuple[CoordinatorServer, WorkerAgent]]:
    """A group-mode coordinator (64 samples, shards of 8) whose generation 1 is `w0` alone."""
    state = CoordinatorState.starting(DatasetPlan(64, 8, 1), join_window_s=0.05)
    server = CoordinatorServer(CoordinatorService(state, MemoryStore(), VERIFIER)).start()
    client = CoordinatorClient(server.address, TOKEN, timeout_s=2.0, retry_s=2.0)
    contract = WorkerContract(server.address, TOKEN, "job", "w0", "node-a", timeout_s=5.0)
    agent = WorkerAgent(contract, client)
    client.register("w0", "node-a", "")
    assert client.awaiting_generation("w0", 0, 2.0).number == 1
    yield server, agent
    client.close()
    server.stop(0.1)


def walking(server: CoordinatorServer, steps: int) -> list[StepWindow]:
    ledger = server.service.state.ledger
    walk = Walk(ledger.plan, epoch=ledger.epoch, step=0, todo=list(ledger.todo))
    cut = [walk.next_window(4) for _ in range(steps)]
    return [w for w in cut if w is not None]


def test_committer_sends_in_order_and_flushing_waits_for_the_answer(
    group: tuple[CoordinatorServer, WorkerAgent],
) -> None:
    server, agent = group
    committer = Committer(agent)
    for window in walking(server, 10):
        committer.enqueue(1, window, 0.01)
    assert committer.flushing(5.0)
    assert server.service.state.ledger.committed_step == 10
    assert committer.failure is None
    committer.closing()


def test_a_fenced_batch_is_dropped_and_a_conflict_is_kept_for_the_training_thread(
    group: tuple[CoordinatorServer, WorkerAgent],
) -> None:
    server, agent = group
    committer = Committer(agent)
    first, second = walking(server, 2)
    committer.enqueue(0, first, 0.01)  # generation 0 closed long ago
    assert committer.flushing(5.0)
    assert committer.failure is None
    assert server.service.state.ledger.committed_step == 0
    committer.enqueue(1, second, 0.01)  # skips step 1: the ledger refuses it
    assert committer.flushing(5.0)
    assert isinstance(committer.failure, LedgerConflict)
    assert server.service.state.ledger.committed_step == 0
    committer.closing()


def test_a_session_whose_commits_cannot_land_stops_with_commit_failed() -> None:
    samples = 2000
    state = CoordinatorState.starting(DatasetPlan(samples, 10, 1), join_window_s=0.01)
    server = CoordinatorServer(CoordinatorService(state, MemoryStore(), VERIFIER)).start()
    contract = WorkerContract(server.address, TOKEN, "job", "w0", "node-a", timeout_s=2.0)
    model = nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    dataset = TensorDataset(torch.randn(samples, 2), torch.randn(samples, 1))
    steps = 0
    try:
        with (
            pytest.raises(CommitFailed, match="unreachable"),
            session(model, optimizer, dataset, KeepGlobalBatch(4), contract) as s,
        ):
            for inputs, targets in s.batches():
                s.step(nn.functional.mse_loss(s.model(inputs), targets))
                steps += 1
                if steps == 5:
                    server.stop(0.1)
                time.sleep(0.02)
    finally:
        server.stop(0.1)
    assert steps < samples // 4, "the worker trained through the whole dataset uncounted"
