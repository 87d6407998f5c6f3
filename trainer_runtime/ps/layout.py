"""Where each parameter lives and which samples each step trains: pure arithmetic.

Parameter-server mode flattens the job's parameters into one vector of `size` elements and
cuts it into contiguous ranges, one per server of the generation, in the generation's server
order (oldest first), sizes differing by at most one element. A range is a partition.

Steps are numbered from 1 over the whole job. With a global batch fixed for the job's life,
the samples of step s are a function of (dataset plan, batch, s) alone: every epoch has
`ceil(samples / batch)` steps and walks the epoch's shard order (`DatasetPlan.epoch_order`);
its last step takes what is left. This is the same cut `sharding.Walk` and the coordinator's
ledger make from the start of the job, so any worker, at any time, knows the window of any
step without asking anyone, and a leader can rebuild the windows the ledger lacks.

What must stay true: `laying_out` covers `[0, size)` exactly, in server order;
`window_of(plan, batch, s)` equals the s-th window of a `Walk` started at step 0.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from trainer_runtime.sharding import DatasetPlan, StepWindow, counting, taking_window


@dataclass(frozen=True, slots=True)
class Piece:
    """One partition: the elements `[start, stop)` of the flattened parameters on a server."""

    server_id: str
    address: str
    start: int
    stop: int

    def __len__(self) -> int:
        return self.stop - self.start


def laying_out(size: int, servers: Sequence[tuple[str, str]]) -> list[Piece]:
    """Split `size` elements over `servers` ((id, address), in order); a server gets no piece
    only when there are more servers than elements."""
    if size <= 0:
        raise ValueError("the model has no parameters to serve")
    if not servers:
        raise ValueError("parameter-server mode needs at least one server in the generation")
    base, extra = divmod(size, len(servers))
    pieces: list[Piece] = []
    start = 0
    for index, (server_id, address) in enumerate(servers):
        length = base + (1 if index < extra else 0)
        if length:
            pieces.append(Piece(server_id, address, start, start + length))
        start += length
    return pieces


def steps_per_epoch(plan: DatasetPlan, batch: int) -> int:
    if batch <= 0:
        raise ValueError(f"the global batch must be positive, got {batch}")
    return -(-plan.samples // batch)


def total_steps(plan: DatasetPlan, batch: int) -> int:
    return steps_per_epoch(plan, batch) * plan.epochs


def window_of(plan: DatasetPlan, batch: int, step: int) -> StepWindow:
    """The samples step `step` (1-based, over the whole job) trains."""
    per_epoch = steps_per_epoch(plan, batch)
    if not 1 <= step <= per_epoch * plan.epochs:
        raise ValueError(f"step {step} is outside the job's {per_epoch * plan.epochs} steps")
    epoch, index = divmod(step - 1, per_epoch)
    order = plan.epoch_order(epoch)
    offset = index * batch
    _, rest = taking_window(order, offset) if offset else ([], order)
    taken, _ = taking_window(rest, min(batch, counting(rest)))
    return StepWindow(step=step, epoch=epoch, ranges=tuple(taken))


def windows_between(plan: DatasetPlan, batch: int, after: int, through: int) -> list[StepWindow]:
    """The windows of steps `after + 1 .. through`."""
    return [window_of(plan, batch, step) for step in range(after + 1, through + 1)]
