"""Pollux workloads: our ``tiresias-pollux`` beside the published Tiresias results of the
Pollux artifact, and ``edl`` (elastic, with and without batch-size adaptation) beside them.
One JSON line per (load, policy), then one per load with the means.

Setup as the Pollux simulator's: 16 nodes x 4 GPUs, planning every 60 s (not on events),
30 s charged at every start, restart and resize.

    python benchmarks/sim_pollux.py [--load 1.0] [--workload 6] [--policy tiresias-pollux]
"""

from __future__ import annotations

import json
from pathlib import Path

import click

from edl_scheduler.core import preset
from simulations.config import POLLUX_ROUNDS
from simulations.engine import simulate
from simulations.reporting import summarize
from simulations.traces import default_traces, load_cluster, load_pollux
from simulations.workload import Elasticity, ScalingRule, shape

#: (label, preset, elastic, adapt batch)
RUNS = {
    "tiresias-pollux": ("tiresias-pollux", False, False),
    "edl": ("edl", True, False),
    "edl+adapt": ("edl", True, True),
}


def _folder(load: str) -> str:
    return "workloads" if load == "1.0" else f"workloads-{load}"


@click.command()
@click.option("--traces", type=click.Path(path_type=Path), default=default_traces)
@click.option("--load", "loads", multiple=True, default=("1.0",))
@click.option("--workload", "numbers", multiple=True, type=int, default=tuple(range(1, 9)))
@click.option("--policy", "labels", multiple=True, default=tuple(RUNS))
def main(
    traces: Path, loads: tuple[str, ...], numbers: tuple[int, ...], labels: tuple[str, ...]
) -> None:
    cluster = load_cluster("16x4")
    pollux = traces / "pollux"
    for load in loads:
        published_path = pollux / "results-jobload" / f"tiresias-{load}" / "summary.json"
        published = json.loads(published_path.read_text())
        means: dict[str, list[float]] = {label: [] for label in labels}
        for n in numbers:
            path = pollux / _folder(load) / f"workload-{n}.csv"
            for label in labels:
                name, elastic, adapt = RUNS[label]
                workload = load_pollux(path, pollux / "traces", cluster, adapt_batch=adapt)
                jobs = shape(
                    workload.jobs,
                    elasticity=Elasticity.ELASTIC if elastic else Elasticity.RIGID,
                    scaling=ScalingRule(0.0, 0.0),
                    cluster=cluster,
                    seed=0,
                )
                result = simulate(jobs, cluster, preset(name), POLLUX_ROUNDS)
                s = summarize(result)
                means[label].append(s["avg_jct_s"])
                ref = published["avgs"].get(f"workload-{n}")
                line = {
                    "load": load,
                    "workload": n,
                    "policy": label,
                    "avg_jct_s": round(s["avg_jct_s"], 1),
                    "published_tiresias_avg_jct_s": ref,
                    "finished": s["finished"],
                    "utilization_allocated": round(s["utilization_allocated"], 3),
                    "wall_s": round(result.wall_s, 2),
                }
                click.echo(json.dumps(line))
        summary: dict[str, object] = {"load": load, "workloads": list(numbers)}
        for label, values in means.items():
            summary[f"{label}_mean_s"] = round(sum(values) / len(values), 1)
        refs = [published["avgs"][f"workload-{n}"] for n in numbers]
        summary["published_tiresias_mean_s"] = round(sum(refs) / len(refs), 1)
        click.echo(json.dumps(summary))


if __name__ == "__main__":
    main()
