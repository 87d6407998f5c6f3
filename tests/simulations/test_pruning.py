"""Which waiting jobs the engine may leave out of the planner's snapshot, and plans it may
leave out altogether.

Aspects:
- a job ranked above a hidden one may suspend a larger job and leave GPUs free for it: the
  rule counts every job the best-ranked waiting job could suspend (the case found on
  ``philly_1d`` under ``tiresias``), so the plan on the visible jobs is the full plan;
- the rule does hide jobs that cannot start, under a preemptive policy too;
- a job holding a reservation is always shown (the planner carries holds only for jobs it
  sees), and so is every job where a running job cannot be preempted;
- the engine leaves out plans where only jobs that cannot start arrived, with the same
  records as an engine that plans every time and shows every job.
"""

from __future__ import annotations

from pathlib import Path

from edl_scheduler.core import Reservation, Role, Snapshot, plan, preset
from simulations.engine import Engine, SimConfig, simulate
from simulations.pruning import visible
from simulations.traces import load_tiresias
from simulations.workload import ClusterSpec, Elasticity, with_elasticity
from tests.core.builders import job, node, snapshot

TIRESIAS = preset("tiresias")


def _changes(snap: Snapshot, now: float) -> list[tuple[str, str, tuple[str, ...], tuple[str, ...]]]:
    result = plan(snap, TIRESIAS, now)
    return [(d.job, d.action.value, d.workers.add_nodes, d.workers.remove) for d in result.changes]


def test_a_job_that_suspends_a_larger_one_leaves_room_for_a_hidden_job() -> None:
    # v (4 GPUs, queue 2) runs; x (2 GPUs, queue 2, submitted after v) ranks below v, with
    # nothing running below it; w (1 GPU, queue 0) suspends v and uses one of its GPUs.
    snap = snapshot(
        [node("n0").gpus(4)],
        [
            job("v").min(4).max(4).attained(9000).running(("n0", 4)),
            job("x").min(2).max(2).attained(8000).submitted(10),
            job("w").min(1).max(1).submitted(20),
        ],
    )
    full = _changes(snap, 100.0)
    assert ("x", "start", ("n0", "n0"), ()) in full
    assert ("v", "suspend", (), ("v-w0", "v-w1", "v-w2", "v-w3")) in full
    shown = visible(snap.jobs, TIRESIAS, 100.0, free_gpus=0)
    assert [j.name for j in shown] == ["v", "x", "w"]
    assert _changes(Snapshot(snap.nodes, tuple(shown), ()), 100.0) == full


def test_jobs_that_cannot_start_are_hidden_and_the_plan_is_the_same() -> None:
    # Everything running ranks above the waiting jobs (queue 0, earlier), so no GPU can be
    # freed for them: "big" needs more than is free; "small" fits in the free GPU.
    snap = snapshot(
        [node("n0").gpus(4)],
        [
            job("r").min(3).max(3).running(("n0", 3)),
            job("big").min(2).max(2).submitted(10),
            job("small").min(1).max(1).submitted(20),
        ],
    )
    shown = visible(snap.jobs, TIRESIAS, 100.0, free_gpus=1)
    assert [j.name for j in shown] == ["r", "small"]
    assert _changes(Snapshot(snap.nodes, tuple(shown), ()), 100.0) == _changes(snap, 100.0)


def test_jobs_holding_reservations_and_unpreemptible_neighbours_are_shown() -> None:
    jobs = snapshot(
        [node("n0").gpus(4)],
        [job("r").min(4).max(4).running(("n0", 4)), job("held").min(2).max(2).submitted(10)],
    ).jobs
    assert [j.name for j in visible(jobs, preset("fifo-backfill"), 0.0, 0)] == ["r"]
    hold = (Reservation("held", "n0", Role.WORKER, 2, 500.0),)
    shown = visible(jobs, preset("fifo-backfill"), 0.0, 0, hold)
    assert [j.name for j in shown] == ["r", "held"]
    rigid = snapshot(
        [node("n0").gpus(4)],
        [
            job("r").min(4).max(4).not_preemptible().running(("n0", 4)),
            job("held").min(2).max(2).submitted(10),
        ],
    ).jobs
    assert len(visible(rigid, TIRESIAS, 0.0, 0)) == 2


def test_plans_where_only_unstartable_jobs_arrived_are_left_out() -> None:
    workload = load_tiresias(Path(__file__).parent / "data" / "60_job.csv")
    cluster = ClusterSpec(2, 4)
    jobs = with_elasticity(workload.jobs, Elasticity.RIGID, cluster.gpus)
    for name in ("fifo-gang", "tiresias"):
        engine = Engine(jobs, cluster, preset(name), SimConfig())
        pruned = engine.run()
        full = simulate(jobs, cluster, preset(name), SimConfig(prune=False))
        assert pruned.jobs == full.jobs
        assert pruned.timeline == full.timeline
        if name == "fifo-gang":
            assert engine.skipped > 0  # arrivals behind a blocked queue need no plan
        assert pruned.plans + engine.skipped == full.plans
