"""A scenario: one workload, one cluster, one engine config, and several policies run on it.

Policy arguments are preset names, optionally with ``@rigid`` or ``@elastic`` to override the
scenario's elasticity for that run (``edl@rigid``). Rigid presets run every job at its
requested size whatever its bounds, so ``--policy edl --policy tiresias`` compares elastic
EDL with rigid Tiresias on the same jobs. Runs are independent and may go to separate
processes; each is deterministic, so the result does not depend on how they were spread.
"""

from __future__ import annotations

import copyreg
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from edl_scheduler.core import Policy, preset
from simulations.config import ENGINE_DEFAULTS, POLLUX_ROUNDS
from simulations.engine import SimConfig, SimResult, simulate
from simulations.runs import JobRecord
from simulations.synthetic import SyntheticSpec, generate
from simulations.traces import TraceError, load_philly, load_pollux, load_tiresias
from simulations.workload import (
    ClusterSpec,
    Elasticity,
    Scaling,
    ScalingRule,
    SimJob,
    Workload,
    shape,
    with_elasticity,
)

FORMATS = ("philly", "tiresias", "pollux", "synthetic")


@dataclass(frozen=True, slots=True)
class PolicyRun:
    """One ``--policy`` argument: the label it was given, the preset, its elasticity."""

    label: str
    policy: Policy
    elasticity: Elasticity | None


def parse_policy(arg: str) -> PolicyRun:
    name, at, suffix = arg.partition("@")
    elasticity = None
    if at:
        try:
            elasticity = Elasticity(suffix)
        except ValueError:
            raise ValueError(f"policy {arg!r}: the suffix must be @rigid or @elastic") from None
    return PolicyRun(arg, preset(name), elasticity)


def defaults_for(fmt: str) -> tuple[Elasticity, SimConfig]:
    """The setup a format is documented with, what a run gets unless told otherwise.

    A Pollux workload comes with its jobs' elastic bounds (``traces.load_pollux``: from 1
    to what its application's batch allows) and was measured in the Pollux simulator's
    rounds, so it runs elastic (a rigid preset still runs each job at its size) in those
    rounds. A Philly, Tiresias or synthetic trace says nothing of elasticity: its jobs run
    rigid unless the user assumes otherwise (``--elasticity``, ``@elastic``), in the
    engine's own timing."""
    if fmt == "pollux":
        return Elasticity.ELASTIC, POLLUX_ROUNDS
    return Elasticity.RIGID, ENGINE_DEFAULTS


def setup_of(run: PolicyRun, elasticity: Elasticity, config: SimConfig) -> dict[str, str]:
    """What a row of a report ran with: its jobs' elasticity (a rigid preset runs every job
    at its requested size whatever its bounds), when it planned, and what changes cost."""
    chosen = run.elasticity if run.elasticity is not None else elasticity
    ran = chosen if run.policy.elastic else Elasticity.RIGID
    timing, costs = config.describe()
    return {"elasticity": ran.value, "planning": timing, "pauses": costs}


def load_workload(
    fmt: str,
    trace: str,
    cluster: ClusterSpec,
    *,
    seed: int,
    skip_bad_rows: bool = False,
    limit: int | None = None,
    profiles: Path | None = None,
    adapt_batch: bool = False,
) -> Workload:
    """The jobs of ``trace`` in format ``fmt`` (for ``synthetic``, ``trace`` is a job count;
    for ``pollux``, ``profiles`` defaults to ``traces/`` beside the workload folder)."""
    if fmt == "pollux":
        path = Path(trace)
        root = profiles if profiles is not None else path.parent.parent / "traces"
        workload = load_pollux(
            path, root, cluster, adapt_batch=adapt_batch, skip_bad_rows=skip_bad_rows
        )
        return replace(workload, jobs=workload.jobs[:limit]) if limit else workload
    if fmt == "philly":
        return load_philly(Path(trace), cluster, skip_bad_rows=skip_bad_rows, limit=limit)
    if fmt == "tiresias":
        workload = load_tiresias(Path(trace), cluster, skip_bad_rows=skip_bad_rows)
    elif fmt == "synthetic":
        if not trace.isdigit():
            raise TraceError(f"synthetic trace {trace!r}: give the number of jobs")
        workload = generate(SyntheticSpec(jobs=int(trace)), seed)
        too_big = [j for j in workload.jobs if j.requested > cluster.gpus]
        if too_big:
            raise TraceError(f"synthetic: {too_big[0].name} needs more GPUs than the cluster")
    else:
        raise TraceError(f"unknown format {fmt!r}: use one of {', '.join(FORMATS)}")
    if limit is not None:
        workload = replace(workload, jobs=workload.jobs[:limit])
    return workload


def _one(
    jobs: Sequence[SimJob], cluster: ClusterSpec, run: PolicyRun, config: SimConfig
) -> SimResult:
    if run.elasticity is not None:
        jobs = with_elasticity(jobs, run.elasticity, cluster.gpus)
    return simulate(jobs, cluster, run.policy, config, label=run.label)


#: The frozen dataclasses that go to and come back from the pool's processes.
_SENT = (Policy, SimJob, Scaling, ScalingRule, ClusterSpec, SimConfig, SimResult, JobRecord)


def _by_fields(obj: Any) -> tuple[type, tuple[Any, ...]]:
    return type(obj), tuple(getattr(obj, f.name) for f in fields(obj))


def _picklable() -> None:
    """Pickles ``_SENT`` by their constructor. Where the planner and the simulator run
    compiled (``simulations/native.py``), mypyc's own pickling restores a frozen
    dataclass's fields by assignment, which the class refuses; the constructor takes them
    whole, compiled or not. Called in the parent and in each pool process (results)."""
    for cls in _SENT:
        copyreg.pickle(cls, _by_fields)


def run_policies(
    jobs: Sequence[SimJob],
    cluster: ClusterSpec,
    runs: Sequence[PolicyRun],
    config: SimConfig,
    *,
    processes: int = 1,
    done: Callable[[str], None] | None = None,
) -> dict[str, SimResult]:
    """Every policy on the same jobs; results keyed by label, in the order given."""
    results: dict[str, SimResult] = {}
    if processes <= 1 or len(runs) <= 1:
        for run in runs:
            results[run.label] = _one(jobs, cluster, run, config)
            if done is not None:
                done(run.label)
        return results
    _picklable()
    with ProcessPoolExecutor(max_workers=min(processes, len(runs)), initializer=_picklable) as pool:
        futures = {run.label: pool.submit(_one, jobs, cluster, run, config) for run in runs}
        for run in runs:
            results[run.label] = futures[run.label].result()
            if done is not None:
                done(run.label)
    return results


def prepare(
    workload: Workload,
    cluster: ClusterSpec,
    *,
    elasticity: Elasticity,
    scaling: str,
    seed: int,
    priority_levels: int = 1,
) -> tuple[SimJob, ...]:
    return shape(
        workload.jobs,
        elasticity=elasticity,
        scaling=ScalingRule.parse(scaling),
        cluster=cluster,
        seed=seed,
        priority_levels=priority_levels,
    )
