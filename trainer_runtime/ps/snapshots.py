"""Snapshots of partitions in a directory every server and the leader share.

A partition writes its parameters and optimizer state (one `.npy` file holding two rows) at
a step number: `<root>/step-<step>/<start>-<stop>.npy`, atomically (a temporary file renamed
into place). Files of one step hold states at the same step of the same sample sequence, so
any set of them that covers `[0, size)` is a consistent cut, whatever layouts wrote them.
Restoring a range reads the overlapping pieces of one cut.

What must stay true: a file exists only complete; `latest_cut` names a step whose files cover
every element; a partition removes its own files only below the newest complete cut (keeping
at least its `KEEP` newest), so a complete cut always remains once one was written.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from trainer_runtime.protocol.statuses import Missing

KEEP = 3
STEP_DIR = re.compile(r"^step-(\d+)$")
PIECE_FILE = re.compile(r"^(\d+)-(\d+)\.npy$")

Array = npt.NDArray[Any]


class SnapshotMissing(Missing, LookupError):
    """No complete cut covers the model: a partition cannot be restored."""


class SnapshotDirectory:
    def __init__(self, root: Path | str) -> None:
        self.root = Path(root)

    def step_dir(self, step: int) -> Path:
        return self.root / f"step-{step:012d}"

    def writing(
        self, step: int, start: int, stop: int, params: Array, velocity: Array, size: int = 0
    ) -> None:
        """Write one partition's state at `step`, then prune this range's files older than
        the newest complete cut of a model of `size` elements (0: the range is the model)."""
        directory = self.step_dir(step)
        directory.mkdir(parents=True, exist_ok=True)
        target = directory / f"{start}-{stop}.npy"
        descriptor, temporary = tempfile.mkstemp(prefix=".", suffix=".tmp", dir=directory)
        try:
            with os.fdopen(descriptor, "wb") as handle:
                np.save(handle, np.stack([params, velocity]))
            os.replace(temporary, target)
        except BaseException:
            Path(temporary).unlink(missing_ok=True)
            raise
        self.pruning_range(start, stop, size or stop)

    def steps(self) -> list[int]:
        if not self.root.is_dir():
            return []
        found = (STEP_DIR.match(p.name) for p in self.root.iterdir())
        return sorted(int(m.group(1)) for m in found if m)

    def pieces(self, step: int) -> list[tuple[int, int, Path]]:
        directory = self.step_dir(step)
        if not directory.is_dir():
            return []
        found = []
        for path in directory.iterdir():
            match = PIECE_FILE.match(path.name)
            if match:
                found.append((int(match.group(1)), int(match.group(2)), path))
        return sorted(found)

    def covers(self, step: int, size: int) -> bool:
        reached = 0
        for start, stop, _ in self.pieces(step):
            if start > reached:
                return False
            reached = max(reached, stop)
        return reached >= size

    def latest_cut(self, size: int, at_most: int | None = None) -> int:
        """The newest step (not above `at_most`) whose files cover the whole model."""
        for step in reversed(self.steps()):
            if (at_most is None or step <= at_most) and self.covers(step, size):
                return step
        raise SnapshotMissing(f"no snapshot in {self.root} covers all {size} parameters")

    def reading(self, step: int, start: int, stop: int, dtype: str) -> tuple[Array, Array]:
        """Parameters and optimizer state of `[start, stop)` at `step`."""
        params = np.empty(stop - start, dtype=dtype)
        velocity = np.empty(stop - start, dtype=dtype)
        reached = start
        for first, last, path in self.pieces(step):
            if last <= reached or first > reached:
                continue
            stored = np.load(path, mmap_mode="r")
            upto = min(last, stop)
            params[reached - start : upto - start] = stored[0, reached - first : upto - first]
            velocity[reached - start : upto - start] = stored[1, reached - first : upto - first]
            reached = upto
            if reached >= stop:
                return params, velocity
        raise SnapshotMissing(f"the snapshot at step {step} lacks elements {reached}..{stop}")

    def pruning_range(self, start: int, stop: int, size: int) -> None:
        name = f"{start}-{stop}.npy"
        try:
            cut = self.latest_cut(size)
        except SnapshotMissing:
            return
        mine = [step for step in self.steps() if (self.step_dir(step) / name).exists()]
        for step in mine[:-KEEP]:
            if step >= cut:
                break
            (self.step_dir(step) / name).unlink(missing_ok=True)
            with contextlib.suppress(OSError):  # other pieces remain, or are being written
                self.step_dir(step).rmdir()

    def pruning_before(self, step: int) -> None:
        """Remove every step older than `step` (the leader, once `step` is a complete cut)."""
        for older in self.steps():
            if older < step:
                shutil.rmtree(self.step_dir(older), ignore_errors=True)
