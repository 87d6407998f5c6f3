"""The gradient noise estimator: |E[g]|^2 and the gradient variance from two batch sizes.

Framework-free (the PyTorch and the PaddlePaddle adapters feed it the numbers their
allreduce measured), so that a Paddle job never imports torch.

Pollux (and AdaptDL, its runtime) weighs a job's throughput by its statistical efficiency,
which needs two numbers the job measures while it trains: ``grad_sqr`` = |G|^2, the squared
norm of the true gradient G, and the trace sigma^2 of the covariance of one sample's
gradient. A data-parallel step yields both at almost no cost, because it already holds
gradients of two batch sizes: rank i's local gradient g_i over its b_i samples, and the
averaged gradient g over all B samples of the step. For independent samples

    E|g_i|^2 = |G|^2 + sigma^2 / b_i        E|g|^2 = |G|^2 + sigma^2 / B

so, with L the mean of |g_i|^2 over the n ranks and m the mean of 1/b_i,

    sigma^2 = (L - |g|^2) / (m - 1/B)       |G|^2 = |g|^2 - sigma^2 / B

are unbiased for one step. One step's estimate is very noisy (it may even be negative), so
the estimator keeps an exponential moving average of both, debiased for its start (the
average of k steps divides by 1 - theta^k, as Adam does); a step at a batch ``scale`` times
the initial one holds ``scale`` times the samples and weighs as much: its theta is
``smoothing ** scale``.

What it reports is in the planner's unit (``snapshot.Efficiency``): ``grad_var`` is the
variance of a gradient over ``init_batch`` samples, sigma^2 / init_batch, so that one step
at batch B makes the progress of ``(var + sqr) / (var * init_batch / B + sqr)`` steps at
init_batch.

Limits, on purpose: with one rank (n = 1) L and |g|^2 are the same number and nothing can be
learned; such steps are skipped, and the estimate of the last bigger generation is kept.
(Splitting the step into two micro-batches would change the user's loop; pairing two
consecutive steps, as AdaptDL does, costs a copy of the gradient.) The gradient is the raw
one, not preconditioned by an adaptive optimizer (Adam's scaling is not applied).

What must stay true: a step with fewer than two measured ranks, or with non-finite numbers,
changes nothing; `estimate()` is None until a step was measured; the estimate is a pure
function of the steps observed and `smoothing` (every rank of a generation holds the same,
since rank 0 sends `shared_state()` when a generation forms).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from trainer_runtime.protocol import pb

DEFAULT_SMOOTHING = 0.999  # about the last thousand steps at the initial batch


@dataclass(frozen=True, slots=True)
class NoiseSample:
    """What one data-parallel step measured (the sums are over the measured ranks)."""

    local_sqr: float  # sum over ranks of |g_i|^2, each rank's local gradient's squared norm
    inverse_batch: float  # sum over ranks of 1 / b_i
    ranks: int  # ranks measured (a rank with a stand-in sample and no real one is not)
    global_sqr: float  # |g|^2, the averaged gradient's squared norm
    batch: int  # B, the samples of the step

    def unbiased(self) -> tuple[float, float] | None:
        """This step's (|G|^2, sigma^2), or None when it cannot tell them apart."""
        values = (self.local_sqr, self.inverse_batch, self.global_sqr)
        if self.ranks < 2 or self.batch < 2 or not all(math.isfinite(v) for v in values):
            return None
        spread = self.inverse_batch / self.ranks - 1.0 / self.batch
        if spread <= 0:
            return None
        variance = (self.local_sqr / self.ranks - self.global_sqr) / spread
        return self.global_sqr - variance / self.batch, variance


@dataclass(frozen=True, slots=True)
class NoiseEstimate:
    """The smoothed statistics, in the planner's unit (see the module docstring)."""

    init_batch: int
    grad_sqr: float
    grad_var: float
    steps: int
    #: The standard error of `grad_sqr` (how far the smoothed per-step estimates scatter,
    #: over the steps the average rests on): one step's |G|^2 is the small difference of
    #: two large numbers when the noise dominates, and a few dozen steps leave it uncertain.
    sqr_error: float = 0.0


class NoiseEstimator:
    """Debiased exponential moving averages of |G|^2 and sigma^2 (see the module docstring)."""

    def __init__(self, init_batch: int, smoothing: float = DEFAULT_SMOOTHING) -> None:
        if init_batch < 1:
            raise ValueError(f"init_batch is {init_batch}: it must be >= 1")
        if not 0.0 <= smoothing < 1.0:
            raise ValueError(f"smoothing is {smoothing}: it must be in [0, 1)")
        self.init_batch = init_batch
        self.smoothing = smoothing
        self.biased_sqr = 0.0
        self.biased_var = 0.0
        self.weight = 0.0  # 1 - the product of the thetas so far: the debiasing divisor
        self.biased_sqr2 = 0.0  # the same average of each step's |G|^2 squared
        self.weight2 = 0.0  # the sum of the squared weights: the average's support
        self.steps = 0

    def observing(self, sample: NoiseSample) -> bool:
        """Fold one step in; whether it counted."""
        unbiased = sample.unbiased()
        if unbiased is None:
            return False
        sqr, variance = unbiased
        theta = self.smoothing ** (sample.batch / self.init_batch)
        self.biased_sqr = theta * self.biased_sqr + (1.0 - theta) * sqr
        self.biased_var = theta * self.biased_var + (1.0 - theta) * variance
        self.weight = theta * self.weight + (1.0 - theta)
        self.biased_sqr2 = theta * self.biased_sqr2 + (1.0 - theta) * sqr * sqr
        self.weight2 = theta * theta * self.weight2 + (1.0 - theta) ** 2
        self.steps += 1
        return True

    def estimate(self) -> NoiseEstimate | None:
        """The statistics now, each at least 0 (a smoothed estimate can dip below when the
        true value is near 0); None before the first measured step or when both are 0."""
        if self.steps == 0 or self.weight <= 0:
            return None
        sqr = max(self.biased_sqr / self.weight, 0.0)
        var = max(self.biased_var / self.weight, 0.0) / self.init_batch
        if not (math.isfinite(sqr) and math.isfinite(var)) or sqr + var <= 0:
            return None
        return NoiseEstimate(self.init_batch, sqr, var, self.steps, self.sqr_error())

    def sqr_error(self) -> float:
        """The standard error of the smoothed |G|^2: the weighted spread of the per-step
        estimates times the square root of the weights' sum of squares (1/n for n equal
        weights), over the debiasing divisor."""
        mean = self.biased_sqr / self.weight
        spread = max(self.biased_sqr2 / self.weight - mean * mean, 0.0)
        error = math.sqrt(spread * self.weight2) / self.weight
        return error if math.isfinite(error) else 0.0

    def shared_state(self) -> dict[str, Any]:
        return {
            "init_batch": self.init_batch,
            "biased_sqr": self.biased_sqr,
            "biased_var": self.biased_var,
            "weight": self.weight,
            "biased_sqr2": self.biased_sqr2,
            "weight2": self.weight2,
            "steps": self.steps,
        }

    def adopting(self, state: dict[str, Any]) -> None:
        self.init_batch = int(state["init_batch"])
        self.biased_sqr = float(state["biased_sqr"])
        self.biased_var = float(state["biased_var"])
        self.weight = float(state["weight"])
        self.biased_sqr2 = float(state.get("biased_sqr2", 0.0))
        self.weight2 = float(state.get("weight2", 0.0))
        self.steps = int(state["steps"])


def noise_message(noise: NoiseEstimate | None) -> pb.GradientNoise | None:
    """The estimate as the coordinator protocol carries it (`CommitRequest.noise`)."""
    if noise is None:
        return None
    return pb.GradientNoise(
        init_batch=noise.init_batch,
        grad_sqr=noise.grad_sqr,
        grad_var=noise.grad_var,
        steps=noise.steps,
    )
