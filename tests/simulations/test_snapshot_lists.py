"""The engine's kept snapshot lists (``simulations.snapshot_lists``) against the lists built afresh
from the active jobs (``showing.collect``).

Aspects:
- at every plan of the ``60_job.csv`` simulations (every policy whose ranking reads neither
  the clock nor attained GPU-time, rigid and elastic; ticks and event-driven), and of
  elastic runs of profiled jobs whose measured rate changes by epoch, the kept Jobs, live
  workers and rank keys equal the fresh ones, in arrival order, and the kept tally equals
  ``pruning.tally``'s pass over them; the runs give the records, timeline and plans of the
  engine without them (``incremental=False``);
- under an elastic policy every snapshot shows every active job, where pruning would have
  left some out (the runs above show that the plans are the same);
- a job that arrives, is resized and completes enters, changes and leaves the lists; one
  touched and completed before the next listing is not listed again.
Seen to fail with the engine's ``touch`` left out where a plan resizes a job.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from edl_scheduler.core import (
    Job,
    Plan,
    Policy,
    Replica,
    Resources,
    Role,
    RoleSpec,
    Snapshot,
    preset,
)
from simulations.engine import Engine, SimConfig, simulate
from simulations.profiles import ProfileSpeed, load_application
from simulations.pruning import Tally, shown, tally
from simulations.runs import Run
from simulations.showing import Key, collect
from simulations.snapshot_lists import SnapshotLists
from simulations.traces import default_traces
from simulations.workload import ClusterSpec, SimJob
from tests.simulations.test_settled import CLUSTER, CONFIGS, POLICIES, _jobs


def _checked_run(jobs: list[SimJob], cluster: ClusterSpec, policy: Policy, cfg: SimConfig) -> int:
    """Runs ``jobs`` with every listing compared to ``collect``'s; returns the plans
    compared, after checking the run against the engine without kept lists."""
    engine = Engine(jobs, cluster, policy, cfg)
    listed = engine.lists
    assert listed is not None
    real, real_tally = listed.listing, listed.tally
    plans = 0

    def checked(now: float, rebuild: object) -> tuple[list[Job], list[int], list[Key]]:
        nonlocal plans
        got = real(now, rebuild)  # type: ignore[arg-type]
        fresh = collect(
            engine.active.values(),
            now,
            rebuild,  # type: ignore[arg-type]
            queue_only=False,
            fresh=False,
            keyed=True,
        )
        assert got == (fresh.jobs, fresh.live, fresh.keys)
        assert all(a is b for a, b in zip(got[0], fresh.jobs, strict=True))
        plans += 1
        return got

    def checked_tally() -> Tally:
        got = real_tally()
        want = tally(listed.jobs, listed.live, shrink=True, elastic=listed.elastic)
        assert got.preemptible == want.preemptible
        if want.preemptible:  # (else every job is shown: the rest is not read)
            assert (got.surplus, got.largest) == (want.surplus, want.largest)
            assert got.waiting() == want.waiting()
        return got

    listed.listing = checked  # type: ignore[method-assign]
    listed.tally = checked_tally  # type: ignore[method-assign]
    fast = engine.run()
    reference = simulate(jobs, cluster, policy, replace(cfg, incremental=False))
    assert fast.jobs == reference.jobs and fast.timeline == reference.timeline
    assert fast.plans == reference.plans
    return plans


def _uses_lists(policy: Policy) -> bool:
    return Engine([], CLUSTER, policy, CONFIGS["events"]).lists is not None


@pytest.mark.parametrize("config", sorted(CONFIGS))
@pytest.mark.parametrize("name", sorted(n for n, p in POLICIES.items() if _uses_lists(p)))
def test_the_kept_lists_equal_fresh_ones_at_every_plan(name: str, config: str) -> None:
    policy = POLICIES[name]
    assert _checked_run(_jobs(policy), CLUSTER, policy, CONFIGS[config]) > 0


def test_elastic_snapshots_show_every_active_job(monkeypatch: pytest.MonkeyPatch) -> None:
    """Under an elastic policy the planner sees the waiting jobs pruning would leave out
    (``Engine.shows_all``), and the run is the pruned one's (``_checked_run``)."""
    policy, left_out, plans = POLICIES["edl-fifo"], 0, 0
    engine = Engine(_jobs(policy), CLUSTER, policy, CONFIGS["events"])
    assert engine.shows_all

    planner = engine.planner
    assert planner is not None
    real = planner.plan

    def planned(snapshot: Snapshot, now: float, *args: Any) -> Plan:
        nonlocal left_out, plans
        assert [j.name for j in snapshot.jobs] == list(engine.active)
        free = CLUSTER.gpus - engine.allocated
        live = [len(engine.active[j.name].replicas) for j in snapshot.jobs]
        at = shown(list(snapshot.jobs), policy, now, free, snapshot.reservations, live=live)
        left_out += len(snapshot.jobs) - len(at)
        plans += 1
        return real(snapshot, now, *args)

    monkeypatch.setattr(planner, "plan", planned)
    engine.run()
    assert plans > 0 and left_out > 0  # (pruning would have left some out)
    assert not Engine(_jobs(policy), CLUSTER, preset("fifo-gang"), CONFIGS["events"]).shows_all


def test_the_policies_that_read_time_list_afresh() -> None:
    assert _uses_lists(POLICIES["edl-fifo"]) and _uses_lists(preset("fifo-gang"))
    assert not _uses_lists(POLICIES["tiresias"]) and not _uses_lists(POLICIES["least-attained"])
    assert not _uses_lists(preset("edl"))  # least attained service first: keys move
    assert Engine([], CLUSTER, POLICIES["edl-fifo"], SimConfig(incremental=False)).lists is None


def test_profiled_jobs_measured_again_are_listed_again() -> None:
    bert = load_application(default_traces() / "pollux" / "traces", "bert")
    jobs = [
        SimJob(f"b{i}", 400.0 * i, 2, 0.0, 1, 4, profile=ProfileSpeed(bert, 48)) for i in range(5)
    ]
    rounds = SimConfig(tick_s=60.0, plan_on_events=False, resize_pause_s=30.0)
    assert _checked_run(jobs, ClusterSpec(2, 4), POLICIES["edl-fifo"], rounds) > 0


def _run(index: int) -> Run:
    job = _jobs(POLICIES["edl-fifo"])[index]
    return Run(job, index, job.work)


def _rebuild(run: Run, now: float) -> Job:
    run.rank_key = (float(run.index), run.job.name)
    worker = RoleSpec(1, 2, Resources(gpu=1))
    replicas = tuple(run.replicas)
    run.cached = Job(name=run.job.name, worker=worker, submit_time=now, replicas=replicas)
    return run.cached


def test_jobs_enter_change_and_leave_the_lists() -> None:
    listed = SnapshotLists(elastic=True)
    runs = [_run(i) for i in range(3)]
    for run in runs:
        listed.arrive(run)
    jobs, live, keys = listed.listing(0.0, _rebuild)
    assert [j.name for j in jobs] == [r.job.name for r in runs] and live == [0, 0, 0]
    runs[1].replicas = [Replica("w0", Role.WORKER, "node-0")]
    runs[1].cached = None
    listed.touch(runs[1])
    jobs, live, keys = listed.listing(1.0, _rebuild)
    assert live == [0, 1, 0] and jobs[1].submit_time == 1.0 and jobs[0].submit_time == 0.0
    kept = listed.tally()
    assert (kept.waiting(), kept.surplus, kept.largest) == ([0, 2], 0, 1)  # (at its minimum)
    listed.touch(runs[1])
    listed.finish(runs[1])  # completed before the next listing
    jobs, live, keys = listed.listing(2.0, _rebuild)
    assert [j.name for j in jobs] == [runs[0].job.name, runs[2].job.name]
    assert listed.tally().waiting() == [0, 1]
    assert keys == [(0.0, runs[0].job.name), (2.0, runs[2].job.name)]
    with pytest.raises(AssertionError, match="not listed"):
        listed.finish(runs[1])
