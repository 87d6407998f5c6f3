"""Fidelity: our baselines beside the Tiresias simulator's published results.

The reference numbers are those of ``../shared/traces/README.md``: the Tiresias (NSDI'19)
simulator, ``--scheme=yarn``, on 32 nodes x 4 GPUs, fixed durations, no preemption cost.
Its ``fifo`` is strict head-of-line FIFO (our ``fifo-gang``); its ``dlas-gpu`` is 2D-LAS on
attained GPU-time with thresholds 3,250 and 7,200 GPU-seconds (our ``tiresias``), where a
waiting job never preempts a running job of its own queue (``Policy.las_running_first``).

To compare like with like the engine runs event-driven (planning on every arrival and
completion and when a running job crosses a queue threshold; no ticks), with every pause
and start delay at zero and rigid jobs. The check passes within 10% of the reference
average JCT; we never tune constants to hit a number.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from edl_scheduler.core import preset
from simulations.config import EVENT_DRIVEN
from simulations.engine import simulate
from simulations.reporting import summarize
from simulations.traces import load_cluster, load_tiresias
from simulations.workload import Elasticity, ScalingRule, shape

TOLERANCE = 0.10


@dataclass(frozen=True, slots=True)
class Reference:
    trace: str
    their_policy: str
    our_policy: str
    avg_jct_s: float
    median_jct_s: float
    wall_s: float


REFERENCES = (
    Reference("philly_1d", "fifo", "fifo-gang", 11175.7, 5976, 12.5),
    Reference("philly_1d", "dlas-gpu", "tiresias", 10236.8, 4348, 19.8),
    Reference("philly_3d", "fifo", "fifo-gang", 273299.2, 217483, 124.0),
    Reference("philly_3d", "dlas-gpu", "tiresias", 13431.9, 3829, 140.0),
)


@dataclass(frozen=True, slots=True)
class FidelityRow:
    ref: Reference
    avg_jct_s: float
    median_jct_s: float
    wall_s: float

    @property
    def error(self) -> float:
        return self.avg_jct_s / self.ref.avg_jct_s - 1.0

    @property
    def ok(self) -> bool:
        return abs(self.error) <= TOLERANCE


def run_check(ref: Reference, traces: Path) -> FidelityRow:
    cluster = load_cluster(str(traces / "tiresias" / "n32g4.csv"))
    workload = load_tiresias(traces / "philly-derived" / f"{ref.trace}.csv", cluster)
    jobs = shape(
        workload.jobs,
        elasticity=Elasticity.RIGID,
        scaling=ScalingRule(0.0, 0.0),
        cluster=cluster,
        seed=0,
    )
    result = simulate(jobs, cluster, preset(ref.our_policy), EVENT_DRIVEN)
    summary = summarize(result)
    return FidelityRow(ref, summary["avg_jct_s"], summary["median_jct_s"], result.wall_s)


def markdown(rows: list[FidelityRow]) -> str:
    lines = [
        "| trace | Tiresias sim | ours | their avg JCT (s) | our avg JCT (s) | diff "
        "| their median | our median | their wall (s) | our wall (s) | within 10% |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        ref = r.ref
        lines.append(
            f"| {ref.trace} | {ref.their_policy} | {ref.our_policy} | {ref.avg_jct_s:,.1f} "
            f"| {r.avg_jct_s:,.1f} | {r.error:+.1%} | {ref.median_jct_s:,.0f} "
            f"| {r.median_jct_s:,.0f} | {ref.wall_s:g} | {r.wall_s:.1f} "
            f"| {'yes' if r.ok else 'NO'} |"
        )
    return "\n".join(lines) + "\n"
