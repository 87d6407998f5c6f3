"""Measured application profiles (the Pollux workloads) and the speed model built on them.

Data (``pollux/traces/<application>/``, from the Pollux OSDI'21 artifact, Apache-2.0):
``placements.csv`` and ``scalability.csv`` give the measured step time by placement and
local batch size; ``validation-<global batch>.csv`` gives, per epoch, the progress made and
the gradient statistics (``grad_sqr``, ``grad_var``) measured at that batch size.

The model, as the issue and the Pollux paper describe it (our own code):

- Step time: interpolated in the local batch size from the rows of the job's placement (the
  GPUs used on each node, as digits, ``22`` = 2 nodes x 2 GPUs); placements over more than
  four nodes use ``scalability.csv`` at the nearest node count at or above the job's,
  interpolated in the replica count. A local batch above the application's largest is run as
  several accumulation steps (compute repeated, one synchronization).
- Statistical efficiency: one step at global batch ``B`` makes progress
  ``gain = (var + sqr) / (var / scale + sqr)`` with ``scale = B / init_batch`` and ``sqr``,
  ``var`` from the validation curves at the job's current epoch, interpolated linearly
  between the measured batches nearest ``B``. So a larger batch is never free.
- Completion: when progress reaches the progress of the application's completion epoch on its
  initial-batch curve. The epoch is read from that curve too.

Progress is piecewise constant in rate between epoch boundaries, so ``horizon`` tells the
engine where the rate may change next.

What the planner is told (``ProfileSpeed.measured`` and ``efficiency``) is what a runtime
measures: samples per second at the batch the job trains at, and the gradient statistics
at that batch now; the planner turns them into goodput itself (``core.throughput``).
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import TypeVar

import numpy as np

from edl_gradients.goodput import BatchLimits, choosing, gain
from edl_scheduler.core.snapshot import Efficiency

_K = TypeVar("_K", str, tuple[int, int])
_Arrays = tuple[np.ndarray, np.ndarray, np.ndarray]

#: Completion epochs of the Pollux simulator (``../shared/traces/README.md``).
MAX_EPOCHS = {"bert": 2, "cifar10": 100, "ncf": 10, "imagenet": 90, "deepspeech2": 80, "yolov3": 50}
#: yolov3's local batch is capped at 8 (as in the Pollux simulator).
LOCAL_BSZ_CAP = {"yolov3": 8}


@dataclass(frozen=True)
class Curve:
    """One validation file: per epoch, cumulative progress and gradient statistics."""

    progress: tuple[float, ...]
    sqr: tuple[float, ...]
    var: tuple[float, ...]


@dataclass(frozen=True, eq=False)
class Application:
    name: str
    #: placement key -> (local batch sizes, step times, sync times), sorted by batch size.
    placements: dict[str, _Arrays] = field(repr=False)
    #: (nodes, replicas) -> the same.
    scalability: dict[tuple[int, int], _Arrays] = field(repr=False)
    curves: dict[int, Curve] = field(repr=False)
    max_epochs: int = 1

    @property
    def init_batch(self) -> int:
        return min(self.curves)

    @property
    def max_batch(self) -> int:
        return max(self.curves)

    @property
    def min_local(self) -> int:
        return int(self.placements["1"][0][0])

    @property
    def max_local(self) -> int:
        top = int(max(float(v[0][-1]) for v in self.placements.values()))
        return min(top, LOCAL_BSZ_CAP.get(self.name, top))

    @property
    def target(self) -> float:
        """Progress at the completion epoch, on the initial-batch curve."""
        curve = self.curves[self.init_batch].progress
        return curve[min(self.max_epochs, len(curve)) - 1]

    def epoch(self, done: float) -> int:
        return int(np.searchsorted(self.curves[self.init_batch].progress, done, side="right"))

    def horizon(self, done: float) -> float:
        """The progress at which the epoch (and so the rate) next changes."""
        curve = self.curves[self.init_batch].progress
        e = self.epoch(done)
        return curve[e] if e < len(curve) else math.inf

    def _rows(self, placement: tuple[int, ...]) -> list[tuple[float, _Arrays]]:
        """The measured rows for ``placement``, with interpolation weights."""
        key = "".join(str(g) for g in sorted(placement))
        if key in self.placements:
            return [(1.0, self.placements[key])]
        nodes, replicas = len(placement), sum(placement)
        counts = sorted({n for n, _ in self.scalability})
        at = next((n for n in counts if n >= nodes), counts[-1])
        have = sorted(r for n, r in self.scalability if n == at)
        lo = max((r for r in have if r <= replicas), default=have[0])
        hi = min((r for r in have if r >= replicas), default=have[-1])
        w = 0.0 if hi == lo else (replicas - lo) / (hi - lo)
        return [(1.0 - w, self.scalability[(at, lo)]), (w, self.scalability[(at, hi)])]

    @property
    def limits(self) -> BatchLimits:
        """The bounds an adapting job chooses its batch within (as Pollux's agent does:
        the smallest and largest measured global batch, the profiled local batches)."""
        return BatchLimits(self.init_batch, self.max_batch, self.max_local, self.min_local)

    def step_time(self, placement: tuple[int, ...], local: float) -> float:
        """Seconds per step at ``local`` samples per GPU, with accumulation above the max."""
        steps = max(1, math.ceil(local / self.max_local))
        return self.accumulated_time(placement, local / steps, steps)

    def accumulated_time(self, placement: tuple[int, ...], local: float, steps: int) -> float:
        """Seconds per step of ``steps`` micro-batches of ``local`` samples per GPU: the
        compute of each, one synchronization."""
        one = sync = 0.0
        for weight, (bsz, step, synced) in self._rows(placement):
            one += weight * float(np.interp(local, bsz, step))
            sync += weight * float(np.interp(local, bsz, synced))
        return one + (steps - 1) * (one - sync)

    def grad_stats(self, global_batch: float, epoch: int) -> tuple[float, float]:
        """(grad_sqr, grad_var) measured at ``epoch``, interpolated linearly in the batch
        between the curves of the nearest measured batches (the end curves outside them),
        as Pollux's simulator reads them."""
        sizes = sorted(self.curves)
        lo = max((b for b in sizes if b <= global_batch), default=sizes[0])
        hi = min((b for b in sizes if b >= global_batch), default=sizes[-1])
        low, high = self._stats_at(lo, epoch), self._stats_at(hi, epoch)
        if hi == lo:
            return low
        w = (global_batch - lo) / (hi - lo)
        return (low[0] + w * (high[0] - low[0]), low[1] + w * (high[1] - low[1]))

    def _stats_at(self, batch: int, epoch: int) -> tuple[float, float]:
        curve = self.curves[batch]
        e = min(epoch, len(curve.sqr) - 1)
        return curve.sqr[e], curve.var[e]

    def gain(self, global_batch: float, epoch: int) -> float:
        sqr, var = self.grad_stats(global_batch, epoch)
        return gain(self.init_batch, sqr, var, global_batch)


def _floats(path: Path, columns: tuple[str, ...]) -> list[tuple[float, ...]]:
    with path.open(newline="") as handle:
        return [tuple(float(row[c]) for c in columns) for row in csv.DictReader(handle)]


def _grouped(rows: list[tuple[_K, float, float, float]]) -> dict[_K, _Arrays]:
    groups: dict[_K, list[tuple[float, float, float]]] = {}
    for key, bsz, step, sync in rows:
        groups.setdefault(key, []).append((bsz, step, sync))
    out: dict[_K, _Arrays] = {}
    for key, values in groups.items():
        arr = np.array(sorted(values))
        out[key] = (arr[:, 0], arr[:, 1], arr[:, 2])
    return out


@lru_cache(maxsize=16)
def load_application(root: Path, name: str) -> Application:
    """The profile of ``name`` under ``root`` (``.../pollux/traces``)."""
    folder = root / name
    with (folder / "placements.csv").open(newline="") as handle:
        place_rows = [
            (r["placement"], float(r["local_bsz"]), float(r["step_time"]), float(r["sync_time"]))
            for r in csv.DictReader(handle)
        ]
    scal = _floats(
        folder / "scalability.csv",
        ("num_nodes", "num_replicas", "local_bsz", "step_time", "sync_time"),
    )
    scal_rows = [((int(n), int(r)), b, s, y) for n, r, b, s, y in scal]
    curves = {}
    for path in folder.glob("validation-*.csv"):
        batch = int(path.stem.split("-")[1])
        rows = _floats(path, ("progress", "grad_sqr", "grad_var"))
        curves[batch] = Curve(
            tuple(r[0] for r in rows), tuple(r[1] for r in rows), tuple(r[2] for r in rows)
        )
    return Application(
        name,
        _grouped(place_rows),
        _grouped(scal_rows),
        curves,
        MAX_EPOCHS.get(name, 1),
    )


@dataclass(frozen=True)
class ProfileSpeed:
    """A Pollux-workload job's speed: progress units per second, given its placement.

    ``batch`` is the global batch the job was submitted with; with ``adapt`` the job
    chooses, at every size and epoch, its per-GPU batch and accumulation steps by the rule
    the runtime's adaptive policy follows (``edl_gradients.goodput.choosing``, as Pollux's
    agent does: global batches from the smallest to the largest measured, micro-batches
    within the profiled local batches). Without accumulation an adapting job across nodes
    was held to small batches whose every step paid the network's sync (bert on 2 x 4
    GPUs: 4,807 s to its end against 2,460 s at its submitted 384).
    """

    app: Application
    batch: int
    adapt: bool = False

    @property
    def total(self) -> float:
        return self.app.target

    def horizon(self, done: float) -> float:
        return self.app.horizon(done)

    def rate(self, placement: tuple[int, ...], done: float) -> float:
        return _rate(self, tuple(sorted(placement)), self.app.epoch(done))

    def useful(self, placement: tuple[int, ...], done: float) -> float:
        """GPUs worth, as single GPUs of the same job: its rate over its rate on one GPU
        (with batch adaptation, one GPU at its own best batch too; measured against the
        submitted batch instead, an adapting job counted more useful GPUs than it held)."""
        one = _rate(self, (1,), self.app.epoch(done))
        return self.rate(placement, done) / one if one > 0 else 0.0

    def measured(self, placement: tuple[int, ...], done: float) -> tuple[float, int]:
        """What the job's runtime would report at ``placement`` now: samples per second
        and the global batch it trains at (the one batch adaptation chose)."""
        placement = tuple(sorted(placement))
        local = _choice(self, placement, self.app.epoch(done))[1]
        workers = sum(placement)
        if workers <= 0:
            return 0.0, 0
        return local * workers / self.app.step_time(placement, local), round(local * workers)

    def efficiency(self, placement: tuple[int, ...], done: float) -> Efficiency:
        """The gradient statistics the job measures now, at the batch it trains at
        (``Application.gain`` reads the same curve, so at that batch the two agree)."""
        workers = sum(placement)
        epoch = self.app.epoch(done)
        if workers > 0:
            batch = _choice(self, tuple(sorted(placement)), epoch)[1] * workers
        else:
            batch = self.batch if not self.adapt else self.app.init_batch
        sqr, var = self.app.grad_stats(batch, epoch)
        if not self.adapt:
            return Efficiency(self.app.init_batch, sqr, var)
        limits = self.app.limits  # (an adapting job reports the bounds it adapts within)
        return Efficiency(
            limits.init_batch, sqr, var, limits.max_batch, limits.max_local, limits.min_local
        )


@lru_cache(maxsize=200_000)
def _rate(speed: ProfileSpeed, placement: tuple[int, ...], epoch: int) -> float:
    return _choice(speed, placement, epoch)[0]


@lru_cache(maxsize=200_000)
def _choice(speed: ProfileSpeed, placement: tuple[int, ...], epoch: int) -> tuple[float, float]:
    """Progress per second at ``placement`` and the local batch (per GPU, accumulation
    steps together) that gives it. An adapting job decides by the rule the runtime's
    adaptive policy decides by (``edl_gradients.goodput.choosing``), from the profile's
    step times and gradient statistics."""
    app, workers = speed.app, sum(placement)
    if workers <= 0:
        return 0.0, 0.0
    if not speed.adapt:
        local = speed.batch / workers
        return app.gain(speed.batch, epoch) / app.step_time(placement, local), local
    choice = choosing(
        app.limits,
        workers,
        lambda local, steps: app.accumulated_time(placement, local, steps),
        lambda batch: app.gain(batch, epoch),
    )
    # choosing's goodput is in samples at the initial batch: progress is in steps there
    return choice.goodput / app.init_batch, float(choice.local * choice.accumulation)
