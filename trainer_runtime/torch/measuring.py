"""Reading each rank's local gradient inside DistributedDataParallel's allreduce.

DDP averages the gradient bucket by bucket while backward runs; its communication hook
sees each bucket's local gradient just before the allreduce. `NoiseMeter.hook` replaces
DDP's allreduce with the same allreduce (a sum of the buffer divided by the world size)
and, on the way:
- before it, adds the bucket's local squared norm (one `dot` over the buffer);
- on the last bucket of the step, appends three scalars to the buffer it sends (this rank's
  |g_i|^2, 1/b_i and 1, summed by the same allreduce: no extra collective, one copy of
  that bucket);
- after it, adds the averaged bucket's squared norm.
After backward, `stepped` turns those into one `NoiseSample` for the estimator; the numbers
stay tensors until `folding` reads them, at most every `FOLD_EVERY_S` (one device sync
then, not one per step). One step in `MEASURE_EVERY` is measured; the others pass through
a plain allreduce.

The session scales each rank's loss by ``b_i * n / B`` (so that DDP's average is the mean
over the step's samples); the meter divides that factor out to get g_i. A rank whose slice
is a stand-in sample (loss weighted 0) sends zeros and is not counted. Buckets in a reduced
precision (float16, bfloat16) are averaged as DDP would and not measured: three scalars in
half precision would lose the estimate.

What must stay true: the gradients DDP applies are exactly those of its own allreduce hook
(sum, divided by the world size); a failed step leaves nothing behind (`arming` starts every
step afresh); the meter never blocks the training thread on the device except in `folding`.
"""

# No `from __future__ import annotations` here: DDP checks that a hook's `bucket` parameter
# is annotated with the GradBucket class itself, not a string.
import time
from typing import Any

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import GradBucket

from trainer_runtime.noise import NoiseEstimator, NoiseSample

FOLD_EVERY_S = 0.5
PENDING_MAX = 256  # steps kept as tensors before a fold, whatever the time
EXTRA = 3  # scalars carried by the last bucket: sum |g_i|^2, sum 1/b_i, ranks measured
# One step in MEASURE_EVERY is measured (chosen by the step's number, so every rank of a
# group measures the same steps): a measured step costs a few small tensor operations on
# the training thread, which on a tiny model is a tenth of its step (benchmarks/step_overhead).
MEASURE_EVERY = 4
MEASURED_DTYPES = (torch.float32, torch.float64)


class NoiseMeter:
    """A DDP communication hook that measures gradient noise (see the module docstring)."""

    def __init__(self, estimator: NoiseEstimator) -> None:
        self.estimator = estimator
        self.world_size = 1
        self.scale = 1.0  # this rank's loss scale this step (0: a stand-in sample)
        self.local_samples = 0
        self.measuring = False
        self.local_parts: list[torch.Tensor] = []
        self.global_parts: list[torch.Tensor] = []
        self.carried: torch.Tensor | None = None
        self.constants: dict[tuple[int, torch.dtype, torch.device], torch.Tensor] = {}
        self.pending: list[tuple[torch.Tensor, torch.Tensor, int]] = []
        self.folded_at = time.monotonic()

    def attaching(self, ddp: torch.nn.parallel.DistributedDataParallel, world_size: int) -> None:
        """Become `ddp`'s allreduce (a new DDP object each generation)."""
        self.world_size = world_size
        self.pending.clear()  # tensors of the old group's steps were folded or are moot
        ddp.register_comm_hook(None, self.hook)

    def arming(self, local_samples: int, scale: float, step: int) -> None:
        """Called before each backward: this rank's samples and loss scale at `step` (the
        step's number, the same on every rank)."""
        self.measuring = self.world_size >= 2 and step % MEASURE_EVERY == 0
        if self.measuring:
            self.local_samples, self.scale = local_samples, scale
            self.local_parts, self.global_parts, self.carried = [], [], None

    def hook(self, state: Any, bucket: GradBucket) -> torch.futures.Future[torch.Tensor]:
        """DDP's communication hook (its allreduce, measured on the way)."""
        buffer = bucket.buffer()
        if not self.measuring:
            plain: torch.futures.Future[Any] = dist.all_reduce(
                buffer.div_(self.world_size), async_op=True
            ).get_future()
            return plain.then(first_value)
        measured = buffer.dtype in MEASURED_DTYPES
        if measured:
            self.local_parts.append(torch.dot(buffer, buffer))
        buffer.div_(self.world_size)
        if measured and bucket.is_last():
            sent = torch.cat([buffer, self.carrying(buffer)])
            last: torch.futures.Future[Any] = dist.all_reduce(sent, async_op=True).get_future()
            return last.then(self.receiving_last)
        future: torch.futures.Future[Any] = dist.all_reduce(buffer, async_op=True).get_future()
        return future.then(self.receiving if measured else first_value)

    def carrying(self, buffer: torch.Tensor) -> torch.Tensor:
        """This rank's three scalars: |g_i|^2, 1/b_i, 1 (zeros for a stand-in rank)."""
        if self.scale <= 0 or self.local_samples <= 0:
            return torch.zeros(EXTRA, dtype=buffer.dtype, device=buffer.device)
        local = sum(self.local_parts[1:], self.local_parts[0]) * (1.0 / (self.scale * self.scale))
        key = (self.local_samples, buffer.dtype, buffer.device)
        rest = self.constants.get(key)
        if rest is None:  # the same few local batch sizes come back: made once each
            rest = torch.tensor(
                [1.0 / self.local_samples, 1.0], dtype=buffer.dtype, device=buffer.device
            )
            self.constants[key] = rest
        return torch.cat([local.reshape(1), rest])

    def receiving(self, future: "torch.futures.Future[Any]") -> torch.Tensor:
        reduced: torch.Tensor = future.value()[0]
        self.global_parts.append(torch.dot(reduced, reduced))
        return reduced

    def receiving_last(self, future: "torch.futures.Future[Any]") -> torch.Tensor:
        sent: torch.Tensor = future.value()[0]
        self.carried = sent[-EXTRA:]
        reduced = sent[:-EXTRA]
        self.global_parts.append(torch.dot(reduced, reduced))
        return reduced

    def stepped(self, batch: int) -> bool:
        """After backward: keep this step's numbers (tensors) for the next fold; whether
        it folded (the estimate changed)."""
        if not self.measuring:
            return False
        if self.carried is not None and self.global_parts:
            total = sum(self.global_parts[1:], self.global_parts[0])
            self.pending.append((self.carried, total, batch))
        self.local_parts, self.global_parts, self.carried = [], [], None
        if self.pending and (
            len(self.pending) >= PENDING_MAX or time.monotonic() - self.folded_at > FOLD_EVERY_S
        ):
            self.folding()
            return True
        return False

    def folding(self) -> None:
        """Read the kept steps from the device (one sync) and feed the estimator."""
        self.folded_at = time.monotonic()
        if not self.pending:
            return
        pending, self.pending = self.pending, []
        carried = torch.stack([c.double() for c, _, _ in pending]).tolist()
        globals_ = torch.stack([g.double() for _, g, _ in pending]).tolist()
        for (local_sqr, inverse_batch, ranks), global_sqr, (_, _, batch) in zip(
            carried, globals_, pending, strict=True
        ):
            self.estimator.observing(
                NoiseSample(local_sqr, inverse_batch, round(ranks), global_sqr, batch)
            )


def first_value(future: "torch.futures.Future[Any]") -> torch.Tensor:
    """An allreduce future's one tensor, as DDP's own hook returns it."""
    value: torch.Tensor = future.value()[0]
    return value
