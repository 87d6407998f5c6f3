"""The Pollux workloads: measured profiles, statistical efficiency, and fidelity.

Aspects:
- an application's profile: initial and maximum batch, local batch range (yolov3 capped at
  8), completion progress, epochs read from progress;
- statistical efficiency: no gain beyond one at the initial batch, less than the scale above;
- step time: accumulation makes a local batch above the maximum dearer than the maximum;
- the engine integrates a job's progress epoch by epoch (rates change at epoch boundaries);
- elastic bounds (min 1, max <= 64, ncf 1); batch adaptation never slows a job;
- golden: workload-6 under ``tiresias-pollux`` (the Pollux simulator prints 3,469.69 s);
- ``edl-sim run`` on a Pollux workload takes its documented setup unless told otherwise
  (elastic jobs for elastic presets, the Pollux rounds), and its reports say so per row.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from edl_scheduler.core import preset
from simulations.cli import main
from simulations.config import POLLUX_ROUNDS
from simulations.engine import simulate
from simulations.profiles import ProfileSpeed, load_application
from simulations.reporting import summarize
from simulations.traces import default_traces, load_pollux, pollux_bounds
from simulations.workload import ClusterSpec, Elasticity, ScalingRule, SimJob, shape

POLLUX = default_traces() / "pollux"
PROFILES = POLLUX / "traces"
ROUNDS = POLLUX_ROUNDS


def test_application_profile() -> None:
    bert = load_application(PROFILES, "bert")
    assert (bert.init_batch, bert.max_batch, bert.min_local, bert.max_local) == (12, 384, 4, 12)
    assert bert.target == 14774.0  # progress after epoch 2 at batch 12
    assert bert.epoch(0.0) == 0
    assert bert.epoch(7387.0) == 1
    assert bert.horizon(100.0) == 7387.0
    assert load_application(PROFILES, "yolov3").max_local == 8
    assert pollux_bounds(bert) == (1, 64)
    assert pollux_bounds(load_application(PROFILES, "ncf")) == (1, 1)


def test_statistical_efficiency() -> None:
    cifar = load_application(PROFILES, "cifar10")
    assert cifar.gain(cifar.init_batch, 5) == pytest.approx(1.0)
    for batch in (256, 1024, 4096):
        gain = cifar.gain(batch, 5)
        assert 1.0 < gain < batch / cifar.init_batch


def test_accumulation_costs_more_than_the_largest_local_batch() -> None:
    bert = load_application(PROFILES, "bert")
    one = bert.step_time((1,), 12)
    assert bert.step_time((1,), 24) > one
    assert bert.step_time((1,), 24) < 2 * one  # one synchronization, not two


def test_engine_integrates_progress_epoch_by_epoch() -> None:
    bert = load_application(PROFILES, "bert")
    speed = ProfileSpeed(bert, 48)
    job = SimJob("b", 0.0, 4, 0.0, 4, 4, profile=speed)
    result = simulate([job], ClusterSpec(1, 4), preset("fifo-gang"), ROUNDS)
    curve = bert.curves[bert.init_batch].progress
    rates = [speed.rate((4,), p) for p in (0.0, curve[0])]
    expected = 30 + curve[0] / rates[0] + (curve[1] - curve[0]) / rates[1]
    assert rates[0] != rates[1]
    assert result.jobs[0].jct == pytest.approx(expected)


def test_batch_adaptation_never_slows_a_job() -> None:
    for name in ("cifar10", "bert", "deepspeech2"):
        app = load_application(PROFILES, name)
        fixed, adaptive = ProfileSpeed(app, app.init_batch * 4), ProfileSpeed(app, 0, True)
        for placement in ((1,), (4,), (4, 4)):
            assert adaptive.rate(placement, 0.0) >= fixed.rate(placement, 0.0) * 0.999


def test_workload_6_under_tiresias_pollux() -> None:
    cluster = ClusterSpec(16, 4)
    workload = load_pollux(POLLUX / "workloads" / "workload-6.csv", PROFILES, cluster)
    assert len(workload.jobs) == 160
    jobs = shape(
        workload.jobs,
        elasticity=Elasticity.RIGID,
        scaling=ScalingRule(0.0, 0.0),
        cluster=cluster,
        seed=0,
    )
    summary = summarize(simulate(jobs, cluster, preset("tiresias-pollux"), ROUNDS))
    assert summary["finished"] == 160
    assert abs(summary["avg_jct_s"] / 3469.69 - 1) <= 0.10
    assert summary["avg_jct_s"] == pytest.approx(3415.7, abs=0.1)  # golden: explain changes


def _cli(out: Path, *extra: str) -> dict[str, dict[str, object]]:
    args = ["run", "--trace", str(POLLUX / "workloads" / "workload-6.csv"), "--format", "pollux"]
    args += ["--limit", "40", "--no-plots", "--out", str(out), *extra]
    args += ["--policy", "edl", "--policy", "tiresias-pollux"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    assert "| edl | elastic | every " in result.output
    summary: dict[str, dict[str, object]] = json.loads((out / "summary.json").read_text())
    return summary


def test_run_command_takes_the_pollux_setup(tmp_path: Path) -> None:
    summary = _cli(tmp_path / "usual")
    pauses = "resize 30 s, restart 0 s, start 30 s"
    assert {k: summary["edl"][k] for k in ("elasticity", "planning", "pauses")} == {
        "elasticity": "elastic",
        "planning": "every 60 s",
        "pauses": pauses,
    }
    assert summary["tiresias-pollux"]["elasticity"] == "rigid"  # a rigid preset runs rigid
    cluster = ClusterSpec(16, 4)
    workload = load_pollux(POLLUX / "workloads" / "workload-6.csv", PROFILES, cluster)
    jobs = shape(
        workload.jobs[:40],
        elasticity=Elasticity.ELASTIC,
        scaling=ScalingRule(0.0, 0.0),
        cluster=cluster,
        seed=0,
    )
    direct = summarize(simulate(jobs, cluster, preset("edl"), POLLUX_ROUNDS))
    assert summary["edl"]["avg_jct_s"] == pytest.approx(direct["avg_jct_s"])
    # What the user sets wins, and the report says what ran.
    told = _cli(tmp_path / "told", "--tick", "120", "--plan-on-events", "--resize-pause", "5")
    assert told["edl"]["planning"] == "every 120 s and on events"
    assert told["edl"]["pauses"] == "resize 5 s, restart 0 s, start 30 s"
    config = replace(POLLUX_ROUNDS, tick_s=120.0, plan_on_events=True, resize_pause_s=5.0)
    again = summarize(simulate(jobs, cluster, preset("edl"), config))
    assert told["edl"]["avg_jct_s"] == pytest.approx(again["avg_jct_s"])
