"""Running jobs left out of the planner's snapshot (``simulations.leaving_out``), their capacity
handed over as ``IncrementalPlanner.plan(..., occupied)``.

Aspects:
- the engine with hiding gives the records, timeline and plan count of the engine without
  it, under every preset and the LAS variants (low thresholds with demotions, a
  starvation limit, a least-attained ranking), ticks and event-driven; on the rigid
  presets it does leave jobs out;
- on every snapshot those simulations plan on, the plan of the jobs ``leave_out`` keeps, with
  ``occupied``, makes the full plan's changes (same jobs, actions, nodes, removed replicas,
  beneficiaries) and reservations;
- a running job ranked below a job short of its size, or above its size, is kept;
- ``occupied`` of the wrong length or negative is refused, naming the argument.
Seen to fail with ``occupied`` not passed, and with the first running job ranked below the
best short job left out too.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from edl_scheduler.core import Plan, Policy, Resources, Snapshot, plan, preset
from edl_scheduler.core.incremental import IncrementalPlanner
from edl_scheduler.core.incremental.unchangeable import applies
from edl_scheduler.core.ordering import sort_key
from simulations import engine as engine_module
from simulations.engine import Engine, simulate
from simulations.leaving_out import leave_out
from tests.core.builders import job, node, snapshot
from tests.simulations.recording import recorded
from tests.simulations.test_settled import CLUSTER, CONFIGS, POLICIES, _jobs

TIRESIAS = preset("tiresias")


def _changes(result: Plan) -> list[tuple[object, ...]]:
    return [
        (d.job, d.action, d.workers.add_nodes, d.workers.remove, d.for_job) for d in result.changes
    ]


@pytest.mark.parametrize("config", sorted(CONFIGS))
@pytest.mark.parametrize("name", sorted(POLICIES))
def test_leaving_out_changes_no_result(
    name: str, config: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    policy, cfg = POLICIES[name], CONFIGS[config]
    left_out = []
    real = engine_module.leave_out

    def counting(*args: object, **kw: object) -> object:
        found = real(*args, **kw)  # type: ignore[arg-type]
        left_out.append(len(args[0]) - len(found[0]))  # type: ignore[arg-type]
        return found

    monkeypatch.setattr(engine_module, "leave_out", counting)
    jobs = _jobs(policy)
    engine = Engine(jobs, CLUSTER, policy, replace(cfg, hide=True))
    fast = engine.run()
    reference = simulate(jobs, CLUSTER, policy, cfg)
    assert fast.jobs == reference.jobs
    assert fast.timeline == reference.timeline
    assert fast.plans == reference.plans
    # Every rigid preset's keys are kept (no starvation limit): there, jobs are left out.
    assert engine.leaves_out == (applies(policy) and name != "starving")
    if engine.leaves_out:
        assert sum(left_out) > 0
    else:
        assert not left_out


def _recorded(policy: Policy, monkeypatch: pytest.MonkeyPatch) -> list[tuple[Snapshot, float]]:
    unpruned = replace(CONFIGS["events"], prune=False)
    return recorded(monkeypatch, lambda: simulate(_jobs(policy), CLUSTER, policy, unpruned))


@pytest.mark.parametrize("name", sorted(n for n, p in POLICIES.items() if applies(p)))
def test_the_plan_without_the_left_out_jobs_is_the_full_plan(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    policy = POLICIES[name]
    node_of = {f"node-{i}": i for i in range(CLUSTER.nodes)}
    compared = 0
    planner = IncrementalPlanner(policy)
    for snap, now in _recorded(policy, monkeypatch):
        key = sort_key(policy, now)
        live = [len(j.replicas) for j in snap.jobs]
        keys = [key(j) for j in snap.jobs]
        kept, occupied = leave_out(snap.jobs, live, keys, policy, node_of)
        if occupied is None:
            continue
        # The engine's path: what every live worker takes, less what the shown ones take.
        used = [[0, 0, 0] for _ in node_of]
        for j in snap.jobs:
            res = j.worker.resources
            for r in j.replicas:
                used[node_of[r.node]][0] += res.gpu
                used[node_of[r.node]][1] += res.cpu_milli
                used[node_of[r.node]][2] += res.memory_bytes
        assert leave_out(snap.jobs, live, keys, policy, node_of, used) == (kept, occupied)
        full = plan(snap, policy, now)
        part = planner.plan(Snapshot(snap.nodes, tuple(kept), snap.reservations), now, occupied)
        assert _changes(part) == _changes(full), now
        assert part.reservations == full.reservations, now
        compared += 1
    assert compared > 0  # jobs were left out on some of them


def test_only_jobs_at_their_size_above_every_short_job_are_left_out() -> None:
    snap = snapshot(
        [node("n0").gpus(4), node("n1").gpus(4)],
        [
            job("old").min(2).max(2).running(("n0", 2)).submitted(0),
            job("wait").min(4).max(4).submitted(5),
            # Demoted to queue 1: ranked below "wait", which may suspend it.
            job("long").min(2).max(2).attained(4000).running(("n1", 2)).submitted(1),
        ],
    )
    key = sort_key(TIRESIAS, 10.0)
    live = [2, 0, 2]
    node_of = {"n0": 0, "n1": 1}
    kept, occupied = leave_out(snap.jobs, live, [key(j) for j in snap.jobs], TIRESIAS, node_of)
    assert [j.name for j in kept] == ["wait", "long"]
    res = snap.jobs[0].worker.resources
    assert occupied == (res + res, Resources())  # old's two workers, on n0
    # Nothing below its size: nothing is left out.
    alone = snap.jobs[:1]
    assert leave_out(alone, [2], [key(alone[0])], TIRESIAS, node_of) == (list(alone), None)
    # Above its size (as the planner would shrink it back), it is kept too.
    over = (job("over").min(1).max(1).running(("n0", 2)).build(), snap.jobs[1])
    kept, occupied = leave_out(over, [2, 0], [key(j) for j in over], TIRESIAS, node_of)
    assert (kept, occupied) == (list(over), None)


def test_occupied_must_match_the_nodes() -> None:
    snap = snapshot([node("n0").gpus(4)], [job("a").min(1).max(1)])
    planner = IncrementalPlanner(TIRESIAS)
    with pytest.raises(ValueError, match="occupied: 2 entries for 1 nodes"):
        planner.plan(snap, 0.0, (Resources(), Resources()))
    with pytest.raises(ValueError, match="none negative"):
        planner.plan(snap, 0.0, (Resources(gpu=-1),))
    # What it says is taken is not free: "a" cannot start on the one GPU left.
    assert not planner.plan(snap, 0.0, (Resources(gpu=4),)).changes
    assert planner.plan(snap, 0.0, (Resources(gpu=3),)).changes
