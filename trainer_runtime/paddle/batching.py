"""The batch policies of the Paddle adapter: `trainer_runtime.batching` acting on a Paddle
optimizer.

`KeepGlobalBatch` and `LrRule` are the framework-free ones; `ScaleBatch` adds only what
touches the optimizer: the rate is read with `get_lr` and written with `set_lr`, and
momentum compensation rescales the `velocity` accumulators of `paddle.optimizer.Momentum`
(Paddle's update is `p -= lr * v`, so `lr * v` stays unchanged). This module imports
paddle only when a velocity is rescaled, and never torch.

What must stay true: a policy touches only the optimizer's learning rate and velocity.
"""

from __future__ import annotations

from typing import Any

from trainer_runtime import batching
from trainer_runtime.batching import KeepGlobalBatch, LrRule

VELOCITY = "velocity"
BatchPolicy = batching.BatchPolicy[Any]

__all__ = ["BatchPolicy", "KeepGlobalBatch", "LrRule", "ScaleBatch", "compensating_momentum"]


class ScaleBatch(batching.ScalingRate):
    """Each rank takes `per_worker` samples a step; the learning rate follows `rule`,
    ramped over `warmup_steps` after each resize (see `trainer_runtime.batching`). The
    optimizer's learning rate must be a float (a Paddle `LRScheduler` owns the rate itself:
    use `KeepGlobalBatch`)."""

    __slots__ = ()

    def adjusting(self, optimizer: Any, world_size: int) -> None:
        """Set this step's rate with `set_lr` (called before every step)."""
        if not isinstance(optimizer._learning_rate, float | int):
            raise TypeError(
                "ScaleBatch sets the learning rate itself: give the optimizer a float "
                "learning_rate, not an LRScheduler"
            )
        old_lr = float(optimizer.get_lr())
        new_lr = self.stepping_rate(old_lr, world_size)
        if new_lr == old_lr:
            return
        optimizer.set_lr(new_lr)
        factor = self.momentum_factor(old_lr, new_lr)
        if factor is not None:
            compensating_momentum(optimizer, factor)


def compensating_momentum(optimizer: Any, factor: float) -> None:
    """Rescale momentum velocities so that `lr * velocity` is unchanged by a rate change."""
    import paddle

    with paddle.no_grad():
        for velocity in getattr(optimizer, "_accumulators", {}).get(VELOCITY, {}).values():
            velocity.scale_(factor)
