"""Simulator speed: one JSON line.

``philly_full_s``: wall time of the full Philly trace (82,247 jobs) under ``edl`` with
elastic jobs on 64 nodes x 8 GPUs (goal <= 60 s). ``philly_3d_s``: ``philly_3d`` on
32 x 4 under ``tiresias``, event-driven with no pauses as in the fidelity check, with
``SimConfig.hide`` on (the Tiresias simulator takes 124-140 s on it here; goal >= 50x
faster), with its average JCT (the Tiresias simulator's is 13,431.9 s); the full trace's
line carries its average JCT too, so a speed change that changes results shows.
``--limit`` replays only the first jobs of the full trace (the key then says how many);
``plan_share`` is the fraction of wall time spent inside ``plan()``; ``*_cpu_s`` is the CPU
time of the process over the same run (on a shared machine the fairer number: wall time
grows with the others' load).

    python benchmarks/sim_speed.py [--traces ../shared/traces] [--limit N] [--skip-full|--skip-3d]
        [--progress] [--compile]

``build`` says whether the planner and the simulator ran compiled (``native``: the mypyc
build of these sources, ``edl-sim compile`` or ``--compile`` makes it) or as Python (why);
``EDL_PURE=1`` runs Python where a build exists, for a pair.

``--progress`` prints to stderr, every 1,000 finished jobs of the full trace, a JSON line
with the CPU time so far and over the last 1,000 jobs (a run too long to finish still says
how far it got and whether the cost per job grows).
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

import click

# The simulator first: importing it takes the compiled build, before any planner module loads.
from simulations import native  # isort: skip

from edl_scheduler.core import preset
from simulations.engine import SimConfig, simulate
from simulations.fidelity import EVENT_DRIVEN
from simulations.reporting import summarize
from simulations.traces import default_traces, load_cluster, load_philly, load_tiresias
from simulations.workload import Elasticity, ScalingRule, shape


class _Progress:
    """Called by the engine after every event: a line per 1,000 finished jobs."""

    def __init__(self) -> None:
        self.began = self.last = time.process_time()
        self.next = 1000

    def __call__(self, done: int, total: int) -> None:
        if done < self.next:
            return
        now = time.process_time()
        line = {
            "done": done,
            "of": total,
            "cpu_s": round(now - self.began, 1),
            "cpu_last_1000_s": round(now - self.last, 2),
        }
        click.echo(json.dumps(line), err=True)
        self.next, self.last = self.next + 1000, now


@click.command()
@click.option("--traces", type=click.Path(path_type=Path), default=default_traces)
@click.option("--limit", type=int, default=None, help="Only the first N Philly jobs.")
@click.option("--skip-full", is_flag=True, help="Only philly_3d.")
@click.option("--skip-3d", is_flag=True, help="Only the full trace.")
@click.option("--progress", is_flag=True, help="CPU time per 1,000 finished jobs, to stderr.")
@click.option("--compile", "build", is_flag=True, help="Build the compiled modules first.")
def main(
    traces: Path, limit: int | None, skip_full: bool, skip_3d: bool, progress: bool, build: bool
) -> None:
    if build and native.mode() is not native.Mode.NATIVE:
        # Built, then run in a fresh process: this one has loaded the Python modules.
        native.build()
        os.execv(sys.executable, [sys.executable, *[a for a in sys.argv if a != "--compile"]])
    line: dict[str, object] = {"cluster": "64x8", "build": native.mode().value}
    if not skip_full:
        cluster = load_cluster("64x8")
        workload = load_philly(traces / "pollux" / "traces" / "philly.csv", cluster, limit=limit)
        jobs = shape(
            workload.jobs,
            elasticity=Elasticity.ELASTIC,
            scaling=ScalingRule.parse("amdahl:0.1"),
            cluster=cluster,
            seed=0,
        )
        began = time.process_time()
        result = simulate(
            jobs, cluster, preset("edl"), SimConfig(), progress=_Progress() if progress else None
        )
        line["philly_full_jobs"] = len(jobs)
        line["philly_full_s"] = round(result.wall_s, 2)
        line["philly_full_cpu_s"] = round(time.process_time() - began, 2)
        line["philly_full_plans"] = result.plans
        # What the run computed (finished jobs only), so that a change of results shows here.
        line["philly_full_avg_jct_s"] = round(summarize(result)["avg_jct_s"], 2)
        line["philly_full_plan_share"] = round(result.plan_wall_s / result.wall_s, 3)
    if skip_3d:
        click.echo(json.dumps(line))
        return
    cluster = load_cluster("32x4")
    workload = load_tiresias(traces / "philly-derived" / "philly_3d.csv", cluster)
    began = time.process_time()
    # With the running jobs no plan could change left out of each snapshot (``hide``: the
    # same results, see simulations/leaving_out.py).
    result = simulate(workload.jobs, cluster, preset("tiresias"), replace(EVENT_DRIVEN, hide=True))
    line["philly_3d_s"] = round(result.wall_s, 2)
    line["philly_3d_cpu_s"] = round(time.process_time() - began, 2)
    # What the run computed, so that a speed change that changes results shows here.
    line["philly_3d_avg_jct_s"] = round(summarize(result)["avg_jct_s"], 2)
    line["philly_3d_plans"] = result.plans
    line["philly_3d_plan_share"] = round(result.plan_wall_s / result.wall_s, 3)
    line["philly_3d_speedup_vs_tiresias_sim"] = round(140.0 / result.wall_s, 2)
    click.echo(json.dumps(line))


if __name__ == "__main__":
    main()
