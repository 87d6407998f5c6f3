"""The measurements a coordinator keeps for the planner: the job's throughput at each size
(and the global batch it was measured at), the gradient statistics rank 0 reported last,
and the batch rank 0 runs at with the goodput its policy predicts.

Why a module of its own: they are values with their own small rules (smoothing, validity),
held by the state (`state.py`) and read into and out of its messages (`messages.py`); kept
apart so that the state, which decides fencing and commits, stays small.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from edl_gradients import statistics_problem
from edl_gradients.goodput import BatchLimits

SMOOTHING = 0.2


@dataclass(slots=True)
class ThroughputRecord:
    """Smoothed throughput of the job at one size (distinct nodes, workers), and the global
    batch it was measured at (0: not known, as in independent mode).

    What must stay true: the rate is of one batch only. A step at another batch than the
    record's starts the record again at that batch (the smoothing restarts), so that the
    planner, which weighs each size's rate by its batch's efficiency, never weighs a rate
    of one batch by another's gain."""

    nodes: int
    workers: int
    samples_per_s: float = 0.0
    step_time_s: float = 0.0
    steps: int = 0
    batch: int = 0

    def recording(self, samples: int, step_time_s: float, batch: int = 0) -> None:
        if step_time_s <= 0:
            return
        if batch != self.batch:
            self.batch, self.steps = batch, 0
        rate = samples / step_time_s
        if self.steps == 0:
            self.samples_per_s, self.step_time_s = rate, step_time_s
        else:
            self.samples_per_s += SMOOTHING * (rate - self.samples_per_s)
            self.step_time_s += SMOOTHING * (step_time_s - self.step_time_s)
        self.steps += 1


@dataclass(frozen=True, slots=True)
class NoiseRecord:
    """The gradient statistics rank 0 reported last (see `GradientNoise` in the proto):
    what the planner weighs the job's throughput by. Only valid records are kept."""

    init_batch: int
    grad_sqr: float
    grad_var: float
    steps: int

    def problem(self) -> str | None:
        """Why the record is unusable (the planner's rule, then at least one step), or None."""
        problem = statistics_problem(self.init_batch, self.grad_sqr, self.grad_var)
        if problem is not None:
            return problem
        if self.steps < 1:
            return f"steps is {self.steps}: a reported estimate rests on at least one step"
        return None


@dataclass(frozen=True, slots=True)
class BatchRecord:
    """What rank 0 runs at, as its last commit reported it (`BatchInUse` in the proto): the
    global batch, its accumulation steps, and the goodput its batch policy predicts there
    (samples per second at the initial batch's efficiency; 0 when it cannot predict), and
    the bounds an adaptive batch policy chooses within (``max_batch``, ``max_local``,
    ``min_local``: 0 where the batch does not adapt). Only valid records are kept."""

    global_batch: int
    accumulation: int
    goodput: float
    max_batch: int = 0
    max_local: int = 0
    min_local: int = 0

    def problem(self) -> str | None:
        """Why the record is unusable, or None."""
        if self.global_batch < 1 or self.accumulation < 1:
            return (
                f"global_batch {self.global_batch} or accumulation {self.accumulation} is "
                "below 1: a step trains at least one sample, in at least one pass"
            )
        if not math.isfinite(self.goodput) or self.goodput < 0:
            return f"goodput is {self.goodput}: it is a finite rate, 0 when unknown"
        if any(self.bounds()):  # (all 0 where the batch does not adapt)
            try:  # the bounds' own rule (the initial batch travels with the noise, not here)
                BatchLimits(1, self.max_batch, self.max_local, self.min_local)
            except ValueError as e:
                return f"adaptive batch bounds: {e}"
        return None

    def bounds(self) -> list[int]:
        """``max_batch``, ``max_local``, ``min_local``."""
        return [self.max_batch, self.max_local, self.min_local]
