"""Batch policies: what a resize does to the batch size, the learning rate and momentum.

Aspects:
- `KeepGlobalBatch` keeps B whatever the world size, and refuses an empty batch;
- `ScaleBatch` scales the global batch with the workers; the rate follows the linear or the
  square-root rule, is taken at once at the job's first size and ramped linearly over
  `warmup_steps` after every later resize;
- momentum compensation keeps `lr * momentum_buffer` unchanged through a rate change, and
  can be turned off;
- a newcomer that adopts rank 0's policy state ramps exactly as a survivor does;
- in a real session (one worker, in-process coordinator) every step consumes
  `per_worker * world` samples at the scaled rate.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

from trainer_runtime.coordinator.serving import CoordinatorServer, CoordinatorService
from trainer_runtime.coordinator.state import ConsumptionMode, CoordinatorState
from trainer_runtime.coordinator.storing import MemoryStore
from trainer_runtime.environment import WorkerContract
from trainer_runtime.sharding import DatasetPlan
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
