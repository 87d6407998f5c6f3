"""The runs that ``test_native.py`` makes twice, in Python and compiled, as JSON.

``EDL_PURE=0 python -m tests.simulations.native_runs`` prints one JSON object: which build ran
(``simulations.native.mode()`` and where the planner was loaded from) and every run's job
records, timeline and plan count. Floats go through ``json`` (``repr``, exact both ways),
so equal output is equal results. (Without ``EDL_PURE=0`` it runs Python: importing
``tests`` sets ``EDL_PURE=1``.)

The runs cover what the benchmarks take and what they do not: every preset and the
least-attained variants (queue demotions, a starvation limit) on ``60_job.csv``, ticks and
event-driven, with running jobs hidden and not; a Philly prefix with elastic ``edl`` under
contention; a synthetic workload with priorities (preemption, shrinking); and a prefix of
``philly_3d`` under ``tiresias`` as ``benchmarks/sim_speed.py`` runs it.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

# The simulator first: importing it takes the build, before any planner module loads.
from simulations import native  # isort: skip

from edl_scheduler.core import planning, preset
from simulations.config import EVENT_DRIVEN
from simulations.engine import SimResult, simulate
from simulations.scenario import parse_policy, run_policies
from simulations.synthetic import SyntheticSpec, generate
from simulations.traces import default_traces, load_cluster, load_philly, load_tiresias
from simulations.workload import ClusterSpec, Elasticity, ScalingRule, shape
from tests.simulations.test_rebalance_skip import PHILLY
from tests.simulations.test_settled import CLUSTER, CONFIGS, POLICIES, _jobs

PHILLY_3D = default_traces() / "philly-derived" / "philly_3d.csv"
_FIELDS = ("name", "first_start", "end", "resizes", "preemptions", "gpu_seconds")


def _as_json(result: SimResult) -> dict[str, Any]:
    return {
        "jobs": [[getattr(r, f) for f in _FIELDS] for r in result.jobs],
        "timeline": [list(t) for t in result.timeline],
        "plans": result.plans,
    }


def _elastic(jobs: Any, cluster: ClusterSpec, seed: int) -> Any:
    scaling = ScalingRule.parse("amdahl:0.1")
    return shape(jobs, elasticity=Elasticity.ELASTIC, scaling=scaling, cluster=cluster, seed=seed)


def runs() -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, policy in sorted(POLICIES.items()):
        for config_name, config in sorted(CONFIGS.items()):
            for hide in (False, True):
                cfg = replace(config, hide=hide)
                out[f"60_job/{name}/{config_name}/hide={hide}"] = _as_json(
                    simulate(_jobs(policy), CLUSTER, policy, cfg)
                )
    cluster = load_cluster("16x8")
    jobs = _elastic(load_philly(PHILLY, cluster, limit=300).jobs, cluster, 0)
    out["philly-300/edl"] = _as_json(simulate(jobs, cluster, preset("edl"), EVENT_DRIVEN))
    cluster = ClusterSpec(4, 8)
    spec = SyntheticSpec(jobs=160, arrivals_per_hour=40.0, priority_mix=((0, 0.7), (1, 0.3)))
    jobs = _elastic(generate(spec, seed=3).jobs, cluster, 3)
    for name in ("edl", "edl-fulfillment"):
        out[f"synthetic/{name}"] = _as_json(simulate(jobs, cluster, preset(name), EVENT_DRIVEN))
    # Through a pool of processes, as `edl-sim run -j 2` runs policies (jobs, policies and
    # results pickled both ways).
    pool = [parse_policy(p) for p in ("edl", "tiresias@rigid")]
    for label, result in run_policies(jobs[:60], cluster, pool, EVENT_DRIVEN, processes=2).items():
        out[f"pool/{label}"] = _as_json(result)
    cluster = load_cluster("32x4")
    jobs = load_tiresias(PHILLY_3D, cluster).jobs[:400]
    config = replace(EVENT_DRIVEN, hide=True)
    out["philly_3d-400/tiresias"] = _as_json(simulate(jobs, cluster, preset("tiresias"), config))
    return out


def main() -> None:
    built = {"mode": native.mode().name, "planning": str(Path(planning.__file__).name)}
    print(json.dumps({"build": built, "runs": runs()}))


if __name__ == "__main__":
    main()
