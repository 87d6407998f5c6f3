"""What the simulator replays: jobs as a trace describes them, a cluster, and how fast a job
trains at each size.

A trace says that a job ran ``duration`` seconds on ``requested`` GPUs. At any other size its
speed follows a scaling curve (``Scaling``): the job's total work is ``duration`` seconds at
its requested size, and at ``w`` workers it advances ``speedup(w) / speedup(requested)``
seconds of that work per second. So a job run at its requested size always takes exactly its
trace duration, whatever the curve (the fidelity checks depend on that).

Elasticity is an explicit assumption, never read from a trace (Philly jobs were rigid):
``rigid`` gives min = max = requested; ``elastic`` gives min = ceil(requested / 2) and
max = 2 x requested, capped by the cluster's GPUs. Rigid policies run every job at its
requested size whatever its bounds.

Everything here is a frozen value; the engine keeps the mutable state.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, replace
from enum import Enum
from typing import Protocol

from edl_scheduler.core.snapshot import Efficiency


class Elasticity(Enum):
    RIGID = "rigid"
    ELASTIC = "elastic"


@dataclass(frozen=True, slots=True)
class Scaling:
    """Amdahl-type scaling: ``speedup(w) = 1 / (serial + (1 - serial) / w)``.

    ``serial = 0`` is linear scaling. A job's curve is relative to one worker; only ratios of
    speed-ups are ever used, so the curve's scale does not matter.
    """

    serial: float = 0.1

    def speedup(self, workers: int) -> float:
        if workers <= 0:
            return 0.0
        return 1.0 / (self.serial + (1.0 - self.serial) / workers)

    @property
    def label(self) -> str:
        return "linear" if self.serial == 0 else f"amdahl:{self.serial:g}"


LINEAR = Scaling(0.0)


class ScalingSpecError(ValueError):
    """A ``--scaling`` value that is not ``linear``, ``amdahl:F`` or ``amdahl:LO-HI``."""


@dataclass(frozen=True, slots=True)
class ScalingRule:
    """How each job gets its curve: one serial fraction for all, or a per-job seeded draw
    uniform in ``[low, high]`` (``amdahl:0.05-0.3``)."""

    low: float
    high: float

    @classmethod
    def parse(cls, text: str) -> ScalingRule:
        if text == "linear":
            return cls(0.0, 0.0)
        kind, _, arg = text.partition(":")
        if kind != "amdahl" or not arg:
            raise ScalingSpecError(f"scaling {text!r}: use linear, amdahl:F or amdahl:LO-HI")
        lo_text, dash, hi_text = arg.partition("-")
        try:
            low = float(lo_text)
            high = float(hi_text) if dash else low
        except ValueError:
            raise ScalingSpecError(f"scaling {text!r}: F must be a number") from None
        if not 0.0 <= low <= high <= 1.0:
            raise ScalingSpecError(f"scaling {text!r}: need 0 <= F <= 1 (and LO <= HI)")
        return cls(low, high)

    def draw(self, rng: random.Random) -> Scaling:
        if self.low == self.high:
            return Scaling(self.low)
        return Scaling(rng.uniform(self.low, self.high))


class SpeedModel(Protocol):
    """A job's speed from a measured profile, not a trace duration (the Pollux workloads).

    ``total`` is the work to do; ``rate(placement, done)`` the work per second with
    ``placement`` = GPUs used on each node, after ``done`` work; the rate is constant between
    ``done`` and ``horizon(done)``. ``useful`` is what the placement is worth in single GPUs.
    ``measured`` is what the job's runtime reports there (samples per second, global batch)
    and ``efficiency`` its statistical efficiency now, both for the planner's snapshot.
    """

    @property
    def total(self) -> float: ...

    def rate(self, placement: tuple[int, ...], done: float) -> float: ...

    def horizon(self, done: float) -> float: ...

    def useful(self, placement: tuple[int, ...], done: float) -> float: ...

    def measured(self, placement: tuple[int, ...], done: float) -> tuple[float, int]: ...

    def efficiency(self, placement: tuple[int, ...], done: float) -> Efficiency: ...


@dataclass(frozen=True, slots=True)
class SimJob:
    """One job of a workload. ``duration`` is seconds at ``requested`` workers, unless a
    ``profile`` gives its speed (then ``duration`` is unused)."""

    name: str
    submit_time: float
    requested: int
    duration: float
    min_workers: int
    max_workers: int
    scaling: Scaling = LINEAR
    priority: int = 0
    group: str = ""
    profile: SpeedModel | None = None
    #: Elastic bounds the workload itself gives (Pollux jobs), instead of the Philly rule.
    elastic_bounds: tuple[int, int] | None = None

    @property
    def work(self) -> float:
        return self.duration if self.profile is None else self.profile.total

    def rate(self, workers: int) -> float:
        """Seconds of trace work done per second at ``workers`` workers."""
        if workers <= 0:
            return 0.0
        if workers == self.requested:
            return 1.0
        return self.scaling.speedup(workers) / self.scaling.speedup(self.requested)

    def useful_gpus(self, workers: int) -> float:
        """GPUs weighted by scaling efficiency: what ``workers`` are worth as perfectly
        scaling GPUs (``workers`` for linear scaling)."""
        if workers <= 0:
            return 0.0
        return self.scaling.speedup(workers)


@dataclass(frozen=True, slots=True)
class ClusterSpec:
    """Identical nodes: ``nodes`` x ``gpus_per_node`` GPUs (CPU and memory do not bind)."""

    nodes: int
    gpus_per_node: int

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def label(self) -> str:
        return f"{self.nodes}x{self.gpus_per_node}"


@dataclass(frozen=True, slots=True)
class Workload:
    """Jobs sorted by submit time (ties by name), and where they came from."""

    jobs: tuple[SimJob, ...]
    source: str
    skipped_rows: int = 0


def bounds(requested: int, elasticity: Elasticity, cluster_gpus: int) -> tuple[int, int]:
    """A job's (min, max) workers under an elasticity assumption."""
    if elasticity is Elasticity.RIGID:
        return requested, requested
    high = max(requested, min(2 * requested, cluster_gpus))
    return max(1, math.ceil(requested / 2)), high


def parse_priorities(text: str) -> int:
    """``none`` (every job priority 0) or ``draw:K`` (a seeded uniform draw of 0..K-1)."""
    if text == "none":
        return 1
    kind, _, arg = text.partition(":")
    if kind == "draw" and arg.isdigit() and int(arg) >= 1:
        return int(arg)
    raise ValueError(f"priorities {text!r}: use none or draw:K")


def shape(
    jobs: Sequence[SimJob],
    *,
    elasticity: Elasticity,
    scaling: ScalingRule,
    cluster: ClusterSpec,
    seed: int,
    priority_levels: int = 1,
) -> tuple[SimJob, ...]:
    """Give every job its bounds, scaling curve and priority. Draws are seeded and made in
    job order (curves and priorities from separate streams), so a workload and a seed always
    give the same jobs, and changing one rule does not change the other's draws."""
    curves = random.Random(seed)
    levels = random.Random(seed + 1_000_003)
    out = []
    for job in jobs:
        lo, hi = _bounds_of(job, elasticity, cluster.gpus)
        prio = levels.randrange(priority_levels) if priority_levels > 1 else job.priority
        out.append(
            replace(
                job, min_workers=lo, max_workers=hi, scaling=scaling.draw(curves), priority=prio
            )
        )
    return tuple(out)


def with_elasticity(jobs: Sequence[SimJob], elasticity: Elasticity, gpus: int) -> list[SimJob]:
    """The same jobs with other bounds (the ``@rigid`` / ``@elastic`` policy suffix)."""
    out = []
    for job in jobs:
        lo, hi = _bounds_of(job, elasticity, gpus)
        out.append(replace(job, min_workers=lo, max_workers=hi))
    return out


def _bounds_of(job: SimJob, elasticity: Elasticity, gpus: int) -> tuple[int, int]:
    """Jobs whose workload gives elastic bounds (Pollux) keep them, capped by the cluster."""
    if job.elastic_bounds is not None:
        if elasticity is Elasticity.RIGID:
            return job.requested, job.requested
        lo, hi = job.elastic_bounds
        return min(lo, job.requested), max(job.requested, min(hi, gpus))
    return bounds(job.requested, elasticity, gpus)
