"""The command line: ``python -m simulations run ...`` and ``python -m simulations fidelity``.

Parsing is click's; everything the commands do lives in ``scenario``, ``engine``,
``reporting`` and ``fidelity``, so the tests call those directly and the CLI stays thin.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import click
from rich.console import Console
from rich.progress import Progress

from simulations import native
from simulations.fidelity import REFERENCES, markdown, run_check
from simulations.reporting import markdown_table, run_title, write_reports
from simulations.scenario import (
    FORMATS,
    defaults_for,
    load_workload,
    parse_policy,
    prepare,
    run_policies,
    setup_of,
)
from simulations.traces import TraceError, default_traces, load_cluster
from simulations.workload import Elasticity, ScalingSpecError, parse_priorities


@click.group()
def main() -> None:
    """EDL's trace-driven simulator: real cluster traces through the planner."""


@main.command()
@click.option("--trace", required=True, help="Trace file (for synthetic: the number of jobs).")
@click.option("--format", "fmt", type=click.Choice(FORMATS), required=True)
@click.option("--cluster", default="16x4", show_default=True, help="NxG or a n*g*.csv spec.")
@click.option("--policy", "policies", multiple=True, required=True, help="Preset[@rigid|@elastic]")
@click.option(
    "--elasticity",
    type=click.Choice([e.value for e in Elasticity]),
    default=None,
    help="Jobs' bounds [default: elastic for pollux (the workload's bounds), else rigid].",
)
@click.option("--scaling", default="amdahl:0.1", show_default=True, help="linear, amdahl:F")
@click.option("--priorities", default="none", show_default=True, help="none or draw:K")
@click.option("--seed", default=0, show_default=True)
@click.option(
    "--tick", type=float, default=None, help="Planning period (s); 0: none. [default: 60]"
)
@click.option(
    "--plan-on-events/--no-plan-on-events",
    default=None,
    help="Plan at arrivals and completions too [default: yes; pollux: no, 60 s rounds].",
)
@click.option(
    "--resize-pause", type=float, default=None, help="Seconds per resize [default: 10; pollux: 30]."
)
@click.option(
    "--restart-pause",
    type=float,
    default=None,
    help="Seconds per resume after suspension [default: 52, measured; pollux: 0].",
)
@click.option(
    "--start-delay",
    type=float,
    default=None,
    help="Seconds to start a job's workers [default: 0; pollux: 30].",
)
@click.option("--limit", type=int, default=None, help="Keep only the first N jobs.")
@click.option("--skip-bad-rows", is_flag=True, help="Skip malformed rows, with a count.")
@click.option(
    "--profiles",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="pollux: the application profiles (default: ../traces beside the workload).",
)
@click.option("--adapt-batch", is_flag=True, help="pollux: jobs adapt their batch size.")
@click.option("--processes", "-j", default=1, show_default=True, help="Policies in parallel.")
@click.option("--plots/--no-plots", default=True, show_default=True)
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), required=True)
def run(
    trace: str,
    fmt: str,
    cluster: str,
    policies: tuple[str, ...],
    elasticity: str | None,
    scaling: str,
    priorities: str,
    seed: int,
    tick: float | None,
    plan_on_events: bool | None,
    resize_pause: float | None,
    restart_pause: float | None,
    start_delay: float | None,
    limit: int | None,
    skip_bad_rows: bool,
    profiles: Path | None,
    adapt_batch: bool,
    processes: int,
    plots: bool,
    out: Path,
) -> None:
    """Run several policies on one workload; write summary.json, jobs.csv, table.md, PNGs.

    Unset options take the format's documented setup (``scenario.defaults_for``); the table
    and summary.json state each row's elasticity, planning times and pauses."""
    console = Console(stderr=True)
    usual_elasticity, usual = defaults_for(fmt)
    chosen = Elasticity(elasticity) if elasticity is not None else usual_elasticity
    given: dict[str, object] = {
        "tick_s": tick,
        "plan_on_events": plan_on_events,
        "resize_pause_s": resize_pause,
        "restart_pause_s": restart_pause,
        "start_delay_s": start_delay,
    }
    told = {k: v for k, v in given.items() if v is not None}
    # hide: exact (simulations/leaving_out.py); this command records no snapshot
    config = replace(usual, hide=True, **told)  # type: ignore[arg-type]
    try:
        spec = load_cluster(cluster)
        runs = [parse_policy(p) for p in policies]
        workload = load_workload(
            fmt,
            trace,
            spec,
            seed=seed,
            skip_bad_rows=skip_bad_rows,
            limit=limit,
            profiles=profiles,
            adapt_batch=adapt_batch,
        )
        jobs = prepare(
            workload,
            spec,
            elasticity=chosen,
            scaling=scaling,
            seed=seed,
            priority_levels=parse_priorities(priorities),
        )
    except (TraceError, ScalingSpecError, ValueError) as exc:
        raise click.ClickException(str(exc)) from None
    if workload.skipped_rows:
        console.print(f"[yellow]warning: skipped {workload.skipped_rows} malformed row(s)")
    with Progress(console=console, transient=True) as bar:
        task = bar.add_task(f"{len(jobs)} jobs on {spec.label}", total=len(runs))
        results = run_policies(
            jobs, spec, runs, config, processes=processes, done=lambda _: bar.advance(task)
        )
    title = run_title(trace, fmt, len(jobs), spec, chosen.value)
    setups = {run.label: setup_of(run, chosen, config) for run in runs}
    summaries = write_reports(results, out, plots=plots, title=title, setups=setups)
    click.echo(markdown_table(summaries), nl=False)


@main.command()
@click.option(
    "--traces",
    type=click.Path(file_okay=False, path_type=Path),
    default=default_traces,
    show_default="$EDL_TRACES, else ../shared/traces",
)
@click.option("--trace", "names", multiple=True, default=("philly_1d",), show_default=True)
@click.option("--json", "as_json", is_flag=True, help="One JSON line per check instead.")
def fidelity(traces: Path, names: tuple[str, ...], as_json: bool) -> None:
    """Our fifo-gang and tiresias beside the Tiresias simulator's published numbers."""
    rows = [run_check(ref, traces) for ref in REFERENCES if ref.trace in names]
    if as_json:
        for r in rows:
            line = {
                "trace": r.ref.trace,
                "policy": r.ref.our_policy,
                "reference_policy": r.ref.their_policy,
                "reference_avg_jct_s": r.ref.avg_jct_s,
                "avg_jct_s": round(r.avg_jct_s, 1),
                "error": round(r.error, 4),
                "median_jct_s": r.median_jct_s,
                "wall_s": round(r.wall_s, 2),
            }
            click.echo(json.dumps(line))
        return
    click.echo(markdown(rows), nl=False)


@main.command(name="compile")
def compile_() -> None:
    """Compiles the planner and the simulator's hot modules with mypyc (about two minutes):
    later runs of these same sources take the build and run about twice as fast, with the
    same results. EDL_PURE=1 runs pure Python anyway."""
    try:
        where = native.build()
    except native.BuildError as error:
        raise click.ClickException(str(error)) from error
    click.echo(f"built {len(native.modules())} modules into {where}")


if __name__ == "__main__":  # pragma: no cover
    main()
