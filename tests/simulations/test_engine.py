"""The event engine, on tiny scenarios whose JCTs are computed by hand.

Aspects:
- a job alone runs exactly its trace duration at its requested size;
- strict FIFO makes a later job wait for the one ahead;
- a completion and an arrival at one instant: the completion frees GPUs first;
- elastic EDL: a job grows into idle GPUs at start, is shrunk at the end of its minimum run to
  admit a newcomer, pays the resize pause, and the newcomer grows after its cool-down;
- Tiresias: a job crossing its queue threshold is suspended, and resumes after the short job;
  a job that waits never suspends a running job of its own queue (the Tiresias simulator's
  order), while FIFO inside a queue (the Pollux simulator's) lets the older one take over;
- tick-only planning (the Pollux simulator's rounds) and the restart pause;
- a job too large to ever start ends the run instead of looping forever;
- determinism: the same workload and seed give the same records.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from edl_scheduler.core import PRESETS, preset
from edl_scheduler.core.policy import with_overrides
from simulations.engine import SimConfig, simulate
from simulations.workload import LINEAR, ClusterSpec, Elasticity, Scaling, SimJob, with_elasticity
from tests.core.strategies import SHRINKING_EQUALS

NO_COSTS = SimConfig(tick_s=0.0, resize_pause_s=0.0, restart_pause_s=0.0, start_delay_s=0.0)


def job(
    name: str,
    submit: float,
    gpus: int,
    duration: float,
    lo: int | None = None,
    hi: int | None = None,
    scaling: Scaling = LINEAR,
) -> SimJob:
    return SimJob(name, submit, gpus, duration, lo or gpus, hi or gpus, scaling)


def ends(result: object) -> dict[str, float | None]:
    return {j.name: j.end for j in result.jobs}  # type: ignore[attr-defined]


#: Growth straight to the maximum on the prior's word (``Policy.ramp_s`` None), so that
#: the scenarios below can be computed by hand; growth on evidence has its own tests
#: (``tests/core/test_ramping.py``, ``test_wakes.py``).
TRUSTING_EQUALS = with_overrides(SHRINKING_EQUALS, ramp_s=None)
TRUSTING_EDL = with_overrides(preset("edl"), ramp_s=None)


def test_a_job_alone_takes_its_duration() -> None:
    result = simulate([job("a", 5, 2, 100)], ClusterSpec(1, 4), preset("fifo-gang"), NO_COSTS)
    (record,) = result.jobs
    assert record.jct == 100
    assert record.queueing_delay == 0
    assert record.gpu_seconds == pytest.approx(200)


def test_fifo_makes_a_later_job_wait() -> None:
    jobs = [job("a", 0, 4, 100), job("b", 10, 4, 50), job("c", 20, 1, 5)]
    result = simulate(jobs, ClusterSpec(1, 4), preset("fifo-gang"), NO_COSTS)
    # c fits nowhere while a runs, and strict FIFO keeps it behind b anyway.
    assert ends(result) == {"a": 100, "b": 150, "c": 155}
    backfill = simulate(jobs, ClusterSpec(1, 5), preset("fifo-backfill"), NO_COSTS)
    assert ends(backfill) == {"a": 100, "b": 150, "c": 25}


def test_completion_frees_gpus_before_an_arrival_at_the_same_instant() -> None:
    jobs = [job("a", 0, 4, 100), job("b", 100, 4, 10)]
    result = simulate(jobs, ClusterSpec(1, 4), preset("fifo-gang"), NO_COSTS)
    assert [r.queueing_delay for r in result.jobs] == [0, 0]
    assert ends(result) == {"a": 100, "b": 110}


def test_elastic_edl_grows_shrinks_and_pays_pauses() -> None:
    # a and b: 1000 s at 2 GPUs, elastic in [1, 4], linear scaling; one node of 4 GPUs;
    # ``edl`` shrinking equals (``edl`` itself would suspend a whole, later).
    jobs = [job("a", 0, 2, 1000, 1, 4), job("b", 100, 2, 1000, 1, 4)]
    config = SimConfig(tick_s=60.0, resize_pause_s=10.0, restart_pause_s=30.0)
    result = simulate(jobs, ClusterSpec(1, 4), TRUSTING_EQUALS, config)
    a, b = result.jobs
    # a starts at 4 workers (twice its speed). b arrives at 100 and waits for a's minimum
    # run (300 s); then a gives one worker: 600 s of work done, 400 left at 1.5x after a
    # 10 s pause: ends at 310 + 400 / 1.5.
    assert a.end == pytest.approx(310 + 400 / 1.5)
    assert (a.resizes, b.first_start) == (1, 300)
    # b runs 1 worker (0.5x) from 300; a leaves at 576.7 but b cools down until 600, then
    # grows to 4 (2x) after a 10 s pause: 150 done, 850 left, ends at 610 + 425.
    assert b.end == pytest.approx(1035)
    assert b.resizes == 1


def test_an_equal_is_shrunk_the_moment_it_has_run_the_minimum_that_allows_it() -> None:
    # a: 5000 s at 1 GPU, elastic in [1, 8], linear; b: 4 GPUs for 1000 s, rigid; one node
    # of 8. a grows to 8 at once and leaves the first attained-service queue at 406 s, so
    # b (arrived at 100) ranks above it from then on; but ``edl`` shrinks an equal only once
    # it has run ``suspension_min_run_s`` (520 s), and nothing else happens then: the plan
    # at that instant is a wake-up of its own (without it b waited for the next event).
    edl = TRUSTING_EDL
    assert edl.suspension_min_run_s == 520.0
    jobs = [job("a", 0, 1, 5000, 1, 8), job("b", 100, 4, 1000, 4, 4)]
    config = SimConfig(tick_s=0.0, resize_pause_s=10.0, restart_pause_s=30.0)
    a, b = simulate(jobs, ClusterSpec(1, 8), edl, config).jobs
    assert b.first_start == 520.0 and b.end == pytest.approx(1520.0)
    # a: 8 x 520 s done, then 840 s of work at 4 workers after a 10 s pause.
    assert a.end == pytest.approx(520 + 10 + (5000 - 8 * 520) / 4)


def test_tiresias_suspends_a_job_that_crosses_its_threshold() -> None:
    jobs = [job("long", 0, 1, 10_000), job("short", 1000, 1, 100)]
    result = simulate(jobs, ClusterSpec(1, 1), preset("tiresias"), NO_COSTS)
    long, short = result.jobs
    # long reaches 3,250 GPU-seconds at t=3250 and drops a queue; short runs 3250-3350.
    assert (short.first_start, short.end) == (3250, 3350)
    assert long.end == pytest.approx(10_100)
    assert long.preemptions == 1
    assert long.gpu_seconds == pytest.approx(10_000)


def test_tiresias_never_preempts_a_job_of_the_same_queue() -> None:
    jobs = [job("a", 0, 1, 1000), job("b", 50, 1, 300)]
    two_queues = with_overrides(preset("tiresias"), queue_thresholds_gpu_s=(100.0,))
    # a drops to queue 1 at t=100 and b (queue 0) suspends it; b drops too at t=200. Both are
    # in queue 1 then: b runs, a waits, and a job that waits never suspends one of its own
    # queue, so b finishes (200 s left) before a resumes (900 s left).
    result = simulate(jobs, ClusterSpec(1, 1), two_queues, NO_COSTS)
    assert ends(result) == {"a": 1300, "b": 400}
    assert [r.preemptions for r in result.jobs] == [1, 0]
    # In plain FIFO inside a queue (the Pollux simulator's Tiresias), the older a takes the
    # GPU back from b at t=200 and b waits for a's 900 s.
    fifo_inside = with_overrides(two_queues, las_running_first=False)
    assert ends(simulate(jobs, ClusterSpec(1, 1), fifo_inside, NO_COSTS)) == {"a": 1100, "b": 1300}


def test_ticks_only_and_the_restart_pause() -> None:
    jobs = [job("long", 0, 1, 10_000), job("short", 1000, 1, 100)]
    config = SimConfig(tick_s=60.0, plan_on_events=False, restart_pause_s=30.0)
    result = simulate(jobs, ClusterSpec(1, 1), preset("tiresias"), config)
    long, short = result.jobs
    # The threshold falls at 3250; the next round is 3300. short ends at 3400, long restarts
    # at the 3420 round, pays 30 s and has 6,700 s left.
    assert (short.first_start, short.end) == (3300, 3400)
    assert long.end == pytest.approx(3420 + 30 + 6700)


def test_a_job_that_never_fits_ends_the_run() -> None:
    jobs = [job("big", 0, 8, 10), job("small", 1, 1, 10)]
    result = simulate(jobs, ClusterSpec(1, 4), preset("fifo-backfill"), NO_COSTS)
    assert ends(result) == {"big": None, "small": 11}
    assert result.jobs[0].jct is None


def test_amdahl_scaling_slows_extra_workers() -> None:
    # Alone on 8 GPUs an elastic job with serial fraction 0.5 runs at 8 workers:
    # speedup(8) / speedup(4) = (1 / (0.5 + 0.5 / 8)) / (1 / (0.5 + 0.5 / 4)) = 0.625 / 0.5625.
    amdahl = Scaling(0.5)
    one = [job("a", 0, 4, 900, 2, 8, amdahl)]
    result = simulate(one, ClusterSpec(2, 4), TRUSTING_EDL, NO_COSTS)
    assert result.jobs[0].end == pytest.approx(900 * 0.5625 / 0.625)


def test_same_inputs_same_result() -> None:
    jobs = [job(f"j{i}", i * 37 % 500, 1 + i % 4, 300 + 97 * i % 700, 1, 8) for i in range(40)]
    runs = [simulate(jobs, ClusterSpec(2, 4), preset("edl"), SimConfig()) for _ in range(2)]
    assert runs[0].jobs == runs[1].jobs
    assert runs[0].timeline == runs[1].timeline


@pytest.mark.parametrize("policy", sorted(PRESETS))
def test_pruning_the_snapshot_changes_nothing(policy: str) -> None:
    from simulations.traces import load_tiresias

    workload = load_tiresias(Path(__file__).parent / "data" / "60_job.csv")
    cluster = ClusterSpec(2, 4)
    jobs = with_elasticity(workload.jobs, Elasticity.ELASTIC, cluster.gpus)
    full = simulate(jobs, cluster, preset(policy), SimConfig(prune=False))
    pruned = simulate(jobs, cluster, preset(policy), SimConfig(prune=True))
    assert pruned.jobs == full.jobs
    assert pruned.timeline == full.timeline
