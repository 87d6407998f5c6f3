"""PNG plots of simulation runs, drawn with matplotlib on its non-interactive backend.

Two figures, one line per policy: GPU utilization over time (allocated, smoothed over
windows so that a months-long trace stays readable) and the JCT CDF (log time axis). Each
carries a title that says what ran (the trace, the cluster, the jobs).

What must stay true: every policy's line is visible, also where it equals another's (the
lines are drawn widest first, each narrower than the last, so one on top of another shows
as a line inside a line).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import numpy as np

from simulations.engine import SimResult

_POINTS = 400
_WIDEST, _NARROWEST = 4.0, 1.5


def _widths(count: int) -> list[float]:
    """Line widths for ``count`` policies, widest first."""
    if count <= 1:
        return [1.6] * count
    step = (_WIDEST - _NARROWEST) / (count - 1)
    return [_WIDEST - i * step for i in range(count)]


def _windowed(result: SimResult) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Mean allocated and useful fractions over ``_POINTS`` equal windows of the run."""
    times = np.array([t for t, _, _ in result.timeline])
    alloc = np.array([a for _, a, _ in result.timeline], dtype=float)
    useful = np.array([u for _, _, u in result.timeline], dtype=float)
    ends = [j.end for j in result.jobs if j.end is not None]
    end = max(ends, default=float(times[-1]))
    grid = np.linspace(float(times[0]), max(end, float(times[0]) + 1.0), _POINTS + 1)
    # Integral of a step function at every grid point, then differences per window.
    knots = np.append(times, grid[-1])
    widths = np.diff(knots).clip(min=0.0)
    cum_a = np.concatenate(([0.0], np.cumsum(alloc * widths)))
    cum_u = np.concatenate(([0.0], np.cumsum(useful * widths)))
    at_a = np.interp(grid, knots, cum_a)
    at_u = np.interp(grid, knots, cum_u)
    span = np.diff(grid) * result.cluster.gpus
    mid = (grid[:-1] + grid[1:]) / 2.0
    return (mid - grid[0]) / 3600.0, np.diff(at_a) / span, np.diff(at_u) / span


def plot_utilization(results: Mapping[str, SimResult], path: Path, title: str = "") -> None:
    fig, ax = plt.subplots(figsize=(9, 4.5))
    for (name, result), width in zip(results.items(), _widths(len(results)), strict=True):
        if len(result.timeline) < 2:
            continue
        hours, alloc, useful = _windowed(result)
        (line,) = ax.plot(hours, alloc, linewidth=width, label=f"{name} allocated")
        ax.plot(
            hours, useful, linestyle="--", linewidth=width, color=line.get_color(),
            label=f"{name} useful",
        )  # fmt: skip
    ax.set_title(f"GPU utilization: {title}" if title else "GPU utilization", fontsize="medium")
    ax.set_xlabel("time since first submission (h)")
    ax.set_ylabel("GPU utilization")
    ax.set_ylim(0, 1.05)
    ax.legend(fontsize="small")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_jct_cdf(results: Mapping[str, SimResult], path: Path, title: str = "") -> None:
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for (name, result), width in zip(results.items(), _widths(len(results)), strict=True):
        jcts = np.sort([j.jct for j in result.jobs if j.jct is not None])
        if len(jcts) == 0:
            continue
        fraction = np.arange(1, len(jcts) + 1) / len(jcts)
        ax.step(np.maximum(jcts, 1.0), fraction, linewidth=width, label=name)
    ax.set_title(f"JCT CDF: {title}" if title else "JCT CDF", fontsize="medium")
    ax.set_xscale("log")
    ax.set_xlabel("job completion time (s)")
    ax.set_ylabel("fraction of jobs")
    ax.legend(fontsize="small")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
