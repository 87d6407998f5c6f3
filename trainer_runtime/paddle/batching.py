"""The batch policies of a Paddle job: `trainer_runtime.batching`'s, acting on a Paddle
optimizer.

The rules (batch size, learning-rate rule and warm-up, shared state) are framework-free and
live in `trainer_runtime.batching`, the same as the PyTorch adapter's; here is only how a
Paddle optimizer's rate is read (`get_lr`) and set (`set_lr`), and how its momentum is
compensated: the `velocity` accumulators of `paddle.optimizer.Momentum` are rescaled by
`old_lr / new_lr` (Paddle's update is `p -= lr * v`, so `lr * v` stays unchanged).

What must stay true: a policy touches only the optimizer's learning rate and velocity; a
`ScaleBatch` refuses an optimizer whose rate a Paddle `LRScheduler` owns.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TypeAlias

from trainer_runtime import adaptive, batching

VELOCITY = "velocity"

#: A batch policy for a Paddle optimizer (`KeepGlobalBatch`, `ScaleBatch`, `AdaptiveBatch`
#: or a job's own).
BatchPolicy: TypeAlias = batching.BatchPolicy[Any]


class PaddleRates:
    """How a Paddle optimizer's rate is read and set, and its momentum compensated: the
    three hooks every rate-following policy of this adapter shares. The optimizer's
    learning rate must be a float (a Paddle `LRScheduler` owns the rate itself: use
    `KeepGlobalBatch`)."""

    __slots__ = ()

    def read_lr(self, optimizer: Any) -> float:
        if not isinstance(optimizer._learning_rate, float | int):
            raise TypeError(
                f"{type(self).__name__} sets the learning rate itself: give the optimizer a "
                "float learning_rate, not an LRScheduler"
            )
        return float(optimizer.get_lr())

    def set_lr(self, optimizer: Any, lr: float) -> None:
        optimizer.set_lr(lr)

    def rescale_momentum(self, optimizer: Any, factor: float) -> None:
        compensating_momentum(optimizer, factor)


@dataclass(slots=True)
class ScaleBatch(PaddleRates, batching.ScaleBatch[Any]):
    """Each rank takes `per_worker` samples a step; the learning rate follows `rule`
    (`trainer_runtime.batching.ScaleBatch`)."""


@dataclass(slots=True)
class AdaptiveBatch(PaddleRates, adaptive.AdaptiveBatch[Any]):
    """The batch with the most goodput, the rate by AdaScale or a rule
    (`trainer_runtime.adaptive.AdaptiveBatch`)."""


def compensating_momentum(optimizer: Any, factor: float) -> None:
    """Rescale momentum velocities so that `lr * velocity` is unchanged by a rate change."""
    import paddle

    with paddle.no_grad():
        for velocity in getattr(optimizer, "_accumulators", {}).get(VELOCITY, {}).values():
            velocity.scale_(factor)
