"""Plans the engine leaves out because they provably change nothing (``pruning.settled``).

Aspects:
- a waiting job that can start by suspending a running job ranked below it is seen (the
  plan there starts it), also when a job ranked above it would suspend that job first;
- a job's own workers are not in its pool, and running jobs ranked above it are not either;
- the rule answers False where a premise fails: growth or shrinking (elastic ``edl``),
  priorities, a job leaving by its spec, a job with parameter servers (one missing is
  restored with no GPU);
- on every snapshot a simulation of ``60_job.csv`` on 8 GPUs plans on (every rigid preset,
  Tiresias with low queue thresholds and with a starvation limit, a rigid least-attained
  ranking, ticks and event-driven),
  a snapshot the rule calls settled gets a plan that changes nothing, and the rule calls
  many of them settled;
- the engine that leaves those plans out gives the records and timeline of the engine that
  makes them, under every preset and those policies (the elastic ones never leave one out),
  also where it asks about the arrivals alone after a settled instant, and where a running
  job crossed a queue threshold with no wake-up of its own since that instant;
- a reservation still held for a job below its size keeps the plan (it would carry the
  hold); without one the plan is left out and no reservation remains. Seen to fail with
  the engine's hold check removed.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from edl_scheduler.core import (
    PRESETS,
    Ordering,
    Policy,
    Preemption,
    Reservation,
    Role,
    Snapshot,
    plan,
    preset,
)
from edl_scheduler.core.policy import with_overrides
from simulations.config import EVENT_DRIVEN
from simulations.engine import Engine, SimConfig, simulate
from simulations.pruning import settled
from simulations.runs import Run
from simulations.synthetic import SyntheticSpec, generate
from simulations.traces import load_tiresias
from simulations.workload import (
    ClusterSpec,
    Elasticity,
    ScalingRule,
    SimJob,
    shape,
    with_elasticity,
)
from tests.core.builders import job, node, snapshot
from tests.simulations.recording import recorded

DATA = Path(__file__).parent / "data" / "60_job.csv"
CLUSTER = ClusterSpec(2, 4)
TIRESIAS = preset("tiresias")
LOW = with_overrides(TIRESIAS, queue_thresholds_gpu_s=(200.0, 1500.0))
STARVING = with_overrides(LOW, starvation_limit_s=600.0)
#: Rigid, ranked by attained GPU-time itself: rank keys change as running jobs run.
LEAST = with_overrides(TIRESIAS, ordering=Ordering.LEAST_ATTAINED, queue_thresholds_gpu_s=())
#: Elastic with priorities, first come first served, shrinking only: rank keys fixed.
EDL_FIFO = with_overrides(
    preset("edl"),
    ordering=Ordering.FIFO,
    queue_thresholds_gpu_s=(),
    las_running_first=False,
    preemption=Preemption.SHRINK,
    suspend_equal_priority=False,
)
POLICIES: dict[str, Policy] = {
    **PRESETS,
    "edl-fifo": EDL_FIFO,
    "low-thresholds": LOW,
    "starving": STARVING,
    "least-attained": LEAST,
}
# (restart 30 s: the trace on which each rule is seen to fire at least three times)
CONFIGS = {"ticks": SimConfig(tick_s=300.0, restart_pause_s=30.0), "events": EVENT_DRIVEN}


def _jobs(policy: Policy) -> list[SimJob]:
    jobs = load_tiresias(DATA, CLUSTER).jobs
    if policy.elastic:
        return with_elasticity(jobs, Elasticity.ELASTIC, CLUSTER.gpus)
    return list(jobs)


def _free(snap: Snapshot) -> int:
    total = sum(n.allocatable.gpu for n in snap.nodes)
    return total - sum(len(j.replicas) for j in snap.jobs)


def test_a_job_that_can_suspend_a_lower_ranked_one_is_not_settled() -> None:
    # v (4 GPUs, queue 2) runs; w (1 GPU, queue 0) ranks above it and may suspend it.
    snap = snapshot(
        [node("n0").gpus(4)],
        [
            job("v").min(4).max(4).attained(9000).running(("n0", 4)),
            job("x").min(2).max(2).attained(8000).submitted(10),
            job("w").min(1).max(1).submitted(20),
        ],
    )
    assert not settled(snap.jobs, TIRESIAS, 100.0, 0)
    assert plan(snap, TIRESIAS, 100.0).changes


def test_jobs_ranked_above_or_the_job_itself_free_nothing_for_it() -> None:
    # r runs in queue 0 and ranks above "big", which needs 2 GPUs with 1 free: settled.
    above = snapshot(
        [node("n0").gpus(4)],
        [job("r").min(3).max(3).running(("n0", 3)), job("big").min(2).max(2).submitted(10)],
    )
    assert settled(above.jobs, TIRESIAS, 100.0, 1)
    assert not plan(above, TIRESIAS, 100.0).changes
    # The same with "big" ranked above r (r demoted to queue 1): it may suspend r.
    demoted = snapshot(
        [node("n0").gpus(4)],
        [
            job("r").min(3).max(3).attained(4000).running(("n0", 3)),
            job("big").min(2).max(2).submitted(10),
        ],
    )
    assert not settled(demoted.jobs, TIRESIAS, 100.0, 1)
    assert plan(demoted, TIRESIAS, 100.0).changes
    # A job below its size does not count its own workers: 2 of 4 run, 1 GPU is free.
    short = snapshot([node("n0").gpus(3)], [job("s").min(4).max(4).requested(4).running(("n0", 2))])
    assert settled(short.jobs, TIRESIAS, 100.0, 1)
    assert not plan(short, TIRESIAS, 100.0).changes


def test_where_a_premise_fails_nothing_is_settled() -> None:
    rigid = job("r").min(2).max(2).running(("n0", 2))
    backfill = preset("fifo-backfill")
    assert settled((rigid.build(),), backfill, 0.0, 2)  # nothing waits: settled
    # Growth (or shrinking) may move a running job although nothing waits.
    elastic = (job("r").min(1).max(4).requested(2).running(("n0", 2)).build(),)
    assert not settled(elastic, preset("edl"), 0.0, 2)
    assert not settled(elastic, preset("edl-fulfillment"), 0.0, 2)
    # Priorities, and a running job whose spec suspends it.
    assert not settled((rigid.build(),), with_overrides(backfill, use_priority=True), 0.0, 2)
    assert not settled((rigid.suspended().build(),), backfill, 0.0, 2)
    # A job with parameter servers, at its size, one server missing: the plan restores it.
    served = job("p").min(2).max(2).running(("n0", 2)).pservers(2, 2).build()
    assert not settled((served,), backfill, 0.0, 2)


def _recorded(
    policy: Policy, config: SimConfig, monkeypatch: pytest.MonkeyPatch
) -> list[tuple[Snapshot, float]]:
    """Every snapshot a simulation plans on when no plan is left out (``prune`` off)."""
    unpruned = replace(config, prune=False)
    return recorded(monkeypatch, lambda: simulate(_jobs(policy), CLUSTER, policy, unpruned))


@pytest.mark.parametrize("config", sorted(CONFIGS))
@pytest.mark.parametrize(
    "name",
    [
        "fifo-gang",
        "fifo-backfill",
        "tiresias",
        "tiresias-pollux",
        "low-thresholds",
        "starving",
        "least-attained",
    ],
)
def test_a_settled_snapshot_gets_a_plan_that_changes_nothing(
    name: str, config: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    policy = POLICIES[name]
    sequence = _recorded(policy, CONFIGS[config], monkeypatch)
    calls = 0
    for snap, now in sequence:
        if settled(snap.jobs, policy, now, _free(snap)):
            calls += 1
            assert not plan(snap, policy, now).changes, (name, now)
    assert calls > 2  # the rule does fire on this trace


@pytest.mark.parametrize("config", sorted(CONFIGS))
@pytest.mark.parametrize("name", sorted(POLICIES))
def test_leaving_out_settled_plans_changes_no_result(name: str, config: str) -> None:
    policy, cfg = POLICIES[name], CONFIGS[config]
    jobs = _jobs(policy)
    engine = Engine(jobs, CLUSTER, policy, cfg)
    fast = engine.run()
    reference = simulate(jobs, CLUSTER, policy, replace(cfg, prune=False))
    assert fast.jobs == reference.jobs
    assert fast.timeline == reference.timeline
    assert fast.plans + engine.skipped == reference.plans
    assert any(r.end is not None for r in fast.jobs)
    if not policy.elastic:
        assert fast.plans < reference.plans  # plans were left out


def test_a_hold_for_a_waiting_job_keeps_the_plan() -> None:
    # "big" waits for 4 GPUs while "r" runs on 3 of 4, ranked above it: settled. With room
    # held for "big" (a hold the planner carries while big is below its size), the plan is
    # made, and carries the hold; without it, the plan is left out and no hold remains.
    jobs = [SimJob("r", 0.0, 3, 1000.0, 3, 3), SimJob("big", 1.0, 4, 100.0, 4, 4)]
    cluster = ClusterSpec(1, 4)
    hold = Reservation("big", "node-0", Role.WORKER, 4, 600.0)
    for held in (False, True):
        engine = Engine(jobs, cluster, TIRESIAS, EVENT_DRIVEN)
        for index, sim_job in enumerate(jobs):
            engine.active[sim_job.name] = Run(sim_job, index, sim_job.work)
            engine._plan(sim_job.submit_time)
        assert engine.running.keys() == {"r"} and engine.plans == 1  # big's arrival: settled
        engine.reservations = (hold,) if held else ()
        engine._plan(2.0)
        assert engine.plans == 1 + held
        assert engine.reservations == ((hold,) if held else ())


def test_arrivals_after_a_settled_instant_see_keys_that_moved() -> None:
    # Ranked by attained GPU-time: r suspends x at 1 (x has 4 GPU-s, r none) and passes
    # x's 4 GPU-s at 2. d (1.5) and c (3) are too large to ever start: at 1.5 nothing can
    # (settled), at 3 x outranks r again and takes the GPUs back, although only c arrived.
    jobs = [
        SimJob("x", 0.0, 4, 100.0, 4, 4),
        SimJob("r", 1.0, 4, 100.0, 4, 4),
        SimJob("d", 1.5, 8, 100.0, 8, 8),
        SimJob("c", 3.0, 8, 100.0, 8, 8),
    ]
    cluster = ClusterSpec(1, 4)
    fast = simulate(jobs, cluster, LEAST, EVENT_DRIVEN)
    reference = simulate(jobs, cluster, LEAST, replace(EVENT_DRIVEN, prune=False))
    assert fast.jobs == reference.jobs
    preempted = {r.name: r.preemptions for r in reference.jobs}
    assert preempted["x"] == 1 and preempted["r"] >= 1  # x took its GPUs back at 3


def test_arrivals_after_a_settled_instant_see_a_queue_crossing() -> None:
    # r (4 GPUs) passes the 200 GPU-s threshold near 50 s after its start; the wake-up for
    # it lands a hair before the threshold in about half the float cases, and the crossing
    # then has no wake of its own. d (8 GPUs) never fits; when c arrives, r has been demoted
    # below it, and c must start by suspending r, although only c arrived since an instant
    # that was settled.
    differing = []
    for i in range(120):
        start = 0.1 + i * 0.0137
        jobs = [
            SimJob("r", start, 4, 100_000.0, 4, 4),
            SimJob("d", start + 10.0, 8, 100.0, 8, 8),
            SimJob("c", start + 200.0, 2, 100.0, 2, 2),
        ]
        fast = simulate(jobs, ClusterSpec(1, 4), LOW, EVENT_DRIVEN)
        reference = simulate(jobs, ClusterSpec(1, 4), LOW, replace(EVENT_DRIVEN, prune=False))
        if fast.jobs != reference.jobs:
            differing.append(start)
    assert not differing, differing[:5]


def test_arrivals_none_shown_see_a_queue_crossing_since_the_last_plan() -> None:
    # Under tiresias a wake-up lands a hair before a running job's 3,250 GPU-s threshold
    # (attained 3249.9999999999995), so the job stays in queue 0 at that plan and its
    # crossing gets no wake-up of its own. The next instant brings only an arrival that
    # cannot start; the crossed job may now be suspended for an older waiting one, so the
    # plan must be made there, not left out as "only arrivals that cannot start".
    cluster = ClusterSpec(4, 4)
    spec = SyntheticSpec(jobs=150, arrivals_per_hour=60.0, priority_mix=((0, 0.7), (1, 0.3)))
    generated = generate(spec, seed=1).jobs
    jobs = shape(
        generated,
        elasticity=Elasticity.RIGID,
        scaling=ScalingRule.parse("amdahl:0.1"),
        cluster=cluster,
        seed=1,
    )
    engine = Engine(jobs, cluster, TIRESIAS, SimConfig())
    fast = engine.run()
    reference = simulate(jobs, cluster, TIRESIAS, SimConfig(prune=False))
    assert engine.skipped > 0
    assert fast.jobs == reference.jobs
    assert fast.timeline == reference.timeline
