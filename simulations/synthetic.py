"""A synthetic workload for scaling studies: Poisson arrivals, lognormal durations, a GPU
demand mix and a priority mix, all drawn from one seed.

The defaults echo the Philly trace's shape (most jobs use one GPU; median duration about
1,100 s; a long tail), but the generator makes no claim to reproduce any real cluster: use
the real traces for fidelity, this for "what if there were ten times as many jobs".
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from simulations.workload import SimJob, Workload

#: (GPUs, weight): roughly Philly's mix, where 93% of jobs use one GPU.
PHILLY_LIKE_MIX: tuple[tuple[int, float], ...] = (
    (1, 0.85),
    (2, 0.05),
    (4, 0.05),
    (8, 0.04),
    (16, 0.01),
)


@dataclass(frozen=True, slots=True)
class SyntheticSpec:
    jobs: int = 1000
    arrivals_per_hour: float = 60.0
    median_duration_s: float = 1144.0
    sigma: float = 1.8
    gpu_mix: tuple[tuple[int, float], ...] = PHILLY_LIKE_MIX
    #: (priority, weight); one level means no priorities.
    priority_mix: tuple[tuple[int, float], ...] = ((0, 1.0),)
    max_duration_s: float = 14 * 24 * 3600.0


def generate(spec: SyntheticSpec, seed: int) -> Workload:
    rng = random.Random(seed)
    gpus, gpu_weights = zip(*spec.gpu_mix, strict=True)
    prios, prio_weights = zip(*spec.priority_mix, strict=True)
    now = 0.0
    jobs = []
    mu = math.log(spec.median_duration_s)
    for i in range(spec.jobs):
        now += rng.expovariate(spec.arrivals_per_hour / 3600.0)
        duration = min(spec.max_duration_s, max(1.0, rng.lognormvariate(mu, spec.sigma)))
        g = rng.choices(gpus, gpu_weights)[0]
        prio = rng.choices(prios, prio_weights)[0]
        jobs.append(SimJob(f"syn-{i}", round(now, 3), g, round(duration, 3), g, g, priority=prio))
    return Workload(tuple(jobs), f"synthetic(jobs={spec.jobs}, seed={seed})")
