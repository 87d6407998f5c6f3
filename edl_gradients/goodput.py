"""The one rule by which a job's batch is chosen: the per-GPU batch and the accumulation
steps that maximize goodput, throughput times statistical efficiency (Pollux's model).

Two callers ask it and must agree: the runtime's adaptive batch policy
(``trainer_runtime.adaptive.AdaptiveBatch``), which decides the batch a job really trains
at from its own measured step times and gradient noise, and the simulator's model of that
policy (``simulations.profiles``), which decides from an application's measured profile.
Each passes its step-time function and its gain function; the candidates, the objective
and the tie-break are here once, so that the simulator models what the runtime does.

The objective. One optimizer step at global batch ``B`` (``workers`` GPUs, each running
``accumulation`` micro-batches of ``local`` samples) makes the progress of ``gain(B)``
steps at the batch the learning rate was set for (``init_batch``)::

    gain(B) = (var + sqr) / (var / (B / init_batch) + sqr)

with ``sqr`` = |E[g]|^2 and ``var`` the gradient variance over ``init_batch`` samples, both
measured while the job trains (``trainer_runtime.noise``). Goodput is that progress per
second, counted in samples at ``init_batch``: ``init_batch * gain(B) / step_time``. A larger
batch runs faster per sample but each sample is worth less once the gradient noise is
small; the best batch sits where the two balance.

The candidates (as Pollux's agent searches, written our own way): ``CANDIDATES`` global
batches spaced geometrically from ``init_batch`` (never below: the learning rate was tuned
there) to ``max_batch``; for each, the fewest micro-batches whose size fits ``max_local``,
and the per-GPU batch that makes up at least that global batch. The caller may add its own
(the batch a job runs at now, so that a decision never loses to standing still).

The step-time model a runtime fits (``StepTimes``): ``accumulation`` micro-batches of
compute, each ``fixed + per_sample * local``, plus one synchronization that grows with the
workers (none alone), ``alpha + beta * (workers - 2)``: the planner's compute + sync model
(``edl_scheduler.core.throughput``) with compute made a function of the batch. It is fitted
by least squares toward a prior, so one measured batch already gives a usable model.

What must stay true: pure and deterministic (the same inputs choose the same batch on
every rank and in the simulator); the chosen global batch is within
``[init_batch, max(init_batch, max_batch)]``, but for a caller's own candidate and two
cases the bounds cannot hold: ``min_local`` on every worker may already exceed
``max_batch``, and the smallest candidate is kept even when shaping it into whole
micro-batches overshoots; its per-GPU micro-batch is within ``[min_local, max_local]``;
this module imports nothing of the project and does no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

#: Global batches tried between the initial and the largest (Pollux's agent tries 50).
CANDIDATES = 50


def gain(init_batch: int, grad_sqr: float, grad_var: float, batch: float) -> float:
    """Steps at ``init_batch`` that one step at ``batch`` is worth (1 at ``init_batch``)."""
    scale = batch / init_batch
    return (grad_var + grad_sqr) / (grad_var / scale + grad_sqr)


@dataclass(frozen=True, slots=True)
class BatchLimits:
    """The bounds of a job's batch: the global batch its learning rate was set for (the
    smallest chosen), the largest global batch, and the most and fewest samples one GPU
    holds at once."""

    init_batch: int
    max_batch: int
    max_local: int
    min_local: int = 1

    def __post_init__(self) -> None:
        if self.init_batch < 1:
            raise ValueError(f"init_batch is {self.init_batch}: a batch holds >= 1 sample")
        if self.max_batch < self.init_batch:
            raise ValueError(
                f"max_batch ({self.max_batch}) is below init_batch ({self.init_batch}): "
                "give a largest batch at least the initial one"
            )
        if not 1 <= self.min_local <= self.max_local:
            raise ValueError(
                f"min_local ({self.min_local}) and max_local ({self.max_local}) need "
                "1 <= min_local <= max_local"
            )


@dataclass(frozen=True, slots=True)
class BatchChoice:
    """A per-GPU batch and its accumulation steps at ``workers`` GPUs, and the goodput the
    deciding model predicts for it (samples per second at ``init_batch``)."""

    local: int
    accumulation: int
    workers: int
    goodput: float

    @property
    def global_batch(self) -> int:
        return self.local * self.accumulation * self.workers


def shaping(per_gpu: float, limits: BatchLimits) -> tuple[int, int]:
    """The fewest micro-batches that hold ``per_gpu`` samples within ``max_local`` each, and
    the micro-batch that makes up at least ``per_gpu`` (at least ``min_local``)."""
    accumulation = max(1, math.ceil(per_gpu / limits.max_local - 1e-9))
    local = max(limits.min_local, math.ceil(per_gpu / accumulation - 1e-9))
    return min(local, limits.max_local), accumulation


def candidates(
    limits: BatchLimits, workers: int, within: tuple[float, float] | None = None
) -> list[tuple[int, int]]:
    """(per-GPU batch, accumulation) pairs to choose among at ``workers`` GPUs, smallest
    global batch first (see the module docstring); ``within``: global batches in that
    range only (as far as the limits allow)."""
    if workers < 1:
        raise ValueError(f"workers is {workers}: a batch is chosen for >= 1 GPU")
    low = float(max(limits.init_batch, limits.min_local * workers))
    high = max(low, float(limits.max_batch))
    if within is not None:
        low, high = min(max(low, within[0]), high), max(min(high, within[1]), low)
    count = CANDIDATES if high > low else 1
    seen: dict[tuple[int, int], None] = {}
    for index in range(count):
        batch = low * (high / low) ** (index / (count - 1)) if count > 1 else low
        pair = shaping(batch / workers, limits)
        if pair[0] * pair[1] * workers <= high or not seen:
            seen.setdefault(pair, None)
    return list(seen)


def choosing(
    limits: BatchLimits,
    workers: int,
    step_time: Callable[[int, int], float],
    gain_at: Callable[[float], float],
    also: Iterable[tuple[int, int]] = (),
    within: tuple[float, float] | None = None,
) -> BatchChoice:
    """The candidate (and any of ``also``) with the most goodput: ``step_time(local,
    accumulation)`` in seconds, ``gain_at(global batch)`` as `gain`; ``within`` narrows the
    candidates' global batches (see `candidates`). Ties go to the smaller global batch
    (the first met)."""
    best: BatchChoice | None = None
    for local, accumulation in [*candidates(limits, workers, within), *also]:
        seconds = step_time(local, accumulation)
        if not seconds > 0:
            continue
        batch = local * accumulation * workers
        rate = limits.init_batch * gain_at(batch) / seconds
        if best is None or rate > best.goodput:
            best = BatchChoice(local, accumulation, workers, rate)
    if best is None:
        raise ValueError("no candidate batch has a positive step time: measure a step first")
    return best


@dataclass(frozen=True, slots=True)
class StepMeasure:
    """One measured optimizer step: its GPUs, per-GPU micro-batch, accumulation, seconds."""

    workers: int
    local: int
    accumulation: int
    seconds: float


@dataclass(frozen=True, slots=True)
class StepTimes:
    """Seconds per optimizer step (see the module docstring)."""

    fixed: float
    per_sample: float
    alpha: float
    beta: float

    def step_time(self, workers: int, local: float, accumulation: int) -> float:
        compute = self.fixed + self.per_sample * local
        sync = 0.0 if workers <= 1 else self.alpha + self.beta * (workers - 2)
        return accumulation * compute + sync


@dataclass(frozen=True, slots=True)
class MeasuredSteps:
    """Step times as measured where they were, the fitted model elsewhere: between two
    measured per-GPU batches at the same workers (one micro-batch each) the time is
    interpolated between the two measurements, and accumulation adds the model's
    compute-only share of it. A device is often as fast at a small batch as at one twice
    its size (it was not full); a line through every measurement misses that, and would
    choose differently from the measured profile it was fitted to."""

    model: StepTimes
    measures: tuple[StepMeasure, ...]

    # Outside the measured batches the model takes over, and may undercut the largest
    # measurement (a step there looks cheaper than measured): `AdaptiveBatch` moves the
    # batch at most 2x a decision, and measures each batch it adopts before going on.

    def step_time(self, workers: int, local: float, accumulation: int) -> float:
        points = sorted(
            (m.local, m.seconds)
            for m in self.measures
            if m.workers == workers and m.accumulation == 1 and m.seconds > 0
        )
        below = [p for p in points if p[0] <= local]
        above = [p for p in points if p[0] >= local]
        if not below or not above:
            return self.model.step_time(workers, local, accumulation)
        (x0, y0), (x1, y1) = below[-1], above[0]
        one = y0 if x1 == x0 else y0 + (local - x0) * (y1 - y0) / (x1 - x0)
        sync = self.model.step_time(workers, local, 1) - self.model.step_time(1, local, 1)
        return one + (accumulation - 1) * max(one - sync, 0.0)


#: The prior, relative to one micro-batch at the first measured size: half of compute is
#: fixed and half grows with the batch (what AdaptDL assumes while it has measured one
#: batch size only: a device is seldom full at the first batch, and a prior that made
#: compute all per-sample kept a job at its first batch, since a larger one looked as slow
#: per sample and was never tried); synchronization costs a twentieth and a little more
#: per extra worker (the planner's prior in spirit). Pulled toward with `RIDGE`.
PRIOR = (0.5, 0.5, 0.05, 0.005)
RIDGE = 0.05


def fitting(measures: Sequence[StepMeasure]) -> StepTimes | None:
    """The step-time model that best explains ``measures`` (least squares toward `PRIOR`,
    in units of the first measure's micro-batch time and size); None with no usable one."""
    usable = [m for m in measures if m.seconds > 0 and m.local >= 1 and m.accumulation >= 1]
    if not usable:
        return None
    first = usable[0]
    unit_time = first.seconds / first.accumulation
    unit_size = float(first.local)
    rows = [_features(m, unit_size) for m in usable]
    targets = [m.seconds / unit_time for m in usable]
    size = len(PRIOR)
    lhs = [[RIDGE * (i == j) for j in range(size)] for i in range(size)]
    rhs = [RIDGE * p for p in PRIOR]
    for row, target in zip(rows, targets, strict=True):
        for i in range(size):
            rhs[i] += row[i] * target
            for j in range(size):
                lhs[i][j] += row[i] * row[j]
    theta = [max(0.0, v) for v in _solving(lhs, rhs)]
    fixed, per_sample, alpha, beta = theta
    if fixed + per_sample <= 0:
        return None
    return StepTimes(
        fixed * unit_time, per_sample * unit_time / unit_size, alpha * unit_time, beta * unit_time
    )


def _features(measure: StepMeasure, unit_size: float) -> tuple[float, float, float, float]:
    multi = 1.0 if measure.workers > 1 else 0.0
    return (
        float(measure.accumulation),
        measure.accumulation * measure.local / unit_size,
        multi,
        multi * (measure.workers - 2),
    )


def _solving(lhs: list[list[float]], rhs: list[float]) -> list[float]:
    """Gaussian elimination with partial pivoting (the system is small and, with the
    ridge, positive definite)."""
    size = len(rhs)
    a = [[*row, value] for row, value in zip(lhs, rhs, strict=True)]
    for column in range(size):
        pivot = max(range(column, size), key=lambda r: abs(a[r][column]))
        a[column], a[pivot] = a[pivot], a[column]
        for row in range(column + 1, size):
            factor = a[row][column] / a[column][column]
            for k in range(column, size + 1):
                a[row][k] -= factor * a[column][k]
    solution = [0.0] * size
    for row in reversed(range(size)):
        known = sum(a[row][k] * solution[k] for k in range(row + 1, size))
        solution[row] = (a[row][size] - known) / a[row][row]
    return solution
