"""Policy quality: EDL's policies beside the baselines, every workload the scheduling-quality
goals name, in one command. One JSON line per run, then one per (workload set, policy) with
the means, then one with every goal and whether it is met; ``--doc`` and ``--readme`` write
the tables and the headline between their markers in those files.

- Pollux workloads 1-8 (160 jobs each) at each ``--load`` (0.5x, 1.0x, 1.5x, 2.0x), on 16
  nodes x 4 GPUs with the Pollux simulator's rounds (``simulations.config.POLLUX_ROUNDS``):
  ``edl`` and ``edl-fulfillment`` with elastic jobs (min 1, max min(64, max batch / min
  local batch), ncf 1), ``edl+adapt`` the same with batch-size adaptation, ``tiresias``
  (the Tiresias paper's thresholds), ``tiresias-pollux`` (the Pollux simulator's Tiresias)
  and ``fifo-gang``, rigid at the workload's sizes. Beside them, the published means of the
  Pollux artifact (``results-jobload/<policy>-<load>/summary.json``: Pollux, Tiresias,
  Optimus+Oracle).
- ``philly_3d`` (5,851 jobs) and ``philly_1d`` on 32 x 4 GPUs, default engine settings (60 s
  ticks, plans on events, 10 s per resize, 52 s per resume after suspension, measured by
  ``benchmarks/suspend_cost.py``), ``amdahl:0.1`` scaling: every policy on rigid jobs, and
  the elastic ones also on elastic jobs (min ceil(n/2), max 2n).
- The full Philly trace (``pollux/traces/philly.csv``, 82,247 jobs) on 64 x 8 GPUs, the
  same settings: ``edl`` on elastic jobs and ``tiresias``.
- A priority mix: 1,500 synthetic Philly-like jobs (``SyntheticSpec``, seed 1, 40 arrivals
  an hour, priorities 0/1/2 drawn 60/30/10%) on 16 x 4 GPUs, the same settings: ``edl`` on
  elastic jobs and ``tiresias``, each level's average queueing delay and JCT.

    python benchmarks/policy_quality.py [--load 1.0 ...] [--workload 6 ...] [--set philly_3d ...]
        [-j 2] [--doc docs/policy-quality.md] [--readme README.md] [--from-lines runs.jsonl]
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
from simulations.engine import SimConfig, SimResult, simulate
from simulations.reporting import summarize
from simulations.synthetic import SyntheticSpec, generate
from simulations.traces import (
    default_traces,
    load_cluster,
    load_philly,
    load_pollux,
    load_tiresias,
)
from simulations.workload import ClusterSpec, Elasticity, ScalingRule, SimJob, shape

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
#: The full Philly trace and the priority mix: label -> (preset, elastic jobs)
FULL_RUNS = {"edl@elastic": ("edl", True), "tiresias": ("tiresias", False)}
MIX_RUNS = FULL_RUNS
#: Every workload set but the Pollux loads, in the order they run (the longest first).
SETS = ("philly_full", "philly_3d", "philly_1d", "priority_mix")
LOADS = ("0.5", "1.0", "1.5", "2.0")
PUBLISHED = ("pollux", "tiresias", "optimus")
_PUBLISHED_NAMES = {"pollux": "Pollux", "tiresias": "Tiresias", "optimus": "Optimus+Oracle"}


@dataclass(frozen=True, slots=True)
class Task:
    """One simulation: a workload set (``pollux-1.0`` or ``philly_3d``), a workload, a run."""

    group: str
    workload: str
    label: str


#: The priority mix's jobs (the goal: its top level waits no longer than one planning
#: period plus one resize pause, on average, and every job of every level finishes).
MIX = SyntheticSpec(jobs=1_500, arrivals_per_hour=40.0, priority_mix=((0, 0.6), (1, 0.3), (2, 0.1)))
MIX_SEED = 1


def _folder(load: str) -> str:
    return "workloads" if load == "1.0" else f"workloads-{load}"


def _line(task: Task, result: SimResult, extra: dict[str, Any]) -> dict[str, Any]:
    summary = summarize(result)
    saturated = summary["utilization_saturated"]
    return {
        "set": task.group,
        "workload": task.workload,
        "policy": task.label,
        "avg_jct_s": round(summary["avg_jct_s"], 1),
        "p99_jct_s": round(summary["p99_jct_s"], 1),
        "utilization_allocated": round(summary["utilization_allocated"], 4),
        "utilization_useful": round(summary["utilization_useful"], 4),
        "utilization_saturated": None if saturated is None else round(saturated, 4),
        "finished": summary["finished"],
        "jobs": summary["jobs"],
        "wall_s": round(result.wall_s, 2),
        **extra,
    }


def _by_priority(result: SimResult) -> dict[str, Any]:
    """Each priority level's jobs, finished jobs, average queueing delay and JCT."""
    out: dict[str, Any] = {}
    for level in sorted({j.priority for j in result.jobs}):
        mine = [j for j in result.jobs if j.priority == level]
        waits = [j.queueing_delay for j in mine if j.queueing_delay is not None]
        jcts = [j.jct for j in mine if j.jct is not None]
        out[str(level)] = {
            "jobs": len(mine),
            "finished": len(jcts),
            "avg_queueing_s": round(_mean(waits), 1),
            "avg_jct_s": round(_mean(jcts), 1),
        }
    return {"by_priority": out}


def _amdahl_run(
    jobs: Iterable[SimJob], cluster: ClusterSpec, label: str, runs: dict[str, Any]
) -> SimResult:
    """Philly-like jobs, elastic or rigid as ``runs[label]`` says, scaling by
    ``amdahl:0.1``, under the engine's defaults."""
    name, elastic = runs[label]
    shaped = shape(
        list(jobs),
        elasticity=Elasticity.ELASTIC if elastic else Elasticity.RIGID,
        scaling=ScalingRule.parse("amdahl:0.1"),
        cluster=cluster,
        seed=0,
    )
    return simulate(shaped, cluster, preset(name), SimConfig(), label=label)


def run_task(task: Task, traces: str) -> dict[str, Any]:
    """Run one simulation; a plain function of picklable arguments, for the process pool."""
    root = Path(traces)
    if task.group in ("philly_3d", "philly_1d"):
        cluster = load_cluster(str(root / "tiresias" / "n32g4.csv"))
        workload = load_tiresias(root / "philly-derived" / f"{task.group}.csv", cluster)
        return _line(task, _amdahl_run(workload.jobs, cluster, task.label, PHILLY_RUNS), {})
    if task.group == "philly_full":
        cluster = load_cluster("64x8")
        workload = load_philly(root / "pollux" / "traces" / "philly.csv", cluster)
        return _line(task, _amdahl_run(workload.jobs, cluster, task.label, FULL_RUNS), {})
    if task.group == "priority_mix":
        cluster = load_cluster("16x4")
        result = _amdahl_run(generate(MIX, MIX_SEED).jobs, cluster, task.label, MIX_RUNS)
        return _line(task, result, _by_priority(result))
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
    return _line(task, result, {})


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


def philly_table(lines: list[dict[str, Any]], group: str, labels: list[str]) -> str:
    out = [
        "| policy | avg JCT (s) | p99 JCT (s) | util. allocated | util. useful "
        "| util. saturated | finished | wall (s) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for label in labels:
        for r in lines:
            if r["set"] == group and r["policy"] == label:
                saturated = r.get("utilization_saturated")
                out.append(
                    f"| `{label}` | {r['avg_jct_s']:,.0f} | {r['p99_jct_s']:,.0f} "
                    f"| {r['utilization_allocated']:.1%} | {r['utilization_useful']:.1%} "
                    f"| {'' if saturated is None else f'{saturated:.1%}'} "
                    f"| {r['finished']}/{r['jobs']} | {r['wall_s']:.0f} |"
                )
    return "\n".join(out) + "\n"


def mix_table(lines: list[dict[str, Any]], labels: list[str]) -> str:
    out = [
        "| policy | priority | jobs | finished | avg queueing (s) | avg JCT (s) |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for label in labels:
        for r in lines:
            if r["set"] == "priority_mix" and r["policy"] == label:
                for level, row in sorted(r["by_priority"].items(), key=lambda kv: -int(kv[0])):
                    out.append(
                        f"| `{label}` | {level} | {row['jobs']} | {row['finished']} "
                        f"| {row['avg_queueing_s']:,.0f} | {row['avg_jct_s']:,.0f} |"
                    )
    return "\n".join(out) + "\n"


def _row(lines: list[dict[str, Any]], group: str, label: str) -> dict[str, Any] | None:
    return next((r for r in lines if r["set"] == group and r["policy"] == label), None)


def goals(lines: list[dict[str, Any]], refs: dict[str, dict[str, float]]) -> list[dict[str, Any]]:
    """Each goal of the scheduling-quality issue whose runs are in ``lines``: what it asks,
    what was measured and whether that meets it. ``refs``: published means per load."""
    out: list[dict[str, Any]] = []

    def add(workload: str, value: float, bound: float, goal: str, at_most: bool = True) -> None:
        met = value <= bound if at_most else value >= bound
        out.append({"workload": workload, "goal": goal, "value": round(value, 4), "met": met})

    for group, factor in (("philly_3d", 0.75), ("philly_1d", 0.9)):
        edl, base = _row(lines, group, "edl@elastic"), _row(lines, group, "tiresias")
        if edl and base:
            bound = factor * base["avg_jct_s"]
            add(f"{group}, elastic jobs, avg JCT", edl["avg_jct_s"], bound, f"<= {bound:,.0f} s")
            if group == "philly_3d":
                bound = 1.1 * base["p99_jct_s"]
                add(
                    f"{group}, elastic jobs, p99 JCT", edl["p99_jct_s"], bound, f"<= {bound:,.0f} s"
                )
    rigid, base = _row(lines, "philly_3d", "edl@rigid"), _row(lines, "philly_3d", "tiresias")
    if rigid and base:
        bound = base["avg_jct_s"]
        add("philly_3d, rigid jobs (`edl@rigid`)", rigid["avg_jct_s"], bound, f"<= {bound:,.0f} s")
    for load, published_means in refs.items():
        group = f"pollux-{load}"
        for label, ref, name in (("edl+adapt", "pollux", "adapting"), ("edl", "tiresias", "fixed")):
            if _row(lines, group, label) is None:
                continue
            bound = 0.9 * published_means[ref]
            value = means(lines, group, label)["avg_jct_s"]
            add(f"Pollux {load}x, {name} batch", value, bound, f"<= {bound:,.0f} s")
    mix = _row(lines, "priority_mix", "edl@elastic")
    if mix:
        levels = mix["by_priority"]
        top = levels[max(levels, key=int)]
        bound = SimConfig().tick_s + SimConfig().resize_pause_s
        add(
            "priority mix, top level's avg queueing",
            top["avg_queueing_s"],
            bound,
            f"<= {bound:g} s",
        )
        unfinished = sum(row["jobs"] - row["finished"] for row in levels.values())
        add("priority mix, jobs never finished", unfinished, 0, "0 (none starves)")
    for group in sorted({r["set"] for r in lines}):
        saturated = [
            r["utilization_saturated"]
            for r in lines
            if r["set"] == group
            and r["policy"] in ("edl", "edl+adapt", "edl@elastic")
            and r.get("utilization_saturated") is not None
        ]
        if saturated:
            name = _GROUP_NAMES.get(group, group.replace("pollux-", "Pollux ") + "x")
            add(
                f"{name}, `edl`: GPUs allocated when saturated",
                min(saturated),
                0.97,
                ">= 97%",
                False,
            )
    return out


_GROUP_NAMES = {
    "philly_full": "full Philly on 64 x 8",
    "priority_mix": "priority mix",
    "philly_3d": "philly_3d",
    "philly_1d": "philly_1d",
}


def goals_table(rows: list[dict[str, Any]]) -> str:
    out = ["| workload | goal | measured | met |", "|---|---|---:|---|"]
    for g in rows:
        value = g["value"]
        if "allocated" in g["workload"]:
            shown = f"{value:.1%}"
        elif "never finished" in g["workload"]:
            shown = f"{value:,.0f}"
        else:
            shown = f"{value:,.0f} s"
        out.append(f"| {g['workload']} | {g['goal']} | {shown} | {'yes' if g['met'] else 'no'} |")
    return "\n".join(out) + "\n"


def write_between(path: Path, name: str, text: str) -> None:
    """Replace what stands between ``<!-- name:begin -->`` and ``<!-- name:end -->`` in
    ``path`` with ``text``; the rest of the file stays as it is."""
    begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
    body = path.read_text()
    if body.count(begin) != 1 or body.count(end) != 1 or body.index(begin) > body.index(end):
        raise click.UsageError(
            f"{path}: needs one line {begin} and, after it, one line {end} around the part "
            "this script writes; add them where the tables go"
        )
    before, rest = body.split(begin)
    after = rest.split(end)[1]
    path.write_text(f"{before}{begin}\n{text}{end}{after}")


@click.command()
@click.option("--traces", type=click.Path(path_type=Path), default=default_traces)
@click.option("--load", "loads", multiple=True, default=LOADS, help="Pollux load (repeat).")
@click.option("--workload", "numbers", multiple=True, type=int, default=tuple(range(1, 9)))
@click.option("--policy", "labels", multiple=True, default=tuple(POLLUX_RUNS))
@click.option("--set", "sets", multiple=True, default=SETS, type=click.Choice(SETS))
@click.option("--philly-policy", "philly_labels", multiple=True, default=tuple(PHILLY_RUNS))
@click.option("--skip-pollux", is_flag=True)
@click.option("--skip-philly", is_flag=True, help="Run the Pollux workloads only.")
@click.option("--processes", "-j", default=2, show_default=True)
@click.option("--doc", type=click.Path(dir_okay=False, path_type=Path), default=None)
@click.option("--readme", type=click.Path(dir_okay=False, path_type=Path), default=None)
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
    sets: tuple[str, ...],
    philly_labels: tuple[str, ...],
    skip_pollux: bool,
    skip_philly: bool,
    processes: int,
    doc: Path | None,
    readme: Path | None,
    saved: tuple[Path, ...],
) -> None:
    sets = () if skip_philly else sets
    loads = () if skip_pollux else loads
    tasks: list[Task] = []
    for group in SETS:  # longest first, so the pool stays busy
        if group in sets:
            runs = {"philly_full": FULL_RUNS, "priority_mix": MIX_RUNS}.get(group)
            chosen = list(runs) if runs is not None else philly_labels
            tasks += [Task(group, group, label) for label in chosen]
    for load in loads:
        for n in numbers:
            tasks += [Task(f"pollux-{load}", f"workload-{n}", label) for label in labels]
    lines: list[dict[str, Any]] = []
    for path in saved:
        runs_read = [json.loads(t) for t in path.read_text().splitlines() if '"policy"' in t]
        lines += [r for r in runs_read if Task(r["set"], r["workload"], r["policy"]) in tasks]
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
    refs: dict[str, dict[str, float]] = {}
    for load in loads:
        group = f"pollux-{load}"
        refs[load] = published(traces, load, workloads)
        summary: dict[str, Any] = {"set": group, "workloads": list(numbers)}
        for label in labels:
            summary[f"{label}_mean_avg_jct_s"] = round(means(lines, group, label)["avg_jct_s"], 1)
        for policy, value in refs[load].items():
            summary[f"published_{policy}_mean_avg_jct_s"] = round(value, 1)
        click.echo(json.dumps(summary))
        sections.append(
            f"### Pollux workloads at {load}x load (average JCT per workload, s)\n\n"
            + pollux_table(lines, group, list(labels), refs[load])
        )
    titles = {
        "philly_3d": ("### philly_3d on 32 x 4 GPUs", list(philly_labels)),
        "philly_1d": ("### philly_1d on 32 x 4 GPUs", list(philly_labels)),
        "philly_full": ("### The full Philly trace on 64 x 8 GPUs", list(FULL_RUNS)),
    }
    for group, (title, chosen) in titles.items():
        if group in sets:
            sections.append(f"{title}\n\n" + philly_table(lines, group, chosen))
    if "priority_mix" in sets:
        sections.append(
            "### Priority mix on 16 x 4 GPUs (1,500 synthetic jobs, levels 0/1/2 at 60/30/10%)\n\n"
            + mix_table(lines, list(MIX_RUNS))
            + "\n"
            + philly_table(lines, "priority_mix", list(MIX_RUNS))
        )
    met = goals(lines, refs)
    click.echo(json.dumps({"goals": met}))
    headline = goals_table(met)
    sections.insert(0, "### The goals\n\n" + headline)
    if doc is not None:
        write_between(doc, "policy_quality", "\n".join(sections))
    if readme is not None:
        write_between(readme, "policy_quality", headline)


if __name__ == "__main__":
    main()
