"""Reports, the command line, and the golden results on the Tiresias sample trace.

Aspects:
- summary numbers on a hand-computed run (JCT statistics, queueing, makespan, utilization);
- ``python -m simulations run``: every output file, summary.json keyed by the policy
  arguments as given, ``@rigid`` overriding the elasticity, bad input as a clean error (a
  trace that is missing, a folder or binary; a workload whose profiles are elsewhere), a
  byte-order mark read past; plots titled with what ran, every line visible where two are
  equal;
- golden summaries of every preset on ``60_job.csv`` (8 GPUs, so that queues form): a change
  in the engine or the planner that moves a number shows here, and must be explained;
- the Philly-1d fidelity check of ``tiresias`` against the Tiresias simulator (slow).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from edl_scheduler.core import preset
from simulations.cli import main
from simulations.engine import SimConfig, simulate
from simulations.reporting import markdown_table, run_title, summarize
from simulations.traces import default_traces
from simulations.workload import ClusterSpec, SimJob

DATA = Path(__file__).parent / "data"
TRACES = default_traces()
NO_COSTS = SimConfig(tick_s=0.0, resize_pause_s=0.0, restart_pause_s=0.0)


def test_summary_of_a_hand_computed_run() -> None:
    jobs = [SimJob("a", 0, 4, 100, 4, 4), SimJob("b", 0, 4, 50, 4, 4)]
    result = simulate(jobs, ClusterSpec(1, 4), preset("fifo-gang"), NO_COSTS)
    s = summarize(result)
    # a runs 0-100, b 100-150: JCTs 100 and 150, the cluster busy all 150 s.
    assert (s["avg_jct_s"], s["median_jct_s"], s["makespan_s"]) == (125, 125, 150)
    assert s["p99_jct_s"] == pytest.approx(149.5)
    assert (s["avg_queueing_s"], s["finished"], s["jobs"]) == (50, 2, 2)
    assert s["utilization_allocated"] == pytest.approx(1.0)
    assert s["utilization_useful"] == pytest.approx(1.0)  # linear scaling: every GPU useful
    table = markdown_table({"fifo-gang": s})
    assert table.splitlines()[2].startswith("| fifo-gang | 125.0 | 125 |")


def test_utilization_counts_only_while_the_jobs_want_every_gpu() -> None:
    """Two 4-GPU jobs on 4 GPUs, a 2-GPU job after them: saturated while a big job is
    present (0-150 s: a runs, b waits, then b runs), all four GPUs held then; the small job
    alone (200-300 s) leaves half of them idle and does not count."""
    jobs = [
        SimJob("a", 0, 4, 100, 4, 4),
        SimJob("b", 0, 4, 50, 4, 4),
        SimJob("c", 200, 2, 100, 2, 2),
    ]
    result = simulate(jobs, ClusterSpec(1, 4), preset("fifo-gang"), NO_COSTS)
    s = summarize(result)
    assert s["saturated_s"] == pytest.approx(150)
    assert s["utilization_saturated"] == pytest.approx(1.0)
    assert s["utilization_allocated"] == pytest.approx((150 * 4 + 100 * 2) / (300 * 4))
    alone = summarize(simulate(jobs[2:], ClusterSpec(1, 4), preset("fifo-gang"), NO_COSTS))
    assert (alone["utilization_saturated"], alone["saturated_s"]) == (None, 0.0)


def test_run_command_writes_every_output(tmp_path: Path) -> None:
    out = tmp_path / "out"
    args = ["run", "--trace", str(DATA / "60_job.csv"), "--format", "tiresias"]
    args += ["--cluster", "2x4", "--elasticity", "elastic", "--out", str(out)]
    args += ["--policy", "edl", "--policy", "edl@rigid", "--policy", "fifo-gang"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    files = {p.name for p in out.iterdir()}
    assert files == {"summary.json", "table.md", "jobs.csv", "utilization.png", "jct_cdf.png"}
    summary = json.loads((out / "summary.json").read_text())
    assert list(summary) == ["edl", "edl@rigid", "fifo-gang"]
    for row in summary.values():
        assert row["jobs"] == 60
        assert {"avg_jct_s", "p95_jct_s", "p99_jct_s", "utilization_useful"} <= set(row)
    # Rigid jobs under the elastic planner never resize; elastic ones do better than FIFO.
    assert summary["edl@rigid"]["resizes_per_job"] == 0
    assert summary["edl"]["avg_jct_s"] < summary["fifo-gang"]["avg_jct_s"]
    lines = (out / "jobs.csv").read_text().splitlines()
    assert len(lines) == 1 + 3 * 60
    assert "| edl@rigid |" in result.output


def test_run_command_refuses_bad_input(tmp_path: Path) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text("job_id,num_gpu,submit_time,iterations,model_name,duration,interval\n")
    bad.write_text(bad.read_text() + "1,64,0,5,m,4,1\n")
    args = ["run", "--trace", str(bad), "--format", "tiresias", "--cluster", "2x4"]
    args += ["--policy", "edl", "--out", str(tmp_path / "o")]
    result = CliRunner().invoke(main, args)
    assert result.exit_code != 0
    assert "bad.csv:2: 64 GPUs requested, the cluster has 8" in result.output
    result = CliRunner().invoke(main, [*args[:-4], "--policy", "edl@bendy", *args[-2:]])
    assert "@rigid or @elastic" in result.output


@pytest.mark.parametrize(
    ("name", "said"),
    [
        ("nope.csv", "nope.csv: no such file: give the path of a trace file"),
        (".", "is a folder: give one trace file in it"),
        ("binary.csv", "binary.csv: not a UTF-8 text file"),
    ],
)
def test_a_trace_that_cannot_be_read_is_one_error_line(
    tmp_path: Path, name: str, said: str
) -> None:
    (tmp_path / "binary.csv").write_bytes(b"\xff\xfe\x00\x81" * 64)
    args = ["run", "--trace", str(tmp_path / name), "--format", "tiresias", "--cluster", "2x4"]
    result = CliRunner().invoke(main, [*args, "--policy", "edl", "--out", str(tmp_path / "o")])
    assert result.exit_code == 1 and result.exception is not None
    assert isinstance(result.exception, SystemExit), result.exception  # no traceback
    assert result.output.startswith("Error: ") and said in result.output
    assert len(result.output.strip().splitlines()) == 1


def test_a_byte_order_mark_is_not_part_of_the_first_column(tmp_path: Path) -> None:
    marked = tmp_path / "marked.csv"
    marked.write_bytes(b"\xef\xbb\xbf" + (DATA / "60_job.csv").read_bytes())
    args = ["run", "--trace", str(marked), "--format", "tiresias", "--cluster", "2x4"]
    args += ["--policy", "fifo-gang", "--no-plots", "--out", str(tmp_path / "o")]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output


def test_a_pollux_workload_without_its_profiles_points_at_the_option(tmp_path: Path) -> None:
    workload = tmp_path / "workload.csv"
    workload.write_text("name,time,application,num_replicas,batch_size\nj,0,cifar10,1,128\n")
    args = ["run", "--trace", str(workload), "--format", "pollux", "--cluster", "2x4"]
    result = CliRunner().invoke(main, [*args, "--policy", "edl", "--out", str(tmp_path / "o")])
    assert result.exit_code == 1
    assert "no profile for application 'cifar10'" in result.output
    assert "point --profiles at" in result.output


def _has_colour(png: Path, rgb: tuple[float, float, float]) -> bool:
    """Whether a line of that colour crosses the plot (more than its legend's sample)."""
    import matplotlib.image

    pixels = matplotlib.image.imread(str(png))[:, :, :3]
    return bool(((abs(pixels - rgb) < 0.1).all(axis=2)).sum() > 500)


def test_plots_say_what_ran_and_show_every_line_where_two_are_equal(tmp_path: Path) -> None:
    from matplotlib import colors

    from simulations.plotting import plot_jct_cdf, plot_utilization

    jobs = [SimJob("a", 0, 4, 100, 4, 4), SimJob("b", 0, 4, 50, 4, 4)]
    run = simulate(jobs, ClusterSpec(1, 4), preset("fifo-gang"), NO_COSTS)
    same = {"first": run, "second": run}  # equal lines: the first must not be hidden
    for plot in (plot_utilization, plot_jct_cdf):
        png = tmp_path / f"{plot.__name__}.png"
        plot(same, png, "trace.csv (tiresias), 2 jobs on 1x4 (4 GPUs), rigid")
        for colour in ("C0", "C1"):
            assert _has_colour(png, colors.to_rgb(colour)), (plot.__name__, colour)
    title = run_title(
        "traces/workloads-2.0/workload-7.csv", "pollux", 320, ClusterSpec(16, 4), "elastic"
    )
    assert title == "workloads-2.0/workload-7.csv (pollux), 320 jobs on 16x4 (64 GPUs), elastic"
    result = CliRunner().invoke(
        main,
        ["run", "--trace", str(DATA / "60_job.csv"), "--format", "tiresias", "--cluster", "2x4",
         "--policy", "fifo-gang", "--out", str(tmp_path / "o")],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert (tmp_path / "o" / "jct_cdf.png").stat().st_size > 0


# Golden: python -m simulations run --trace tests/simulations/data/60_job.csv
#   --format tiresias --cluster 2x4 --elasticity elastic --policy <each> (defaults otherwise).
GOLDEN = {
    "fifo-gang": (1556.5, 1415.5),
    "fifo-backfill": (715.3, 150.5),
    # Nothing is preempted on this sample, so 2D-LAS equals backfill: a replay of the Tiresias
    # simulator's dlas-gpu loop (GPU counting, no costs) gives 715.3 s and no preemption too.
    # (895.1, 651.5 while a waiting job could suspend a younger one of its own queue.)
    "tiresias": (715.3, 150.5),
    # Least attained service first within a priority (LAS queues, suspending equals ranked
    # below, never shrinking them); first come, first served and shrinking only gave 453.8
    # and 307.1, and shrinking equals too 456.6 and 293.7: on this small sample the median
    # falls and the average moves by 1%. Growing on evidence (a job takes its requested
    # size, then doubles while its measured speed-up pays) instead of straight to its
    # maximum on the prior's word: 450.2 and 268.0, from 458.1 and 293.7.
    "edl": (450.2, 268.0),
    "edl-fulfillment": (453.3, 288.8),
}


def test_golden_summaries_on_the_tiresias_sample(tmp_path: Path) -> None:
    out = tmp_path / "golden"
    args = ["run", "--trace", str(DATA / "60_job.csv"), "--format", "tiresias"]
    args += ["--cluster", "2x4", "--elasticity", "elastic", "--out", str(out), "--no-plots"]
    for name in GOLDEN:
        args += ["--policy", name]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "summary.json").read_text())
    got = {k: (round(v["avg_jct_s"], 1), round(v["median_jct_s"], 1)) for k, v in summary.items()}
    assert got == GOLDEN


@pytest.mark.slow
def test_philly_1d_fidelity_against_the_tiresias_simulator() -> None:
    """Only 2D-LAS here (thresholds, suspensions, resumes); benchmarks/sim_fidelity.py runs
    every check. Measured: 10,233.3 s against the reference 10,236.8 s (10,248.2 s before a
    waiting job stopped preempting running jobs of its own queue)."""
    from simulations.fidelity import REFERENCES, run_check

    (ref,) = [r for r in REFERENCES if (r.trace, r.our_policy) == ("philly_1d", "tiresias")]
    row = run_check(ref, TRACES)
    assert row.ok, f"{ref.our_policy}: {row.avg_jct_s:.1f} vs {ref.avg_jct_s}"
    assert row.avg_jct_s == pytest.approx(10233.3, abs=0.1)  # golden: explain any change
