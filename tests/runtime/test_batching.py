"""Batch policies: what a resize does to the batch size, the learning rate and momentum.

Aspects:
- `KeepGlobalBatch` keeps B whatever the world size, and refuses an empty batch; with
  `max_local` it asks for as many micro-batches as the largest slice needs (1 without), and
  refuses a limit under one sample;
- a rank's micro-batches (`generations.micro_slicing`): across the ranks and their
  micro-batches every sample of a window is trained exactly once, every rank runs the same
  number of them, and an empty one is one stand-in sample weighing 0;
- `ScaleBatch` scales the global batch with the workers; the rate follows the linear or the
  square-root rule, is taken at once at the job's first size and ramped linearly over
  `warmup_steps` after every later resize;
- momentum compensation keeps `lr * momentum_buffer` unchanged through a rate change, and
  can be turned off;
- a newcomer that adopts rank 0's policy state ramps exactly as a survivor does;
- in a real session (one worker, in-process coordinator) every step consumes
  `per_worker * world` samples at the scaled rate; with accumulation, a step's
  micro-batches end in one optimizer step equal to a whole-window step.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch import nn
from torch.utils.data import TensorDataset

from trainer_runtime.coordinator.serving import CoordinatorServer, CoordinatorService
from trainer_runtime.coordinator.state import ConsumptionMode, CoordinatorState
from trainer_runtime.coordinator.storing import MemoryStore
from trainer_runtime.environment import WorkerContract
from trainer_runtime.generations import micro_slicing
from trainer_runtime.sharding import DatasetPlan, SampleRange, StepWindow, counting
from trainer_runtime.torch import KeepGlobalBatch, LrRule, ScaleBatch, session

from .harness import TOKEN, VERIFIER


def sgd(lr: float = 0.1, momentum: float = 0.9) -> torch.optim.SGD:
    model = nn.Linear(2, 1)
    return torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)


def lr_of(optimizer: torch.optim.Optimizer) -> float:
    return float(optimizer.param_groups[0]["lr"])


def rates(policy: ScaleBatch, optimizer: torch.optim.Optimizer, worlds: list[int]) -> list[float]:
    """The rate in force at each step, the world size of each step given."""
    seen = []
    for world in worlds:
        policy.adjusting(optimizer, world)
        seen.append(lr_of(optimizer))
    return seen


def stepping_once(optimizer: torch.optim.Optimizer) -> None:
    """One step with a unit gradient, so that momentum buffers exist."""
    for group in optimizer.param_groups:
        for parameter in group["params"]:
            parameter.grad = torch.ones_like(parameter)
    optimizer.step()


def test_keep_global_batch_is_the_same_at_every_size() -> None:
    policy = KeepGlobalBatch(48)
    assert [policy.global_batch(w) for w in (1, 2, 3, 7)] == [48] * 4
    optimizer = sgd()
    policy.adjusting(optimizer, 5)
    assert lr_of(optimizer) == 0.1
    with pytest.raises(ValueError, match="at least one sample"):
        KeepGlobalBatch(0)


@pytest.mark.parametrize(
    ("samples", "max_local", "worlds", "expected"),
    [
        (48, None, (1, 2, 5), [1, 1, 1]),
        (48, 48, (1, 2, 5), [1, 1, 1]),
        (48, 12, (1, 2, 3, 4, 5, 7), [4, 2, 2, 1, 1, 1]),  # slices 48, 24, 16, 12, 10, 7
        (48, 7, (1, 2, 5, 100), [7, 4, 2, 1]),  # slices 48, 24, 10, 1
        (5, 1, (1, 2, 3, 8), [5, 3, 2, 1]),
    ],
)
def test_keep_global_batch_accumulates_what_one_rank_cannot_hold(
    samples: int, max_local: int | None, worlds: tuple[int, ...], expected: list[int]
) -> None:
    policy = KeepGlobalBatch(samples, max_local=max_local)
    assert [policy.accumulation(w) for w in worlds] == expected
    for world in worlds:  # no rank's micro-batch holds more than max_local samples
        largest_slice = math.ceil(samples / world)
        assert math.ceil(largest_slice / policy.accumulation(world)) <= (max_local or samples)
    assert [policy.global_batch(w) for w in worlds] == [samples] * len(worlds)


def test_keep_global_batch_refuses_a_max_local_under_one_sample() -> None:
    for bad in (0, -3):
        with pytest.raises(ValueError, match=r"KeepGlobalBatch\.max_local"):
            KeepGlobalBatch(8, max_local=bad)
    assert KeepGlobalBatch(8).accumulation(3) == 1
    assert ScaleBatch(4, 0.1).accumulation(16) == 1


@st.composite
def step_windows(draw: st.DrawFn) -> StepWindow:
    """A window of disjoint ranges in any order, as a todo list hands them out."""
    lengths = draw(st.lists(st.integers(1, 9), min_size=1, max_size=5))
    ranges, start = [], 0
    for length in lengths:
        start += draw(st.integers(0, 3))
        ranges.append(SampleRange(start, start + length))
        start += length
    return StepWindow(3, 0, tuple(draw(st.permutations(ranges))))


@given(window=step_windows(), world_size=st.integers(1, 6), parts=st.integers(1, 8))
def test_micro_batches_train_every_sample_of_a_window_exactly_once(
    window: StepWindow, world_size: int, parts: int
) -> None:
    size = counting(window.ranges)
    trained: list[int] = []
    for rank in range(world_size):
        micro = micro_slicing(window, world_size, rank, parts)
        assert len(micro) == parts, "every rank runs the same number of backward passes"
        real = [m.samples for m in micro if m.samples]
        assert not real or max(real) - min(real) <= 1, "micro-batches as even as they can be"
        for part in micro:
            assert part.window_size == size
            if part.samples == 0:  # a stand-in: one sample of the window, weighing 0
                assert part.ranges == [
                    SampleRange(window.ranges[0].start, window.ranges[0].start + 1)
                ]
            else:
                assert counting(part.ranges) == part.samples
                trained.extend(i for r in part.ranges for i in r.indices())
    assert trained == [i for r in window.ranges for i in r.indices()], "in order, once each"


def test_scale_batch_grows_the_global_batch_with_the_workers() -> None:
    policy = ScaleBatch(per_worker=16, base_lr=0.1)
    assert [policy.global_batch(w) for w in (1, 2, 5)] == [16, 32, 80]
    with pytest.raises(ValueError):
        ScaleBatch(per_worker=0, base_lr=0.1)


@pytest.mark.parametrize(
    ("rule", "expected"),
    [(LrRule.LINEAR, [0.1, 0.2, 0.4]), (LrRule.SQRT, [0.1, 0.1 * math.sqrt(2), 0.2])],
)
def test_target_rate_follows_the_rule(rule: LrRule, expected: list[float]) -> None:
    policy = ScaleBatch(per_worker=8, base_lr=0.1, base_workers=2, rule=rule)
    assert [policy.target_lr(w) for w in (2, 4, 8)] == pytest.approx(expected)


def test_first_size_takes_its_rate_at_once_and_a_resize_ramps_over_the_warmup() -> None:
    policy = ScaleBatch(per_worker=8, base_lr=0.1, base_workers=1, warmup_steps=4)
    optimizer = sgd(lr=0.1, momentum=0.0)
    seen = rates(policy, optimizer, [2, 2, 4, 4, 4, 4, 4, 4])
    # 0.2 at once at 2 workers; then from 0.2 to 0.4 in four equal steps, and it stays there
    assert seen == pytest.approx([0.2, 0.2, 0.25, 0.3, 0.35, 0.4, 0.4, 0.4])
    seen = rates(policy, optimizer, [1, 1, 1, 1, 1])  # a shrink ramps down the same way
    assert seen == pytest.approx([0.325, 0.25, 0.175, 0.1, 0.1])


def test_without_warmup_the_rate_jumps_to_the_target() -> None:
    policy = ScaleBatch(per_worker=8, base_lr=0.05, base_workers=2)
    optimizer = sgd(lr=0.05, momentum=0.0)
    assert rates(policy, optimizer, [2, 6, 6, 3]) == pytest.approx([0.05, 0.15, 0.15, 0.075])


def test_momentum_compensation_keeps_the_effective_update() -> None:
    policy = ScaleBatch(per_worker=8, base_lr=0.1, base_workers=1, warmup_steps=2)
    optimizer = sgd(lr=0.1)
    policy.adjusting(optimizer, 1)
    stepping_once(optimizer)
    buffers = [optimizer.state[p]["momentum_buffer"] for p in optimizer.param_groups[0]["params"]]
    before = [lr_of(optimizer) * b.clone() for b in buffers]
    for _ in range(3):  # 1 -> 4 workers: 0.1 -> 0.25 -> 0.4
        policy.adjusting(optimizer, 4)
        for buffer, product in zip(buffers, before, strict=True):
            torch.testing.assert_close(lr_of(optimizer) * buffer, product)
    assert lr_of(optimizer) == pytest.approx(0.4)


def test_momentum_buffers_are_untouched_without_compensation() -> None:
    policy = ScaleBatch(per_worker=8, base_lr=0.1, momentum_compensation=False)
    optimizer = sgd(lr=0.1)
    policy.adjusting(optimizer, 1)
    stepping_once(optimizer)
    parameter = optimizer.param_groups[0]["params"][0]
    kept = optimizer.state[parameter]["momentum_buffer"].clone()
    policy.adjusting(optimizer, 3)
    assert lr_of(optimizer) == pytest.approx(0.3)
    torch.testing.assert_close(optimizer.state[parameter]["momentum_buffer"], kept)


def test_newcomer_adopting_rank0_state_ramps_like_a_survivor() -> None:
    def policy() -> ScaleBatch:
        return ScaleBatch(per_worker=8, base_lr=0.1, base_workers=1, warmup_steps=4)

    survivor, survivor_sgd = policy(), sgd(lr=0.1, momentum=0.0)
    rates(survivor, survivor_sgd, [2, 2, 2])
    # a generation of 3 forms: the newcomer receives the optimizer state and the policy's
    newcomer, newcomer_sgd = policy(), sgd(lr=lr_of(survivor_sgd), momentum=0.0)
    newcomer.adopting(survivor.shared_state())
    worlds = [3] * 6
    assert rates(newcomer, newcomer_sgd, worlds) == rates(survivor, survivor_sgd, worlds)


def test_a_session_with_scale_batch_steps_with_the_scaled_batch_and_rate() -> None:
    samples, per_worker = 40, 4
    state = CoordinatorState.starting(
        DatasetPlan(samples, 10, 1), ConsumptionMode.GROUP, join_window_s=0.01
    )
    server = CoordinatorServer(CoordinatorService(state, MemoryStore(), VERIFIER)).start()
    try:
        contract = WorkerContract(
            f"127.0.0.1:{server.port}", TOKEN, "job", "w0", "n", timeout_s=20.0
        )
        model = nn.Linear(2, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=1.0, momentum=0.9)
        dataset = TensorDataset(torch.randn(samples, 2), torch.randn(samples, 1))
        policy = ScaleBatch(per_worker=per_worker, base_lr=0.1, base_workers=2)
        windows = []
        with session(model, optimizer, dataset, policy, contract) as s:
            for inputs, targets in s.batches():
                windows.append((s.world_size, s.window_size, len(inputs)))
                s.step(nn.functional.mse_loss(s.model(inputs), targets))
        assert windows == [(1, per_worker, per_worker)] * (samples // per_worker)
        assert lr_of(optimizer) == pytest.approx(0.05)
        assert state.ledger.finished
    finally:
        server.stop(0.1)


def test_a_session_with_accumulation_steps_once_per_window_as_a_whole_batch_would() -> None:
    samples, batch, max_local = 24, 8, 3  # micro-batches of 3, 3 and 2 samples
    state = CoordinatorState.starting(
        DatasetPlan(samples, 24, 1), ConsumptionMode.GROUP, join_window_s=0.01
    )
    server = CoordinatorServer(CoordinatorService(state, MemoryStore(), VERIFIER)).start()
    try:
        contract = WorkerContract(
            f"127.0.0.1:{server.port}", TOKEN, "job", "w0", "n", timeout_s=20.0
        )
        torch.manual_seed(0)
        model = nn.Linear(2, 1).double()
        reference = nn.Linear(2, 1).double()
        reference.load_state_dict(model.state_dict())
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        dataset = TensorDataset(
            torch.randn(samples, 2, dtype=torch.float64),
            torch.randn(samples, 1, dtype=torch.float64),
        )
        seen = []
        with session(model, optimizer, dataset, KeepGlobalBatch(batch, max_local), contract) as s:
            for inputs, targets in s.batches():
                syncing = s.model.require_backward_grad_sync  # DDP's no-sync until the last
                seen.append((s.step_count, s.micro_batch, s.window_size, len(inputs), syncing))
                s.step(nn.functional.mse_loss(s.model(inputs), targets))
        per_step = [(0, 3, False), (1, 3, False), (2, 2, True)]
        assert seen == [(step, m, batch, n, sync) for step in range(3) for m, n, sync in per_step]
        assert state.ledger.finished

        mirror = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9)
        inputs, targets = dataset.tensors
        for start in range(0, samples, batch):  # the plan's one shard, in order
            window = slice(start, start + batch)
            mirror.zero_grad()
            nn.functional.mse_loss(reference(inputs[window]), targets[window]).backward()
            mirror.step()
        for mine, theirs in zip(model.parameters(), reference.parameters(), strict=True):
            torch.testing.assert_close(mine, theirs, rtol=1e-12, atol=1e-12)
    finally:
        server.stop(0.1)
