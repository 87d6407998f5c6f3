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
    ) -> PartitionStatus:
        """Serve `[start, stop)` from cut `step` in `generation`: load `state`, or keep the
        range held (only if it is the same range at the same step)."""
        if generation < self.generation:
            raise StaleGeneration(f"generation {generation} is older than {self.generation}")
        if dtype not in DTYPES:
            raise PartitionError(f"dtype {dtype!r} is not served; use one of {DTYPES}")
        if not 0 <= start < stop <= size:
            raise PartitionError(f"range {start}..{stop} is not inside a model of {size}")
        if state is None:
            same = (self.start, self.stop, self.size, self.dtype) == (start, stop, size, dtype)
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
        buffer = self.buffers.get(step)
        if buffer is None:
            cells = np.zeros(-(-self.length // CELL), dtype=np.bool_)
            buffer = StepBuffer(self.fresh_buffer(), expected, cells)
            self.buffers[step] = buffer
        if buffer.expected != expected:
            raise PartitionError(f"step {step} expects {buffer.expected} contributions")
        count = buffer.received.get(contributor, 0) + values.size
        if count > self.length:
            raise PartitionError(f"contributor {contributor} sent step {step} twice")
        buffer.adding(first, values)
        buffer.received[contributor] = count

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
        gradient = buffer.total  # the buffer is dropped after this step: scale it in place
        if self.momentum:
            self.velocity *= self.momentum
            self.velocity += gradient
            gradient = self.velocity
            if self.lr == 1.0:
                self.params -= gradient
            else:
                np.multiply(gradient, self.lr, out=buffer.total)
                self.params -= buffer.total
        else:
            if self.lr != 1.0:
                gradient *= self.lr
            self.params -= gradient
        self.watermark = step
        if len(self.spare) < 2:
            self.spare.append(buffer.total)
        if self.on_snapshot and self.snapshot_every and step % self.snapshot_every == 0:
            copies = (self.params.copy(), self.velocity.copy())
            self.on_snapshot(step, self.start, self.stop, *copies, self.size)

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
