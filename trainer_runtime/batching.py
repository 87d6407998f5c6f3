"""What happens to the batch size and the learning rate when a job is resized, for every
framework.

A job chooses one policy:
- `KeepGlobalBatch(B)`: every step consumes B samples, whatever the world size; each rank
  takes its slice of the step's window, so the sample sequence and, within float tolerance,
  the trained parameters are those of a fixed-size run. With `max_local=M`, a rank whose
  slice holds more than M samples runs it as several micro-batches of at most M and
  accumulates their gradients before the step's one optimizer step (`accumulation`), so
  that a global batch too large for the ranks' devices stays exact as the job shrinks.
- `ScaleBatch(per_worker, base_lr, ...)`: the global batch is `per_worker * world_size`;
  the learning rate follows the linear scaling rule (`base_lr * world / base_workers`) or
  the square-root rule (`base_lr * sqrt(world / base_workers)`, `rule=LrRule.SQRT`),
  reached linearly over `warmup_steps` steps after each resize, and momentum buffers are
  rescaled by `old_lr / new_lr` whenever the rate changes (momentum compensation, as in
  "Dynamic Mini-batch SGD for Elastic Distributed Training"), so that a resize does not
  kick the effective update.

This module holds the rules and imports no framework: `ScaleBatch` leaves three things to
each framework's subclass (`trainer_runtime.torch.batching`, `trainer_runtime.paddle.batching`):
how to read the optimizer's rate, how to set it, and how to rescale its momentum.

What must stay true: the batch size and the number of micro-batches (`accumulation`) are
pure functions of the policy's state and the world size, so every rank of a generation
cuts the same windows and runs the same number of backward passes; a policy touches
only the optimizer's learning rate and momentum; every rank of a generation holds the same
policy state (rank 0 sends `shared_state()` with the model, every rank `adopting` it), so a
newcomer ramps the rate exactly as the survivors do. The frameworks differ only in the
three hooks, so a job resizes the same way on either.
"""

from __future__ import annotations

import abc
import enum
import math
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

#: The optimizer type of one framework (`torch.optim.Optimizer`, Paddle's optimizer).
OptimizerT = TypeVar("OptimizerT")
OptimizerT_contra = TypeVar("OptimizerT_contra", contravariant=True)


class BatchPolicy(Protocol[OptimizerT_contra]):
    def global_batch(self, world_size: int) -> int: ...

    def accumulation(self, world_size: int) -> int:
        """How many micro-batches each rank runs per optimizer step (1: none). Every rank
        of a generation must compute the same number."""

    def adjusting(self, optimizer: OptimizerT_contra, world_size: int) -> None:
        """Called before every optimizer step."""

    def shared_state(self) -> dict[str, Any]:
        """What rank 0 sends to every member when a generation forms."""

    def adopting(self, state: dict[str, Any]) -> None:
        """Take rank 0's `shared_state()`."""


class LrRule(enum.Enum):
    """How the learning rate follows the global batch (no transitions: chosen per job)."""

    LINEAR = "linear"
    SQRT = "sqrt"


@dataclass(slots=True)
class KeepGlobalBatch:
    """Every step consumes `samples` samples, split among the ranks. It never touches the
    optimizer, so one class serves every framework.

    `max_local`: the most samples one rank holds at once (None: no limit). A rank's slice
    of ceil(samples / world_size) samples then runs as ceil(slice / max_local) micro-batches
    whose gradients add up before the optimizer steps once."""

    samples: int
    max_local: int | None = None

    def __post_init__(self) -> None:
        if self.samples <= 0:
            raise ValueError("KeepGlobalBatch.samples: the global batch holds at least one sample")
        if self.max_local is not None and self.max_local < 1:
            raise ValueError(
                f"KeepGlobalBatch.max_local: a rank holds at least one sample at once "
                f"(got {self.max_local}; None for no limit)"
            )

    def global_batch(self, world_size: int) -> int:
        return self.samples

    def accumulation(self, world_size: int) -> int:
        if self.max_local is None:
            return 1
        largest_slice = -(-self.samples // max(1, world_size))
        return -(-largest_slice // self.max_local)

    def adjusting(self, optimizer: object, world_size: int) -> None:
        return None

    def shared_state(self) -> dict[str, Any]:
        return {}

    def adopting(self, state: dict[str, Any]) -> None:
        return None


@dataclass(slots=True)
class ScaleBatch(abc.ABC, Generic[OptimizerT]):
    """Each rank takes `per_worker` samples a step; the learning rate follows `rule`.

    The job's first size takes its rate at once; every later resize ramps from the rate in
    force to the new target over `warmup_steps` steps. A framework's subclass says how its
    optimizer's rate is read and set and how its momentum is rescaled.
    """

    per_worker: int
    base_lr: float
    base_workers: int = 1
    warmup_steps: int = 0
    momentum_compensation: bool = True
    rule: LrRule = LrRule.LINEAR
    _world_size: int = field(default=0, init=False)
    _from_lr: float = field(default=0.0, init=False)
    _since_resize: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        if self.per_worker <= 0:
            raise ValueError("ScaleBatch.per_worker must be positive")
        if self.base_workers <= 0:
            raise ValueError("ScaleBatch.base_workers must be positive")
        if self.warmup_steps < 0:
            raise ValueError("ScaleBatch.warmup_steps cannot be negative")

    @abc.abstractmethod
    def read_lr(self, optimizer: OptimizerT) -> float:
        """The optimizer's rate now (a framework refuses here an optimizer whose rate it
        cannot set)."""

    @abc.abstractmethod
    def set_lr(self, optimizer: OptimizerT, lr: float) -> None:
        """Set the rate of every parameter group."""

    @abc.abstractmethod
    def rescale_momentum(self, optimizer: OptimizerT, factor: float) -> None:
        """Rescale the momentum so that `lr * momentum` is unchanged by a rate change."""

    def global_batch(self, world_size: int) -> int:
        return self.per_worker * world_size

    def accumulation(self, world_size: int) -> int:
        return 1

    def target_lr(self, world_size: int) -> float:
        ratio = world_size / self.base_workers
        return self.base_lr * (math.sqrt(ratio) if self.rule is LrRule.SQRT else ratio)

    def current_lr(self) -> float:
        target = self.target_lr(self._world_size)
        return ramped_lr(self._from_lr, target, self._since_resize, self.warmup_steps)

    def adjusting(self, optimizer: OptimizerT, world_size: int) -> None:
        old_lr = self.read_lr(optimizer)
        if world_size != self._world_size:
            self._from_lr = old_lr if self._world_size else self.target_lr(world_size)
            self._world_size = world_size
            self._since_resize = 0
        new_lr = self.current_lr()
        self._since_resize += 1
        setting_lr(self, optimizer, old_lr, new_lr, self.momentum_compensation)

    def shared_state(self) -> dict[str, Any]:
        return {
            "world_size": self._world_size,
            "from_lr": self._from_lr,
            "since_resize": self._since_resize,
        }

    def adopting(self, state: dict[str, Any]) -> None:
        self._world_size = int(state["world_size"])
        self._from_lr = float(state["from_lr"])
        self._since_resize = int(state["since_resize"])


class RateHooks(Protocol[OptimizerT_contra]):
    """How one framework reads and sets an optimizer's rate and rescales its momentum."""

    def read_lr(self, optimizer: OptimizerT_contra) -> float: ...

    def set_lr(self, optimizer: OptimizerT_contra, lr: float) -> None: ...

    def rescale_momentum(self, optimizer: OptimizerT_contra, factor: float) -> None: ...


def ramped_lr(from_lr: float, target: float, since_change: int, warmup_steps: int) -> float:
    """The rate of the `since_change`-th step after the target changed: reached linearly
    from `from_lr` over `warmup_steps` steps (at once without warm-up)."""
    if warmup_steps <= 0 or since_change >= warmup_steps:
        return target
    fraction = (since_change + 1) / warmup_steps
    return from_lr + fraction * (target - from_lr)


def setting_lr(
    hooks: RateHooks[OptimizerT],
    optimizer: OptimizerT,
    old_lr: float,
    new_lr: float,
    compensating: bool,
) -> None:
    """Set the optimizer's rate to `new_lr`; with `compensating`, rescale its momentum by
    `old_lr / new_lr` so that `lr * momentum` is unchanged (nothing when the rate is)."""
    if new_lr == old_lr:
        return
    hooks.set_lr(optimizer, new_lr)
    if compensating and new_lr > 0:
        hooks.rescale_momentum(optimizer, old_lr / new_lr)


def initial_batch(policy: BatchPolicy[Any], world_size: int) -> int:
    """The global batch a job's learning rate was set for, which the gradient statistics
    are reported against (Pollux's ``init_batch``): `KeepGlobalBatch`'s batch, `ScaleBatch`'s
    batch at `base_workers`; for another policy, its batch at `world_size` (the size the job
    started with)."""
    if isinstance(policy, KeepGlobalBatch):
        return policy.samples
    if isinstance(policy, ScaleBatch):
        return policy.per_worker * policy.base_workers
    from trainer_runtime.adaptive import AdaptiveBatch  # it builds on this module

    if isinstance(policy, AdaptiveBatch):
        return policy.initial_batch
    return max(1, policy.global_batch(max(1, world_size)))
