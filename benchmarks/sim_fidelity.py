"""Simulator fidelity: one JSON line per check, our baselines beside the Tiresias
simulator's published average JCTs (``../shared/traces/README.md``).

    python benchmarks/sim_fidelity.py [--trace philly_1d] [--trace philly_3d]
"""

from __future__ import annotations

import json
from pathlib import Path

import click

from simulations.fidelity import REFERENCES, run_check
from simulations.traces import default_traces


@click.command()
@click.option("--traces", type=click.Path(path_type=Path), default=default_traces)
@click.option("--trace", "names", multiple=True, default=("philly_1d", "philly_3d"))
def main(traces: Path, names: tuple[str, ...]) -> None:
    for ref in REFERENCES:
        if ref.trace not in names:
            continue
        row = run_check(ref, traces)
        line = {
            "trace": ref.trace,
            "policy": ref.our_policy,
            "reference_policy": ref.their_policy,
            "reference_avg_jct_s": ref.avg_jct_s,
            "avg_jct_s": round(row.avg_jct_s, 1),
            "error": round(row.error, 4),
            "within_10pct": row.ok,
            "reference_median_jct_s": ref.median_jct_s,
            "median_jct_s": row.median_jct_s,
            "reference_wall_s": ref.wall_s,
            "wall_s": round(row.wall_s, 2),
        }
        click.echo(json.dumps(line), nl=True)


if __name__ == "__main__":
    main()
