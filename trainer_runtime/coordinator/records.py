"""The measurements a coordinator keeps for the planner: the job's throughput at each size,
and the gradient statistics rank 0 reported last.

Why a module of its own: they are values with their own small rules (smoothing, validity),
held by the state (`state.py`) and read into and out of its messages (`messages.py`); kept
apart so that the state, which decides fencing and commits, stays small.
"""

from __future__ import annotations

from dataclasses import dataclass

from edl_gradients import statistics_problem

SMOOTHING = 0.2


@dataclass(slots=True)
class ThroughputRecord:
    """Smoothed throughput of the job at one size (distinct nodes, workers)."""

    nodes: int
    workers: int
    samples_per_s: float = 0.0
    step_time_s: float = 0.0
    steps: int = 0

    def recording(self, samples: int, step_time_s: float) -> None:
        if step_time_s <= 0:
            return
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
