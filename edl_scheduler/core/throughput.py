"""A small throughput model per job, fitted to what its runtime measured.

Step time is compute plus synchronization, as in Pollux: with ``w`` workers on ``n`` nodes
and a fixed local batch,

    step(n, w) = compute + sync(n, w),   sync = 0 for w == 1,
    sync = alpha_local + beta_local * (w - 2)   on one node,
    sync = alpha_net + beta_net * (w - 2)       across nodes,

and throughput is ``w / step(n, w)`` (in local batches per second, so the unknown batch size
cancels out of every speed-up). The five parameters are fitted by ridge-regularized least
squares toward a prior, so one or two measurements give a usable model and sizes never
tried are predicted from those that were; the prior alone serves jobs that measured nothing.
Fits are cached by their (hashable, frozen) input, which keeps the planner pure and fast.

Where a job reports its statistical efficiency (``snapshot.Efficiency``, Pollux's gradient
noise model) and the batch of each sample, the planner fits goodput instead of throughput
(``job_model``): each sample's samples per second, per batch, times the gain of that batch
at the job's efficiency now. Growth, rebalancing and the pause rule all read ``job_model``.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Final

import numpy as np

from edl_scheduler.core.snapshot import Efficiency, Job, ThroughputSample


@dataclass(frozen=True, slots=True)
class ThroughputModel:
    compute: float
    alpha_local: float
    beta_local: float
    alpha_net: float
    beta_net: float

    def step_time(self, nodes: int, workers: int) -> float:
        if workers <= 1:
            return self.compute
        if nodes <= 1:
            return self.compute + self.alpha_local + self.beta_local * (workers - 2)
        return self.compute + self.alpha_net + self.beta_net * (workers - 2)

    def throughput(self, nodes: int, workers: int) -> float:
        if workers <= 0:
            return 0.0
        return workers / self.step_time(nodes, workers)

    def speedup(self, nodes: int, workers: int) -> float:
        """Throughput relative to one worker on one node."""
        return self.throughput(nodes, workers) / self.throughput(1, 1)


#: Parameters relative to compute time: synchronization is cheap on one node and a little
#: dearer across nodes, so extra workers help with diminishing returns.
_PRIOR = (1.0, 0.05, 0.005, 0.15, 0.01)
PRIOR_MODEL: Final = ThroughputModel(*_PRIOR)
_RIDGE: Final = 0.05
#: The fit's constant terms, made once (the same values it would make at each fit).
_RIDGE_EYE: Final = _RIDGE * np.eye(len(_PRIOR))
_RIDGE_PRIOR: Final = _RIDGE * np.array(_PRIOR)


def _features(sample: ThroughputSample) -> tuple[float, float, float, float, float]:
    multi = sample.workers > 1
    local = 1.0 if multi and sample.nodes <= 1 else 0.0
    net = 1.0 if multi and sample.nodes > 1 else 0.0
    extra = float(sample.workers - 2)
    return (1.0, local, local * extra, net, net * extra)


@lru_cache(maxsize=65536)
def fit(samples: tuple[ThroughputSample, ...]) -> ThroughputModel:
    """The model that best explains ``samples`` (the prior when there are none)."""
    usable = [s for s in samples if s.samples_per_second > 0 and s.workers >= 1]
    if not usable:
        return PRIOR_MODEL
    y = np.array([s.workers / s.samples_per_second for s in usable])
    singles = [v for s, v in zip(usable, y, strict=True) if s.workers == 1]
    scale = float(min(singles)) if singles else float(y.min())
    x = np.array([_features(s) for s in usable])
    lhs = x.T @ x + _RIDGE_EYE
    rhs = x.T @ (y / scale) + _RIDGE_PRIOR
    theta = np.clip(np.linalg.solve(lhs, rhs), 0.0, None) * scale
    compute = max(float(theta[0]), 1e-9 * scale)
    return ThroughputModel(compute, *(float(v) for v in theta[1:]))


def goodput(sample: ThroughputSample, efficiency: Efficiency | None) -> ThroughputSample:
    """``sample`` with its throughput weighed by the job's statistical efficiency now, per
    step of the initial batch: (samples / s) / batch x gain(batch). Unchanged without an
    efficiency or a reported batch. The unit cancels out of every speed-up."""
    if efficiency is None or sample.batch <= 0:
        return sample
    rate = sample.samples_per_second / sample.batch * efficiency.gain(sample.batch)
    return ThroughputSample(sample.nodes, sample.workers, rate, sample.batch)


@lru_cache(maxsize=65536)
def _goodput_fit(samples: tuple[ThroughputSample, ...], efficiency: Efficiency) -> ThroughputModel:
    return fit(tuple(goodput(s, efficiency) for s in samples))


def job_model(job: Job) -> ThroughputModel:
    """The model the planner decides ``job`` by: fitted to its goodput (its measured
    throughput weighed by its efficiency now) where the job reports an efficiency, else to
    its throughput. Samples measured at another epoch thereby count at today's efficiency:
    what a batch is worth changes as training goes on, how fast it runs does not."""
    if job.efficiency is None:
        return fit(job.throughput)
    return _goodput_fit(job.throughput, job.efficiency)
