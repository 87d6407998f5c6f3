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

A job that adapts its batch (its efficiency carries the bounds it adapts within) runs a
size at the batch it would choose there, which changes as training goes on: a size it
measured early, at a small batch whose synchronization dominated, may be worth much more
now at a larger one. For such a job the step time is made a function of the batch
(``BatchedSteps``: each micro-batch's compute ``fixed + per_sample * local``, one
synchronization per step as above), fitted to the samples' batches, and a size's goodput is
that of the batch the job's own rule would choose there (``edl_gradients.goodput.choosing``,
the rule the runtime decides by), as Pollux's scheduler predicts it.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Final

import numpy as np

from edl_gradients.goodput import BatchLimits, choosing, shaping
from edl_scheduler.core.snapshot import Efficiency, Job, ThroughputSample


@dataclass(frozen=True, slots=True)
class ThroughputModel:
    compute: float
    alpha_local: float
    beta_local: float
    alpha_net: float
    beta_net: float
    #: Where the job adapts its batch: its throughput is the goodput of the batch it would
    #: choose (the five fields above then hold the step at its initial batch).
    batched: BatchedSteps | None = None

    def step_time(self, nodes: int, workers: int) -> float:
        if workers <= 1:
            return self.compute
        if nodes <= 1:
            return self.compute + self.alpha_local + self.beta_local * (workers - 2)
        return self.compute + self.alpha_net + self.beta_net * (workers - 2)

    def throughput(self, nodes: int, workers: int) -> float:
        if workers <= 0:
            return 0.0
        if self.batched is not None:
            return self.batched.goodput(nodes, workers)
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
    alpha_local, beta_local, alpha_net, beta_net = (float(v) for v in theta[1:])
    return ThroughputModel(compute, alpha_local, beta_local, alpha_net, beta_net)


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
    what a batch is worth changes as training goes on, how fast it runs does not. Where the
    job adapts its batch and reported the batch of every sample, the goodput of the batch it
    would choose at each size (``BatchedSteps``)."""
    efficiency = job.efficiency
    if efficiency is None:
        return fit(job.throughput)
    limits = efficiency.limits()
    if limits is not None:
        steps = _step_fit(job.throughput, limits)
        if steps is not None:
            return _batched_model(steps, limits, efficiency)
    return _goodput_fit(job.throughput, efficiency)


class BatchedSteps:
    """Seconds per optimizer step of a job that adapts its batch, at ``nodes`` nodes,
    ``workers`` GPUs, ``local`` samples per GPU per micro-batch and ``accumulation``
    micro-batches: ``accumulation * (fixed + per_sample * local)`` plus one synchronization
    (``ThroughputModel``'s terms, none alone); and the goodput at each size of the batch the
    job would choose there (memoized: the object serves one job's samples and efficiency)."""

    __slots__ = ("_memo", "efficiency", "limits", "params", "sync")

    def __init__(
        self,
        params: tuple[float, float, float, float, float, float],
        limits: BatchLimits,
        efficiency: Efficiency,
    ) -> None:
        #: fixed, per_sample, alpha_local, beta_local, alpha_net, beta_net (seconds).
        self.params = params
        #: The synchronization terms as a model with no compute: its step is the sync alone.
        self.sync = ThroughputModel(0.0, *params[2:])
        self.limits = limits
        self.efficiency = efficiency
        self._memo: dict[tuple[int, int], float] = {}

    def step_time(self, nodes: int, workers: int, local: float, accumulation: int) -> float:
        fixed, per_sample = self.params[0], self.params[1]
        return accumulation * (fixed + per_sample * local) + self.sync.step_time(nodes, workers)

    def goodput(self, nodes: int, workers: int) -> float:
        """Samples per second at the initial batch's efficiency, at the best batch."""
        key = (nodes, workers)
        found = self._memo.get(key)
        if found is None:

            def seconds(local: int, accumulation: int) -> float:
                return self.step_time(nodes, workers, local, accumulation)

            found = choosing(self.limits, workers, seconds, self.efficiency.gain).goodput
            self._memo[key] = found
        return found


#: ``BatchedSteps``' prior, relative to one micro-batch at the reference sample's per-GPU
#: batch: half of compute fixed and half per sample (the runtime's prior,
#: ``edl_gradients.goodput.PRIOR``), synchronization as ``_PRIOR``'s.
_BATCHED_PRIOR = (0.5, 0.5, 0.05, 0.005, 0.15, 0.01)
_BATCHED_RIDGE_EYE: Final = _RIDGE * np.eye(len(_BATCHED_PRIOR))
_BATCHED_RIDGE_PRIOR: Final = _RIDGE * np.array(_BATCHED_PRIOR)


@lru_cache(maxsize=65536)
def _step_fit(
    samples: tuple[ThroughputSample, ...], limits: BatchLimits
) -> tuple[float, float, float, float, float, float] | None:
    """``BatchedSteps``' parameters that best explain ``samples`` (ridge least squares
    toward the prior, as ``fit``); None where a measured sample lacks its batch (the step
    time cannot be told apart from the batch then) or none was measured. A sample's
    accumulation is the one the job's rule shapes its per-GPU batch into
    (``edl_gradients.goodput.shaping``: the fewest micro-batches within ``max_local``)."""
    usable = [s for s in samples if s.samples_per_second > 0 and s.workers >= 1]
    if not usable or any(s.batch <= 0 for s in usable):
        return None
    rows, seconds = [], []
    for s in usable:
        per_gpu = s.batch / s.workers
        accumulation = shaping(per_gpu, limits)[1]
        multi = s.workers > 1
        local = 1.0 if multi and s.nodes <= 1 else 0.0
        net = 1.0 if multi and s.nodes > 1 else 0.0
        extra = float(s.workers - 2)
        rows.append((float(accumulation), per_gpu, local, local * extra, net, net * extra))
        seconds.append(s.batch / s.samples_per_second)
    # The unit: a micro-batch of the fastest single-worker sample (of any, with none alone).
    singles = [i for i, s in enumerate(usable) if s.workers == 1] or list(range(len(usable)))
    ref = min(singles, key=lambda i: seconds[i] / rows[i][0])
    unit_time, unit_size = seconds[ref] / rows[ref][0], rows[ref][1] / rows[ref][0]
    x = np.array(rows) / np.array([1.0, unit_size, 1.0, 1.0, 1.0, 1.0])
    y = np.array(seconds) / unit_time
    theta = np.linalg.solve(x.T @ x + _BATCHED_RIDGE_EYE, x.T @ y + _BATCHED_RIDGE_PRIOR)
    theta = np.clip(theta, 0.0, None)
    fixed, per_sample = float(theta[0]) * unit_time, float(theta[1]) * unit_time / unit_size
    if fixed + per_sample <= 0:
        return None
    sync = (float(v) * unit_time for v in theta[2:])
    alpha_local, beta_local, alpha_net, beta_net = sync
    return (fixed, per_sample, alpha_local, beta_local, alpha_net, beta_net)


@lru_cache(maxsize=65536)
def _batched_model(
    params: tuple[float, float, float, float, float, float],
    limits: BatchLimits,
    efficiency: Efficiency,
) -> ThroughputModel:
    steps = BatchedSteps(params, limits, efficiency)
    # (the initial batch on one GPU, in as few micro-batches as fit)
    local, accumulation = shaping(limits.init_batch, limits)
    compute = steps.step_time(1, 1, local, accumulation)
    alpha_local, beta_local, alpha_net, beta_net = params[2:]
    return ThroughputModel(compute, alpha_local, beta_local, alpha_net, beta_net, steps)
