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

Embedding tables (`Table`: a row-major block of the vector whose rows a batch touches
sparsely) move by row: a cut that would fall inside a table's row moves to the nearest row
boundary, so no row straddles two partitions (a table may still straddle several). Every
process lays out with the same tables, so they agree on the cuts.

What must stay true: `laying_out` covers `[0, size)` exactly, in server order, with every
cut on a row boundary of every table; `window_of(plan, batch, s)` equals the s-th window of
a `Walk` started at step 0.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

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


@dataclass(frozen=True, slots=True)
class Table:
    """An embedding table: `rows` rows of `row_length` elements from element `start`."""

    start: int
    rows: int
    row_length: int

    @property
    def stop(self) -> int:
        return self.start + self.rows * self.row_length

    def snapped(self, cut: int) -> int:
        """`cut`, moved to the nearest row boundary if it falls inside a row."""
        if not self.start < cut < self.stop:
            return cut
        return self.start + round((cut - self.start) / self.row_length) * self.row_length


@dataclass(frozen=True, slots=True)
class Flat:
    """Where each trainable parameter lives in the flat vector, by name."""

    names: tuple[str, ...]
    starts: tuple[int, ...]
    shapes: tuple[tuple[int, ...], ...]
    size: int

    @staticmethod
    def of(named: list[tuple[str, tuple[int, ...]]]) -> Flat:
        starts, offset = [], 0
        for _, shape in named:
            starts.append(offset)
            offset += int(np.prod(shape, dtype=np.int64))
        if not offset:
            raise ValueError("the model has no trainable parameters")
        return Flat(tuple(n for n, _ in named), tuple(starts), tuple(s for _, s in named), offset)

    def tables(self, sparse: Iterable[str]) -> dict[str, Table]:
        """The declared embedding tables (2-D parameters, a row per id), by name."""
        found: dict[str, Table] = {}
        for name in sparse:
            if name not in self.names:
                raise ValueError(f"sparse: {name!r} is not a trainable parameter: {self.names}")
            index = self.names.index(name)
            shape = self.shapes[index]
            if len(shape) != 2:
                raise ValueError(f"sparse: {name!r} has shape {shape}, an embedding table is 2-D")
            found[name] = Table(self.starts[index], shape[0], shape[1])
        return found


@dataclass(frozen=True, slots=True)
class Segment:
    """The part `[start, stop)` of one table that one partition holds (whole rows)."""

    table: Table
    start: int
    stop: int

    @property
    def first_row(self) -> int:
        return (self.start - self.table.start) // self.table.row_length


def checking_tables(size: int, tables: Sequence[Table]) -> None:
    reached = 0
    for table in sorted(tables, key=lambda t: t.start):
        if table.rows <= 0 or table.row_length <= 0:
            raise ValueError(f"a table needs rows and row_length above 0: {table}")
        if table.start < reached or table.stop > size:
            raise ValueError(f"tables overlap or leave the model of {size} elements: {table}")
        reached = table.stop


def laying_out(
    size: int, servers: Sequence[tuple[str, str]], tables: Sequence[Table] = ()
) -> list[Piece]:
    """Split `size` elements over `servers` ((id, address), in order); a server gets no piece
    only when there are more servers than elements, or, with tables, when two cuts move to
    the same row boundary (few rows per server)."""
    if size <= 0:
        raise ValueError("the model has no parameters to serve")
    if not servers:
        raise ValueError("parameter-server mode needs at least one server in the generation")
    checking_tables(size, tables)
    base, extra = divmod(size, len(servers))
    pieces: list[Piece] = []
    start = even = 0
    for index, (server_id, address) in enumerate(servers):
        even += base + (1 if index < extra else 0)
        stop = even
        for table in tables:
            stop = table.snapped(stop)
        if stop > start:
            pieces.append(Piece(server_id, address, start, stop))
        start = max(start, stop)
    return pieces


def splitting(piece: Piece, tables: Sequence[Table]) -> tuple[list[tuple[int, int]], list[Segment]]:
    """A piece's dense ranges (outside every table) and its table segments, in order."""
    dense: list[tuple[int, int]] = []
    segments: list[Segment] = []
    position = piece.start
    for table in sorted(tables, key=lambda t: t.start):
        start, stop = max(table.start, piece.start), min(table.stop, piece.stop)
        if start >= stop:
            continue
        if start > position:
            dense.append((position, start))
        segments.append(Segment(table, start, stop))
        position = stop
    if position < piece.stop:
        dense.append((position, piece.stop))
    return dense, segments


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
