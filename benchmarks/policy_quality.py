"""Policy quality: EDL's policies beside the baselines, on the Pollux workloads and on
``philly_3d``. One JSON line per run, then one per (workload set, policy) with the means;
with ``--doc`` the Markdown tables are written to that file.

Pollux workloads 1-8 (160 jobs each) at each ``--load``, on 16 nodes x 4 GPUs with the
Pollux simulator's rounds (``simulations.config.POLLUX_ROUNDS``): ``edl`` and
``edl-fulfillment`` with elastic jobs (min 1, max min(64, max batch / min local batch), ncf
1), ``edl+adapt`` the same with batch-size adaptation, ``tiresias`` (the Tiresias paper's
thresholds), ``tiresias-pollux`` (the Pollux simulator's Tiresias) and ``fifo-gang``, rigid
at the workload's sizes. Beside them, the published means of the Pollux artifact
(``results-jobload/<policy>-<load>/summary.json``: Pollux, Tiresias, Optimus+Oracle).

``philly_3d`` (5,851 jobs) on 32 x 4 GPUs, default engine settings (60 s ticks, plans on
events, 10 s per resize, 30 s per restart), ``amdahl:0.1`` scaling: every policy on rigid
jobs, and the elastic ones also on elastic jobs (min ceil(n/2), max 2n).

    python benchmarks/policy_quality.py [--load 1.0 --load 2.0] [--workload 6]
        [--skip-philly] [--skip-pollux] [-j 2] [--doc docs/policy-quality.md]
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from edl_scheduler.core import preset
from simulations.config import POLLUX_ROUNDS
from simulations.engine import SimConfig, simulate
from simulations.reporting import summarize
from simulations.traces import default_traces, load_cluster, load_pollux, load_tiresias
from simulations.workload import Elasticity, ScalingRule, shape

#: label -> (preset, elastic jobs, batch adaptation)
POLLUX_RUNS = {
    "edl": ("edl", True, False),
    "edl+adapt": ("edl", True, True),
    "edl-fulfillment": ("edl-fulfillment", True, False),
    "tiresias": ("tiresias", False, False),
    "tiresias-pollux": ("tiresias-pollux", False, False),
    "fifo-gang": ("fifo-gang", False, False),
}
PHILLY_RUNS = {
    "edl@elastic": ("edl", True),
    "edl@rigid": ("edl", False),
    "edl-fulfillment@elastic": ("edl-fulfillment", True),
    "edl-fulfillment@rigid": ("edl-fulfillment", False),
    "tiresias": ("tiresias", False),
    "fifo-gang": ("fifo-gang", False),
}
PUBLISHED = ("pollux", "tiresias", "optimus")
_PUBLISHED_NAMES = {"pollux": "Pollux", "tiresias": "Tiresias", "optimus": "Optimus+Oracle"}


@dataclass(frozen=True, slots=True)
class Task:
    """One simulation: a workload set (``pollux-1.0`` or ``philly_3d``), a workload, a run."""

    group: str
    workload: str
    label: str


def _folder(load: str) -> str:
    return "workloads" if load == "1.0" else f"workloads-{load}"


def _line(task: Task, result_summary: dict[str, Any], wall_s: float) -> dict[str, Any]:
    return {
        "set": task.group,
        "workload": task.workload,
        "policy": task.label,
        "avg_jct_s": round(result_summary["avg_jct_s"], 1),
        "p99_jct_s": round(result_summary["p99_jct_s"], 1),
        "utilization_allocated": round(result_summary["utilization_allocated"], 4),
        "utilization_useful": round(result_summary["utilization_useful"], 4),
        "finished": result_summary["finished"],
        "jobs": result_summary["jobs"],
        "wall_s": round(wall_s, 2),
    }


def run_task(task: Task, traces: str) -> dict[str, Any]:
    """Run one simulation; a plain function of picklable arguments, for the process pool."""
    root = Path(traces)
    if task.group == "philly_3d":
        cluster = load_cluster(str(root / "tiresias" / "n32g4.csv"))
        workload = load_tiresias(root / "philly-derived" / "philly_3d.csv", cluster)
        name, elastic = PHILLY_RUNS[task.label]
        jobs = shape(
            workload.jobs,
            elasticity=Elasticity.ELASTIC if elastic else Elasticity.RIGID,
            scaling=ScalingRule.parse("amdahl:0.1"),
            cluster=cluster,
            seed=0,
        )
        result = simulate(jobs, cluster, preset(name), SimConfig(), label=task.label)
    else:
        load = task.group.removeprefix("pollux-")
        cluster = load_cluster("16x4")
        pollux = root / "pollux"
        name, elastic, adapt = POLLUX_RUNS[task.label]
        path = pollux / _folder(load) / f"{task.workload}.csv"
        workload = load_pollux(path, pollux / "traces", cluster, adapt_batch=adapt)
        jobs = shape(
            workload.jobs,
            elasticity=Elasticity.ELASTIC if elastic else Elasticity.RIGID,
            scaling=ScalingRule(0.0, 0.0),
            cluster=cluster,
            seed=0,
        )
        result = simulate(jobs, cluster, preset(name), POLLUX_ROUNDS, label=task.label)
    return _line(task, summarize(result), result.wall_s)


def _mean(values: Iterable[float]) -> float:
    vals = list(values)
    return sum(vals) / len(vals) if vals else math.nan


def published(traces: Path, load: str, workloads: list[str]) -> dict[str, float]:
    """Published mean of per-workload average JCTs, per policy, over ``workloads``."""
    out = {}
    for policy in PUBLISHED:
        path = traces / "pollux" / "results-jobload" / f"{policy}-{load}" / "summary.json"
        avgs = json.loads(path.read_text())["avgs"]
        out[policy] = _mean(avgs[w] for w in workloads)
    return out


def means(lines: list[dict[str, Any]], group: str, label: str) -> dict[str, float]:
    rows = [r for r in lines if r["set"] == group and r["policy"] == label]
    return {
        key: _mean(r[key] for r in rows)
        for key in ("avg_jct_s", "p99_jct_s", "utilization_allocated", "utilization_useful")
    }


def _h(seconds: float) -> str:
    return f"{seconds / 3600:.2f} h"


def pollux_table(
    lines: list[dict[str, Any]], group: str, labels: list[str], refs: dict[str, float]
) -> str:
    workloads = sorted({r["workload"] for r in lines if r["set"] == group})
    head = "| policy | " + " | ".join(w.removeprefix("workload-") for w in workloads)
    out = [
        head + " | mean avg JCT | mean p99 JCT | util. allocated | util. useful |",
        "|---|" + "---:|" * (len(workloads) + 4),
    ]
    for label in labels:
        by = {r["workload"]: r for r in lines if r["set"] == group and r["policy"] == label}
        m = means(lines, group, label)
        cells = " | ".join(f"{by[w]['avg_jct_s']:,.0f}" if w in by else "" for w in workloads)
        out.append(
            f"| `{label}` | {cells} | {m['avg_jct_s']:,.0f} s ({_h(m['avg_jct_s'])}) "
            f"| {m['p99_jct_s']:,.0f} s | {m['utilization_allocated']:.1%} "
            f"| {m['utilization_useful']:.1%} |"
        )
    for policy, value in refs.items():
        pad = " | " * len(workloads)
        out.append(
            f"| {_PUBLISHED_NAMES[policy]}, published |{pad}{value:,.0f} s ({_h(value)}) | | | |"
        )
    return "\n".join(out) + "\n"


def philly_table(lines: list[dict[str, Any]], labels: list[str]) -> str:
    out = [
        "| policy | avg JCT (s) | p99 JCT (s) | util. allocated | util. useful | finished "
        "| wall (s) |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for label in labels:
        for r in lines:
            if r["set"] == "philly_3d" and r["policy"] == label:
                out.append(
                    f"| `{label}` | {r['avg_jct_s']:,.0f} | {r['p99_jct_s']:,.0f} "
                    f"| {r['utilization_allocated']:.1%} | {r['utilization_useful']:.1%} "
                    f"| {r['finished']}/{r['jobs']} | {r['wall_s']:.0f} |"
                )
    return "\n".join(out) + "\n"


@click.command()
@click.option("--traces", type=click.Path(path_type=Path), default=default_traces)
@click.option("--load", "loads", multiple=True, default=("1.0", "2.0"))
@click.option("--workload", "numbers", multiple=True, type=int, default=tuple(range(1, 9)))
@click.option("--policy", "labels", multiple=True, default=tuple(POLLUX_RUNS))
@click.option("--philly-policy", "philly_labels", multiple=True, default=tuple(PHILLY_RUNS))
@click.option("--skip-pollux", is_flag=True)
@click.option("--skip-philly", is_flag=True)
@click.option("--processes", "-j", default=2, show_default=True)
@click.option("--doc", type=click.Path(dir_okay=False, path_type=Path), default=None)
@click.option(
    "--from-lines",
    "saved",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    multiple=True,
    help="Render the tables from JSON lines an earlier run printed, instead of running.",
)
def main(
    traces: Path,
    loads: tuple[str, ...],
    numbers: tuple[int, ...],
    labels: tuple[str, ...],
    philly_labels: tuple[str, ...],
    skip_pollux: bool,
    skip_philly: bool,
    processes: int,
    doc: Path | None,
    saved: tuple[Path, ...],
) -> None:
    tasks: list[Task] = []
    if not skip_philly:  # longest first, so the pool stays busy
        tasks += [Task("philly_3d", "philly_3d", label) for label in philly_labels]
    if not skip_pollux:
        for load in loads:
            for n in numbers:
                tasks += [Task(f"pollux-{load}", f"workload-{n}", label) for label in labels]
    lines: list[dict[str, Any]] = []
    for path in saved:
        runs = [json.loads(t) for t in path.read_text().splitlines() if '"policy"' in t]
        lines += [r for r in runs if Task(r["set"], r["workload"], r["policy"]) in tasks]
    if saved:
        tasks = []
    with ProcessPoolExecutor(max_workers=max(1, processes)) as pool:
        futures = [pool.submit(run_task, task, str(traces)) for task in tasks]
        for future in futures:
            line = future.result()
            lines.append(line)
            click.echo(json.dumps(line), nl=True)
    sections = []
    workloads = [f"workload-{n}" for n in numbers]
    for load in [] if skip_pollux else loads:
        group = f"pollux-{load}"
        refs = published(traces, load, workloads)
        summary: dict[str, Any] = {"set": group, "workloads": list(numbers)}
        for label in labels:
            summary[f"{label}_mean_avg_jct_s"] = round(means(lines, group, label)["avg_jct_s"], 1)
        for policy, value in refs.items():
            summary[f"published_{policy}_mean_avg_jct_s"] = round(value, 1)
        click.echo(json.dumps(summary))
        sections.append(
            f"### Pollux workloads at {load}x load (average JCT per workload, s)\n\n"
            + pollux_table(lines, group, list(labels), refs)
        )
    if not skip_philly:
        sections.append(
            "### philly_3d on 32 x 4 GPUs\n\n" + philly_table(lines, list(philly_labels))
        )
    if doc is not None:
        doc.write_text("\n".join(sections))


if __name__ == "__main__":
    main()
