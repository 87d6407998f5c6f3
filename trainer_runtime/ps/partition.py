"""One parameter server's partition: parameters, optimizer state and the steps in flight.

Pure state (numpy arrays, no I/O, no clock); the server (`serving.py`) calls it under one
lock. A step is applied in two phases, so that a failure never leaves one partition ahead
of another:

```
push chunks --> buffered --(every contribution in)--> complete --(Apply)--> decided
                                                        |                       |
                                                        +-- Settle(through) ----+--> applied
```
Contributions are summed into one buffer per step. The leader (sync mode) or the step's
worker (async mode) sends `Apply` only after every partition reported the step complete, so
a step applied on one partition is complete on all of them: after a failure, the new
leader settles every partition to the highest watermark found (`settling`), and the steps
above it are dropped and trained again. Decided steps are applied strictly in step order, so
a partition's state is always "every step up to the watermark, nothing else", a prefix that a
snapshot can name by one number.

Generations fence: a partition fenced at g refuses calls of older generations; it serves
generation g once it adopted g's layout (`adopting`), which also drops every buffer.

Embedding tables (`layout.Table`, declared at adoption) are pushed by row: a row push covers
a whole-row range of one table segment and carries only the rows it names, the others count
as zero gradient. A step then updates only the rows some contribution pushed (their
gradients summed in contributor order): untouched rows keep their parameters and, with
momentum, their velocity (lazy momentum: a row's velocity decays only on the steps that
touch it). Dense pushes into a table segment are refused.

What must stay true: a step is applied at most once, in order, only when complete; a
contribution is counted once (a contributor's elements add up to the range, no more).
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from trainer_runtime.protocol.statuses import Conflict, Stale, Unready
from trainer_runtime.ps.layout import Piece, Segment, Table, splitting

Array = npt.NDArray[Any]
DTYPES = ("float32", "float64")


class PartitionError(Conflict, ValueError):
    """A request that would corrupt the partition; nothing changed."""


class StaleGeneration(Stale, PermissionError):
    """A call of a generation older than the one this partition was fenced at."""


class NotAdopted(Unready, RuntimeError):
    """The caller's generation is newer than the layout this partition serves (yet)."""


class Readiness(enum.Enum):
    """Where a partition stands for a call of generation g (see `Partition.readiness`)."""

    STALE = "stale"  # g is older than the fence: refuse
    WAITING = "waiting"  # g is newer than the adopted layout: wait for the leader's Adopt
    SERVING = "serving"  # g is the adopted layout


CELL = 1 << 17  # elements: the grain at which a step buffer knows what was written


@dataclass(slots=True)
class StepBuffer:
    """The sum of a step's contributions. Its memory is reused without zeroing: a chunk that
    covers whole cells nobody wrote yet is copied in, anything else is added onto cells
    zeroed when first touched (`touched`), so the sum is exact whatever the chunking."""

    total: Array
    expected: int
    touched: npt.NDArray[np.bool_]
    received: dict[int, int] = field(default_factory=dict)  # contributor -> elements
    decided: bool = False
    #: segment start -> (contributor, first row in the segment, row numbers, row values)
    rows: dict[int, list[tuple[int, int, Array, Array]]] = field(default_factory=dict)

    def adding(self, first: int, values: Array) -> None:
        last = first + values.size
        low, high = first // CELL, (last - 1) // CELL + 1
        cells = self.touched[low:high]
        region = self.total[first:last]
        whole = first == low * CELL and last == min(high * CELL, self.total.size)
        if whole and not cells.any():
            np.copyto(region, values)
        else:
            for cell in np.flatnonzero(~cells) + low:
                self.total[cell * CELL : (cell + 1) * CELL] = 0
            np.add(region, values, out=region)
        cells[:] = True

    def complete(self, length: int) -> bool:
        done = sum(1 for count in self.received.values() if count == length)
        return done >= self.expected

    def summed_rows(self, segment: Segment) -> tuple[Array, Array] | None:
        """The segment's pushed rows (numbers inside the segment, ascending) and their
        gradients summed over contributions (in contributor order: deterministic)."""
        parts = sorted(self.rows.get(segment.start, ()), key=lambda part: part[:2])
        if not parts:
            return None
        if len(parts) == 1:
            _, first, numbers, values = parts[0]
            if not numbers.size:
                return None
            return first + numbers, values if values.flags.writeable else values.copy()
        rows = np.concatenate([first + numbers for _, first, numbers, _ in parts])
        values = np.concatenate([part[3] for part in parts])
        if not rows.size:
            return None
        order = np.argsort(rows, kind="stable")
        rows, values = rows[order], values[order]
        heads = np.flatnonzero(np.concatenate(([True], rows[1:] != rows[:-1])))
        return rows[heads], np.add.reduceat(values, heads, axis=0)


@dataclass(frozen=True, slots=True)
class PartitionStatus:
    generation: int
    holding: bool
    start: int
    stop: int
    watermark: int
    complete_steps: tuple[int, ...]
    size: int
    dtype: str
    adopted: int


SnapshotHook = Callable[[int, int, int, Array, Array, int], None]


@dataclass(slots=True)
class Partition:
    generation: int = 0
    adopted: int = 0
    start: int = 0
    stop: int = 0
    size: int = 0
    dtype: str = "float32"
    lr: float = 0.0
    momentum: float = 0.0
    snapshot_every: int = 0
    watermark: int = 0
    params: Array = field(default_factory=lambda: np.zeros(0, np.float32))
    velocity: Array = field(default_factory=lambda: np.zeros(0, np.float32))
    buffers: dict[int, StepBuffer] = field(default_factory=dict)
    holding: bool = False
    tables: tuple[Table, ...] = ()
    segments: tuple[Segment, ...] = ()
    dense: tuple[tuple[int, int], ...] = ()  # ranges outside every segment, from `start`
    on_snapshot: SnapshotHook | None = None
    spare: list[Array] = field(default_factory=list)  # step buffers to reuse (no page faults)

    @property
    def length(self) -> int:
        return self.stop - self.start

    # ----- generations -----

    def readiness(self, generation: int) -> Readiness:
        if generation < self.generation or (generation < self.adopted):
            return Readiness.STALE
        if generation > self.adopted or not self.holding:
            return Readiness.WAITING
        return Readiness.SERVING

    def serving(self, generation: int) -> None:
        state = self.readiness(generation)
        if state is Readiness.STALE:
            raise StaleGeneration(
                f"generation {generation} is fenced: this server serves {self.generation}"
            )
        if state is Readiness.WAITING:
            raise NotAdopted(f"generation {generation} is not adopted yet")

    def fencing(self, generation: int) -> PartitionStatus:
        if generation < self.generation:
            raise StaleGeneration(f"generation {generation} is older than {self.generation}")
        self.generation = generation
        return self.status()

    def status(self) -> PartitionStatus:
        complete = tuple(sorted(s for s, b in self.buffers.items() if b.complete(self.length)))
        return PartitionStatus(
            self.generation,
            self.holding,
            self.start,
            self.stop,
            self.watermark,
            complete,
            self.size,
            self.dtype,
            self.adopted,
        )

    def adopting(
        self,
        generation: int,
        start: int,
        stop: int,
        size: int,
        dtype: str,
        lr: float,
        momentum: float,
        step: int,
        snapshot_every: int,
        state: tuple[Array, Array] | None,
        tables: tuple[Table, ...] = (),
    ) -> PartitionStatus:
        """Serve `[start, stop)` from cut `step` in `generation`: load `state`, or keep the
        range held (only if it is the same range at the same step)."""
        if generation < self.generation:
            raise StaleGeneration(f"generation {generation} is older than {self.generation}")
        if dtype not in DTYPES:
            raise PartitionError(f"dtype {dtype!r} is not served; use one of {DTYPES}")
        if not 0 <= start < stop <= size:
            raise PartitionError(f"range {start}..{stop} is not inside a model of {size}")
        try:
            dense, segments = splitting(Piece("", "", start, stop), tables)
        except ValueError as error:
            raise PartitionError(f"tables: {error}") from error
        for segment in segments:
            if (segment.start - segment.table.start) % segment.table.row_length or (
                segment.stop - segment.table.start
            ) % segment.table.row_length:
                raise PartitionError(f"range {start}..{stop} cuts a row of a table")
        if state is None:
            same = (self.start, self.stop, self.size, self.dtype, self.tables) == (
                start, stop, size, dtype, tables,
            )  # fmt: skip
            if not (self.holding and same and self.watermark == step):
                raise PartitionError(
                    f"cannot keep {start}..{stop} at step {step}: this server holds "
                    f"{self.start}..{self.stop} at step {self.watermark}"
                )
        else:
            params, velocity = state
            if params.shape != (stop - start,) or velocity.shape != (stop - start,):
                raise PartitionError("the loaded state does not match the range")
            self.params = np.array(params, dtype=dtype)
            self.velocity = np.array(velocity, dtype=dtype)
        self.generation = self.adopted = generation
        self.start, self.stop, self.size, self.dtype = start, stop, size, dtype
        self.lr, self.momentum, self.snapshot_every = lr, momentum, snapshot_every
        self.watermark = step
        self.buffers = {}
        self.holding = True
        self.tables, self.segments = tables, tuple(segments)
        self.dense = tuple((a - start, b - start) for a, b in dense)
        return self.status()

    # ----- the step pipeline -----

    def adding(self, step: int, contributor: int, expected: int, offset: int, data: bytes) -> None:
        """Add one chunk of a contribution to step `step`'s buffer (no-op if applied)."""
        if step <= self.watermark:
            return
        values = np.frombuffer(data, dtype=self.dtype)
        first = offset - self.start
        if first < 0 or first + values.size > self.length:
            raise PartitionError(
                f"chunk {offset}..{offset + values.size} is outside {self.start}..{self.stop}"
            )
        for segment in self.segments:
            if offset < segment.stop and segment.start < offset + values.size:
                raise PartitionError(
                    f"chunk {offset}..{offset + values.size} overlaps the table rows "
                    f"{segment.start}..{segment.stop}: push them with PushRows"
                )
        buffer = self.counting(step, contributor, expected, values.size)
        buffer.adding(first, values)

    def counting(self, step: int, contributor: int, expected: int, elements: int) -> StepBuffer:
        """Step `step`'s buffer, with `elements` more of `contributor`'s counted."""
        buffer = self.buffers.get(step)
        if buffer is None:
            cells = np.zeros(-(-self.length // CELL), dtype=np.bool_)
            buffer = StepBuffer(self.fresh_buffer(), expected, cells)
            self.buffers[step] = buffer
        if buffer.expected != expected:
            raise PartitionError(f"step {step} expects {buffer.expected} contributions")
        count = buffer.received.get(contributor, 0) + elements
        if count > self.length:
            raise PartitionError(f"contributor {contributor} sent step {step} twice")
        buffer.received[contributor] = count
        return buffer

    def segment_of(self, start: int, stop: int) -> Segment:
        """The segment holding the whole-row range `[start, stop)`, or a PartitionError
        naming the field that is wrong."""
        for segment in self.segments:
            if segment.start <= start < segment.stop:
                length = segment.table.row_length
                if (start - segment.table.start) % length:
                    raise PartitionError(f"start {start} is not a row boundary of its table")
                if not start < stop <= segment.stop or (stop - segment.table.start) % length:
                    raise PartitionError(
                        f"stop {stop} is not a row boundary in {start}..{segment.stop}"
                    )
                return segment
        raise PartitionError(f"start {start} is not inside a table segment of this partition")

    def row_numbers(self, data: bytes, count: int, start: int, stop: int) -> tuple[Segment, Array]:
        """Check a request's row numbers (unique, ascending, inside `[start, stop)`)."""
        segment = self.segment_of(start, stop)
        if len(data) != count * 8:
            raise PartitionError(f"rows: {len(data)} bytes of row numbers, expected {count} x 8")
        numbers = np.frombuffer(data, dtype="<i8")
        inside = (stop - start) // segment.table.row_length
        if numbers.size and (numbers[0] < 0 or numbers[-1] >= inside):
            raise PartitionError(f"rows: row numbers must lie in 0..{inside - 1}")
        if numbers.size > 1 and not bool(np.all(numbers[1:] > numbers[:-1])):
            raise PartitionError("rows: row numbers must be unique and ascending")
        return segment, numbers

    def adding_rows(
        self,
        step: int,
        contributor: int,
        expected: int,
        start: int,
        stop: int,
        numbers: bytes,
        count: int,
        data: bytes | bytearray,
    ) -> None:
        """Add a row push (see the module docstring) to step `step` (no-op if applied)."""
        segment, rows = self.row_numbers(numbers, count, start, stop)
        length = segment.table.row_length
        values = np.frombuffer(data, dtype=self.dtype)
        if values.size != rows.size * length:
            raise PartitionError(
                f"rows: {values.size} elements sent for {rows.size} rows of {length}"
            )
        if step <= self.watermark:
            return
        buffer = self.counting(step, contributor, expected, stop - start)
        first = (start - segment.start) // length
        part = (contributor, first, rows, values.reshape(rows.size, length))
        buffer.rows.setdefault(segment.start, []).append(part)

    def reading_rows(self, start: int, stop: int, numbers: bytes) -> Array:
        """The rows `numbers` (raw int64, counted from `start`) of a table segment."""
        segment, rows = self.row_numbers(numbers, len(numbers) // 8, start, stop)
        table = self.segment_view(self.params, segment)
        first = (start - segment.start) // segment.table.row_length
        found: Array = np.take(table, rows + first, axis=0)
        return found

    def segment_view(self, array: Array, segment: Segment) -> Array:
        low, high = segment.start - self.start, segment.stop - self.start
        return array[low:high].reshape(-1, segment.table.row_length)

    def fresh_buffer(self) -> Array:
        while self.spare:
            reused = self.spare.pop()
            if reused.shape == (self.length,) and reused.dtype == np.dtype(self.dtype):
                return reused
        return np.empty(self.length, dtype=self.dtype)

    def complete(self, step: int) -> bool:
        if step <= self.watermark:
            return True
        buffer = self.buffers.get(step)
        return buffer is not None and buffer.complete(self.length)

    def deciding(self, step: int) -> bool:
        """Mark a complete step decided and apply every decided step in order; False if the
        step is not complete here (the caller must not have decided it)."""
        if step <= self.watermark:
            return True
        if not self.complete(step):
            return False
        self.buffers[step].decided = True
        while (following := self.buffers.get(self.watermark + 1)) is not None:
            if not following.decided:
                break
            self.applying(self.watermark + 1)
        return True

    def applying(self, step: int) -> None:
        buffer = self.buffers.pop(step)
        if not self.segments:
            self.descending(buffer.total, self.params, self.velocity)
        for a, b in self.dense if self.segments else ():
            self.descending(buffer.total[a:b], self.params[a:b], self.velocity[a:b])
        for segment in self.segments:
            pushed = buffer.summed_rows(segment)
            if pushed is None:
                continue
            rows, gradient = pushed
            params = self.segment_view(self.params, segment)
            velocity = self.segment_view(self.velocity, segment)
            moved = np.take(params, rows, axis=0)
            speed = np.take(velocity, rows, axis=0) if self.momentum else moved
            self.descending(gradient, moved, speed)
            params[rows] = moved
            if self.momentum:
                velocity[rows] = speed
        self.watermark = step
        if len(self.spare) < 2:
            self.spare.append(buffer.total)
        if self.on_snapshot and self.snapshot_every and step % self.snapshot_every == 0:
            copies = (self.params.copy(), self.velocity.copy())
            self.on_snapshot(step, self.start, self.stop, *copies, self.size)

    def descending(self, gradient: Array, params: Array, velocity: Array) -> None:
        """One step of SGD with momentum (PyTorch's formula) on `params`, in place;
        `gradient` is a buffer dropped after the step, so it is scaled in place."""
        if self.momentum:
            velocity *= self.momentum
            velocity += gradient
            if self.lr == 1.0:
                params -= velocity
            else:
                np.multiply(velocity, self.lr, out=gradient)
                params -= gradient
        else:
            if self.lr != 1.0:
                gradient *= self.lr
            params -= gradient

    def settling(self, through: int) -> PartitionStatus:
        """Apply the complete steps up to `through` (decided elsewhere), drop the rest."""
        for step in range(self.watermark + 1, through + 1):
            if not self.complete(step):
                raise PartitionError(f"step {step} is not complete here: cannot settle")
        for step in range(self.watermark + 1, through + 1):
            self.buffers[step].decided = True
            self.applying(step)
        self.buffers = {}
        return self.status()

    def reading(self, start: int, stop: int) -> Array:
        if not self.start <= start < stop <= self.stop:
            raise PartitionError(f"range {start}..{stop} is outside {self.start}..{self.stop}")
        return self.params[start - self.start : stop - self.start]
