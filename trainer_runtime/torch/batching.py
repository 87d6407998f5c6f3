"""The batch policies of the PyTorch adapter: `trainer_runtime.batching` acting on a
`torch.optim.Optimizer`.

`KeepGlobalBatch` and `LrRule` are the framework-free ones; `ScaleBatch` adds only what
touches the optimizer: the rate lives in every `param_groups` entry's `lr`, and momentum
compensation rescales SGD's `momentum_buffer`s (torch's update is `p -= lr * buf`, so
`lr * buf` stays unchanged).

What must stay true: a policy touches only `lr` and `momentum_buffer` of the optimizer.
"""

from __future__ import annotations

import torch

from trainer_runtime import batching
from trainer_runtime.batching import KeepGlobalBatch, LrRule

BatchPolicy = batching.BatchPolicy[torch.optim.Optimizer]

__all__ = ["BatchPolicy", "KeepGlobalBatch", "LrRule", "ScaleBatch", "compensating_momentum"]


class ScaleBatch(batching.ScalingRate):
    """Each rank takes `per_worker` samples a step; the learning rate follows `rule`,
    ramped over `warmup_steps` after each resize (see `trainer_runtime.batching`)."""

    __slots__ = ()

    def adjusting(self, optimizer: torch.optim.Optimizer, world_size: int) -> None:
        """Set this step's rate in every parameter group (called before every step)."""
        old_lr = float(optimizer.param_groups[0]["lr"])
        new_lr = self.stepping_rate(old_lr, world_size)
        if new_lr == old_lr:
            return
        for group in optimizer.param_groups:
            group["lr"] = new_lr
        factor = self.momentum_factor(old_lr, new_lr)
        if factor is not None:
            compensating_momentum(optimizer, factor)


def compensating_momentum(optimizer: torch.optim.Optimizer, factor: float) -> None:
    """Rescale SGD momentum buffers so that `lr * buffer` is unchanged by a rate change."""
    for group in optimizer.param_groups:
        for parameter in group["params"]:
            buffer = optimizer.state.get(parameter, {}).get("momentum_buffer")
            if isinstance(buffer, torch.Tensor):
                buffer.mul_(factor)
