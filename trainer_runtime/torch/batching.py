"""The batch policies of a PyTorch job: `trainer_runtime.batching`'s, acting on a
`torch.optim.Optimizer`.

The rules (batch size, learning-rate rule and warm-up, shared state) are framework-free and
live in `trainer_runtime.batching`; here is only how a torch optimizer's rate is read
(its first parameter group's `lr`) and set (every group's), and how its momentum is
compensated: SGD's `momentum_buffer`s are rescaled by `old_lr / new_lr`, so `lr * buffer`
is unchanged by a rate change. What must stay true: a policy touches only `lr` and
`momentum_buffer` of the optimizer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeAlias

import torch

from trainer_runtime import adaptive, batching

#: A batch policy for a torch optimizer (`KeepGlobalBatch`, `ScaleBatch`, `AdaptiveBatch`
#: or a job's own).
BatchPolicy: TypeAlias = batching.BatchPolicy[torch.optim.Optimizer]


class TorchRates:
    """How a torch optimizer's rate is read and set, and its momentum compensated: the
    three hooks every rate-following policy of this adapter shares."""

    __slots__ = ()

    def read_lr(self, optimizer: torch.optim.Optimizer) -> float:
        return float(optimizer.param_groups[0]["lr"])

    def set_lr(self, optimizer: torch.optim.Optimizer, lr: float) -> None:
        for group in optimizer.param_groups:
            group["lr"] = lr

    def rescale_momentum(self, optimizer: torch.optim.Optimizer, factor: float) -> None:
        compensating_momentum(optimizer, factor)


@dataclass(slots=True)
class ScaleBatch(TorchRates, batching.ScaleBatch[torch.optim.Optimizer]):
    """Each rank takes `per_worker` samples a step; the learning rate follows `rule`
    (`trainer_runtime.batching.ScaleBatch`), set on every parameter group."""


@dataclass(slots=True)
class AdaptiveBatch(TorchRates, adaptive.AdaptiveBatch[torch.optim.Optimizer]):
    """The batch with the most goodput, the rate by AdaScale or a rule
    (`trainer_runtime.adaptive.AdaptiveBatch`), set on every parameter group."""


def compensating_momentum(optimizer: torch.optim.Optimizer, factor: float) -> None:
    """Rescale SGD momentum buffers so that `lr * buffer` is unchanged by a rate change."""
    for group in optimizer.param_groups:
        for parameter in group["params"]:
            buffer = optimizer.state.get(parameter, {}).get("momentum_buffer")
            if isinstance(buffer, torch.Tensor):
                buffer.mul_(factor)
