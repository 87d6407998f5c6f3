"""Reading each rank's local gradient before it is averaged, one step in `MEASURE_EVERY`.

Most steps are plain DistributedDataParallel steps: its own C++ allreduce, overlapped with
backward, nothing added. On a measured step (chosen by the step's number, so every rank of
a group measures the same steps) `arming` turns DDP's gradient sync off for that step's
forwards and backwards (what `DistributedDataParallel.no_sync` does; it also keeps it off
for all but the last micro-batch of any step, under gradient accumulation), and
`averaging` then does the averaging itself, once, after the step's last backward, in one
allreduce:
- the local gradients are copied into one flat buffer with three more elements (this
  rank's |g_i|^2, 1/b_i and 1), whose sum over the ranks is what the estimator needs, so
  the statistics ride in the gradient's own allreduce (no extra collective);
- the buffer is summed over the group and divided by the world size (DDP's average), its
  squared norm taken, and copied back into the gradients.
The per-step numbers stay tensors until `folding` reads them, at most every
`FOLD_EVERY_S` (one device sync then, not one per step). A measured step's numbers count
only once the session knows its collectives completed (`keeping`): on NCCL the allreduce
runs asynchronously, and a step whose communicator failed holds a partial sum, which
`discarding` drops with the step.

The session scales each rank's loss by ``b_i * n / B`` (so that the average is the mean
over the step's samples; with micro-batches, each by its own share, so that they add up
to that); the meter is given the factor of the rank's whole slice (b_i: all of its
micro-batches) and divides it out to get g_i. A rank whose slice
is a stand-in sample (loss weighted 0) sends zeros and is not counted. A model with
gradients in a reduced precision (float16, bfloat16) or of mixed dtypes is never measured:
three scalars in half precision would lose the estimate.

What must stay true: every step's gradients are averaged exactly once, by DDP or by
`averaging` (a measured step's are the sum over the ranks divided by the world size, as
DDP's); every rank of a generation measures the same steps (its collectives must match);
the meter never blocks the training thread on the device except in `folding`.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from trainer_runtime.noise import NoiseEstimator, NoiseSample

FOLD_EVERY_S = 0.5
PENDING_MAX = 256  # steps kept as tensors before a fold, whatever the time
EAGER_STEPS = 4  # measured steps folded one by one at the start (a job's first estimate)
EXTRA = 3  # scalars carried with the gradients: sum |g_i|^2, sum 1/b_i, ranks measured
# A measured step copies the gradients in and out of one buffer and gives up DDP's overlap
# of communication with backward: one step in eight keeps that under about 1% of the step
# time on a small model (benchmarks/step_overhead.py), and still measures a thousand steps
# in an epoch of eight thousand.
MEASURE_EVERY = 8
MEASURED_DTYPES = (torch.float32, torch.float64)


class NoiseMeter:
    """Measures gradient noise on some steps of a DDP group (see the module docstring)."""

    def __init__(self, estimator: NoiseEstimator) -> None:
        self.estimator = estimator
        self.ddp: DistributedDataParallel | None = None
        self.group: dist.ProcessGroup | None = None  # the DDP's: what `averaging` sums over
        self.parameters: list[torch.nn.Parameter] = []
        self.world_size = 1
        self.able = False
        self.measuring = False
        self.pending: list[tuple[torch.Tensor, torch.Tensor, int]] = []
        #: Whether the last entry of `pending` is this step's, not yet known to be whole.
        self.unsettled = False
        self.folded_at = time.monotonic()

    def attaching(self, ddp: DistributedDataParallel, world_size: int) -> None:
        """Measure the steps of `ddp` (a new DDP object each generation)."""
        self.ddp, self.group, self.world_size = ddp, ddp.process_group, world_size
        self.parameters = [p for p in ddp.module.parameters() if p.requires_grad]
        dtypes = {p.dtype for p in self.parameters}
        self.able = world_size >= 2 and len(dtypes) == 1 and dtypes <= set(MEASURED_DTYPES)
        self.measuring = False
        self.pending.clear()  # tensors of the old group's steps were folded or are moot
        self.unsettled = False

    def detaching(self) -> None:
        """Let go of the generation's DDP before its group is dissolved."""
        self.ddp, self.group, self.able, self.measuring = None, None, False, False

    def arming(self, step: int, last: bool = True) -> None:
        """Before each forward of the step: whether DDP averages this backward's gradients
        itself. Only the step's `last` micro-batch may sync (the others accumulate on the
        rank), and none on a measured step: `averaging` runs once, after the last."""
        self.measuring = self.able and step % MEASURE_EVERY == 0
        syncing = last and not self.measuring
        if self.ddp is not None and self.ddp.require_backward_grad_sync != syncing:
            self.ddp.require_backward_grad_sync = syncing

    def averaging(self, local_samples: int, scale: float, batch: int) -> bool:
        """After the backward of a measured step: average the gradients over the group in
        one allreduce that carries the statistics; whether this step is measured. Nothing
        to do on another step (DDP averaged it). The step's numbers wait for `keeping` or
        `discarding`."""
        if not self.measuring:
            return False
        grads = []
        for parameter in self.parameters:
            if parameter.grad is None:  # every rank sends the same layout
                parameter.grad = torch.zeros_like(parameter)
            grads.append(parameter.grad)
        reference = grads[0]
        tail = torch.zeros(EXTRA, dtype=reference.dtype, device=reference.device)
        flat = torch.cat([*(g.reshape(-1) for g in grads), tail])
        body = flat[:-EXTRA]
        if scale > 0 and local_samples > 0:
            flat[-EXTRA] = torch.dot(body, body) / (scale * scale)
            flat[-2] = 1.0 / local_samples
            flat[-1] = 1.0
        dist.all_reduce(flat, group=self.group)
        body.div_(self.world_size)
        self.pending.append((flat[-EXTRA:].clone(), torch.dot(body, body), batch))
        self.unsettled = True
        offset = 0
        for grad in grads:
            count = grad.numel()
            grad.copy_(body[offset : offset + count].view_as(grad))
            offset += count
        return True

    def discarding(self) -> None:
        """The step failed: its numbers, if it was measured, are not kept."""
        if self.unsettled:
            self.pending.pop()
            self.unsettled = False

    def keeping(self) -> bool:
        """The step's collectives completed: its numbers count. Whether the estimate
        changed (a fold: the first estimates go out at once, later ones in batches)."""
        if not self.unsettled:
            return False
        self.unsettled = False
        if (
            self.estimator.steps < EAGER_STEPS  # the first estimates go out at once
            or len(self.pending) >= PENDING_MAX
            or time.monotonic() - self.folded_at > FOLD_EVERY_S
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
