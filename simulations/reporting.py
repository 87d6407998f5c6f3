"""Reports: what a run's numbers are, and the files they are written to.

Definitions (the docs repeat them, and a comparison is fair only if every run uses these):

- JCT: completion time minus submit time, over jobs that finished. Percentiles are linear
  interpolations between order statistics (numpy's default).
- Queueing delay: first start minus submit time, over jobs that started.
- Makespan: the last completion minus the first submission.
- Utilization, allocated: GPU-seconds held by jobs (pauses included) over cluster
  GPU-seconds across the makespan. Useful: the same with each job's GPUs weighted by its
  scaling efficiency (``SimJob.useful_gpus``) and nothing counted while paused.
- Resizes and preemptions per job: means over all jobs.
- Utilization when saturated: GPU-seconds allocated over cluster GPU-seconds, counted only
  while the jobs submitted and not finished want at least the cluster's GPUs at their
  minimum (every GPU could be in use). Jobs that never finish count as present to the end.

``summary.json`` maps each policy argument, as given, to its ``Summary``; ``jobs.csv`` has
one row per job and policy; ``table.md`` is the Markdown comparison; the PNG plots are drawn
with matplotlib (imported only when plots are asked for).
"""

from __future__ import annotations

import csv
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from simulations.engine import SimResult
from simulations.workload import ClusterSpec


def _stats(values: Sequence[float]) -> tuple[float, float, float, float]:
    if not values:
        return (float("nan"),) * 4
    arr = np.asarray(values, dtype=float)
    p50, p95, p99 = np.percentile(arr, [50, 95, 99])
    return float(arr.mean()), float(p50), float(p95), float(p99)


def _integral(timeline: Sequence[tuple[float, int, float]], end: float) -> tuple[float, float]:
    """GPU-seconds allocated and useful from the timeline's start to ``end``."""
    allocated = useful = 0.0
    for (t, a, u), (t_next, _, _) in zip(timeline, [*timeline[1:], (end, 0, 0.0)], strict=True):
        span = max(0.0, min(t_next, end) - t)
        allocated += a * span
        useful += u * span
    return allocated, useful


def saturated_utilization(result: SimResult) -> tuple[float | None, float]:
    """GPUs allocated, as a share of the cluster, over the time when the jobs present want
    at least the cluster's GPUs at their minimum sizes; and that time in seconds. (None, 0)
    when the cluster is never saturated. The timeline ends at the last completion."""
    capacity = result.cluster.gpus
    ends = [j.end for j in result.jobs if j.end is not None]
    if not result.timeline or not capacity:
        return None, 0.0
    last = max(ends, default=result.timeline[-1][0])
    # (time, change of the GPUs wanted): a job wants its minimum from submission to its end.
    changes = [(j.submit_time, j.min_workers) for j in result.jobs]
    changes += [(j.end, -j.min_workers) for j in result.jobs if j.end is not None]
    changes.sort()
    allocated_s = saturated_s = 0.0
    wanted, at = 0, 0
    timeline = result.timeline
    for i, (t, held, _) in enumerate(timeline):
        t_next = min(timeline[i + 1][0] if i + 1 < len(timeline) else last, last)
        # Split the allocation's step at every change of demand inside it.
        start = t
        while start < t_next:
            while at < len(changes) and changes[at][0] <= start:
                wanted += changes[at][1]
                at += 1
            stop = min(t_next, changes[at][0]) if at < len(changes) else t_next
            if wanted >= capacity:
                allocated_s += held * (stop - start)
                saturated_s += stop - start
            start = stop
    if saturated_s <= 0:
        return None, 0.0
    return allocated_s / (capacity * saturated_s), saturated_s


def summarize(result: SimResult) -> dict[str, Any]:
    """The run's numbers as a JSON-ready dict (keys as in the issue's ``summary.json``)."""
    jobs = result.jobs
    jcts = [j.jct for j in jobs if j.jct is not None]
    delays = [j.queueing_delay for j in jobs if j.queueing_delay is not None]
    avg, median, p95, p99 = _stats(jcts)
    d_avg, d_median, d_p95, _ = _stats(delays)
    first = min((j.submit_time for j in jobs), default=0.0)
    ends = [j.end for j in jobs if j.end is not None]
    last = max(ends, default=first)
    makespan = last - first
    allocated, useful = _integral(result.timeline, last)
    capacity = result.cluster.gpus * makespan
    by_priority: dict[str, float] = {}
    for prio in sorted({j.priority for j in jobs}):
        mine = [j.jct for j in jobs if j.priority == prio and j.jct is not None]
        if mine:
            by_priority[str(prio)] = float(np.mean(mine))
    n = len(jobs)
    saturated, saturated_s = saturated_utilization(result)
    return {
        "avg_jct_s": avg,
        "median_jct_s": median,
        "p95_jct_s": p95,
        "p99_jct_s": p99,
        "makespan_s": makespan,
        "utilization_allocated": allocated / capacity if capacity else 0.0,
        "utilization_useful": useful / capacity if capacity else 0.0,
        "utilization_saturated": saturated,
        "saturated_s": saturated_s,
        "jobs": n,
        "finished": len(jcts),
        "avg_queueing_s": d_avg,
        "median_queueing_s": d_median,
        "p95_queueing_s": d_p95,
        "resizes_per_job": sum(j.resizes for j in jobs) / n if n else 0.0,
        "preemptions_per_job": sum(j.preemptions for j in jobs) / n if n else 0.0,
        "avg_jct_by_priority_s": by_priority,
        "cluster": result.cluster.label,
        "plans": result.plans,
        "wall_s": result.wall_s,
        "plan_wall_s": result.plan_wall_s,
    }


_COLUMNS = (
    ("avg_jct_s", "avg JCT (s)", "{:,.1f}"),
    ("median_jct_s", "median JCT (s)", "{:,.0f}"),
    ("p95_jct_s", "p95 JCT (s)", "{:,.0f}"),
    ("p99_jct_s", "p99 JCT (s)", "{:,.0f}"),
    ("avg_queueing_s", "avg queueing (s)", "{:,.0f}"),
    ("makespan_s", "makespan (s)", "{:,.0f}"),
    ("utilization_allocated", "util. allocated", "{:.1%}"),
    ("utilization_useful", "util. useful", "{:.1%}"),
    ("resizes_per_job", "resizes/job", "{:.2f}"),
    ("preemptions_per_job", "preemptions/job", "{:.2f}"),
    ("finished", "finished", "{:d}"),
    ("wall_s", "wall (s)", "{:.1f}"),
)


#: What a row ran with (``scenario.setup_of``), stated beside its numbers where known.
_SETUP = (("elasticity", "jobs"), ("planning", "plans"), ("pauses", "pauses"))


def markdown_table(summaries: Mapping[str, Mapping[str, Any]]) -> str:
    setup = [(key, title) for key, title in _SETUP if all(key in s for s in summaries.values())]
    titles = [title for _, title in setup] + [title for _, title, _ in _COLUMNS]
    head = "| policy | " + " | ".join(titles) + " |"
    rule = "|---|" + "---|" * len(setup) + "---:|" * len(_COLUMNS)
    rows = [head, rule]
    for name, summary in summaries.items():
        cells = [str(summary[key]) for key, _ in setup]
        cells += [fmt.format(summary[key]) for key, _, fmt in _COLUMNS]
        rows.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(rows) + "\n"


_JOB_FIELDS = (
    "policy",
    "job",
    "submit_s",
    "requested",
    "min",
    "max",
    "priority",
    "first_start_s",
    "end_s",
    "jct_s",
    "queueing_s",
    "resizes",
    "preemptions",
    "gpu_seconds",
)


def write_jobs_csv(results: Mapping[str, SimResult], path: Path) -> None:
    with path.open("w", newline="") as handle:
        out = csv.writer(handle)
        out.writerow(_JOB_FIELDS)
        for name, result in results.items():
            for j in result.jobs:
                out.writerow(
                    (
                        name,
                        j.name,
                        f"{j.submit_time:.3f}",
                        j.requested,
                        j.min_workers,
                        j.max_workers,
                        j.priority,
                        "" if j.first_start is None else f"{j.first_start:.3f}",
                        "" if j.end is None else f"{j.end:.3f}",
                        "" if j.jct is None else f"{j.jct:.3f}",
                        "" if j.queueing_delay is None else f"{j.queueing_delay:.3f}",
                        j.resizes,
                        j.preemptions,
                        f"{j.gpu_seconds:.1f}",
                    )
                )


def run_title(trace: str, fmt: str, jobs: int, cluster: ClusterSpec, elasticity: str) -> str:
    """What ran, for a plot's title: the trace with its folder (a Pollux workload's folder
    says its load, as ``workloads-2.0``), the jobs, the cluster and the elasticity."""
    named = "/".join(Path(trace).parts[-2:])
    what = f"{named} ({fmt})" if fmt != "synthetic" else f"{trace} synthetic jobs"
    return f"{what}, {jobs} jobs on {cluster.label} ({cluster.gpus} GPUs), {elasticity}"


def write_reports(
    results: Mapping[str, SimResult],
    out: Path,
    *,
    plots: bool = True,
    title: str = "",
    setups: Mapping[str, Mapping[str, str]] | None = None,
) -> dict[str, dict[str, Any]]:
    """Write summary.json, jobs.csv, table.md (and the plots, titled ``title``: what ran)
    into ``out``. ``setups``: per row, what it ran with (``scenario.setup_of``), written
    into its summary and its row of the table."""
    out.mkdir(parents=True, exist_ok=True)
    summaries = {
        name: {**summarize(r), **((setups or {}).get(name) or {})} for name, r in results.items()
    }
    (out / "summary.json").write_text(json.dumps(summaries, indent=2, sort_keys=True) + "\n")
    (out / "table.md").write_text(markdown_table(summaries))
    write_jobs_csv(results, out / "jobs.csv")
    if plots:
        from simulations.plotting import plot_jct_cdf, plot_utilization

        plot_utilization(results, out / "utilization.png", title)
        plot_jct_cdf(results, out / "jct_cdf.png", title)
    return summaries
