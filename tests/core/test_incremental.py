"""``IncrementalPlanner`` (``core/incremental``) against ``plan()``, its reference.

Aspects:
- on generated sequences (a snapshot, then each plan applied and an event: arrivals,
  completions, failures, time passing; most Job objects repeat from one cycle to the next),
  under every preset, one planner carried through the sequence returns exactly the changes
  of ``plan()`` and its reservations at every cycle;
- on recorded snapshot sequences (a simulator's plans) under every preset, and under a LAS
  policy with a starvation limit (a waiting job's rank then depends on ``now``), in recorded
  and in shuffled order (many jobs leave and arrive between two plans, so a kept ranking
  takes many new jobs at once), the same; and the state the planner keeps (the ranking, the
  replicas' use per node, its reference walk) equals, after every plan, what it would
  derive from scratch;
- the planner forgets everything when the nodes change (a job's replicas' node indices
  depend on them);
- an invalid job is set aside as ``plan()`` sets it aside, also after valid cycles, and a
  job that was valid stays valid only as the same object; a new job named like a held one
  shown now is caught, one named like a held one that left is not.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edl_scheduler.core import PRESETS, Plan, Policy, Reason, Snapshot, apply_plan, plan, preset
from edl_scheduler.core.incremental import IncrementalPlanner
from edl_scheduler.core.incremental.memo import PlanMemo
from edl_scheduler.core.ordering import key_varies, sort_key
from edl_scheduler.core.policy import with_overrides
from simulations.engine import SimConfig, simulate
from simulations.traces import load_tiresias
from simulations.workload import ClusterSpec, Elasticity, with_elasticity
from tests.core.builders import job, node, snapshot
from tests.core.strategies import SHRINKING_EQUALS, apply_event, scenarios
from tests.simulations.recording import recorded

DATA = Path(__file__).parents[1] / "simulations" / "data" / "60_job.csv"


#: Tiresias where a job waiting 10 minutes returns to the first queue: a waiting job's rank
#: then depends on ``now``, so the memo may not keep its rank key.
STARVING = with_overrides(
    preset("tiresias"), queue_thresholds_gpu_s=(200.0, 1500.0), starvation_limit_s=600.0
)


#: ``edl`` without growth on evidence (``Policy.ramp_s`` None): growth trusts the model at
#: any size (the preset's growth reads each job's measurements and requested size).
TRUSTING = with_overrides(preset("edl"), name="edl-trusting", ramp_s=None)
VARIANTS = {"starving": STARVING, "edl-trusting": TRUSTING, SHRINKING_EQUALS.name: SHRINKING_EQUALS}


def _policy(name: str) -> Policy:
    return VARIANTS[name] if name in VARIANTS else preset(name)


def _recorded(policy_name: str, monkeypatch: pytest.MonkeyPatch) -> list[tuple[Snapshot, float]]:
    """The snapshots a simulation of ``60_job.csv`` on 8 GPUs plans on (queues form)."""
    cluster = ClusterSpec(2, 4)
    jobs = load_tiresias(DATA, cluster).jobs
    policy = _policy(policy_name)
    if policy.elastic:
        jobs = with_elasticity(jobs, Elasticity.ELASTIC, cluster.gpus)
    return recorded(monkeypatch, lambda: simulate(jobs, cluster, policy, SimConfig(tick_s=300.0)))


def _same(got: Plan, full: Plan) -> bool:
    """The incremental plan is the full plan's changes, in order, with its reservations."""
    return got.decisions == full.changes and got.reservations == full.reservations


@pytest.mark.parametrize("policy_name", [*sorted(PRESETS), "edl-trusting", SHRINKING_EQUALS.name])
@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_generated_sequences_plan_as_plan_does(policy_name: str, data: st.DataObject) -> None:
    policy = _policy(policy_name)
    scenario = data.draw(scenarios(rigid=not policy.elastic, max_events=8), label="scenario")
    planner = IncrementalPlanner(policy)
    snap, now = scenario.snapshot, scenario.now
    for serial, event in enumerate((None, *scenario.events)):
        if event is not None:
            snap, now = apply_event(snap, now, event, serial)
        full = plan(snap, policy, now)
        got = planner.plan(snap, now)
        assert _same(got, full), (serial, full.describe())
        snap = apply_plan(snap, full)


@pytest.mark.parametrize(
    "policy_name", [*sorted(PRESETS), "starving", "edl-trusting", SHRINKING_EQUALS.name]
)
def test_recorded_sequences_plan_as_plan_does(
    policy_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    sequence = _recorded(policy_name, monkeypatch)
    assert len(sequence) > 20
    policy = _policy(policy_name)
    planner = IncrementalPlanner(policy)
    changed = reused = 0
    for snap, now in sequence:
        expected = plan(snap, policy, now)
        reused += sum(1 for j in snap.jobs if planner.memo.get(j) is not None)
        assert _same(planner.plan(snap, now), expected), now
        changed += bool(expected.changes)
    assert changed > 5  # the sequence moves jobs, not only waits
    assert reused > len(sequence)  # and the planner served jobs seen before


def test_the_planner_forgets_on_other_nodes() -> None:
    jobs = [
        job("a").min(1).max(4).requested(2).running(("n0", 2)),
        job("b").min(2).max(2).submitted(10),
    ]
    small = snapshot([node("n0").gpus(4)], jobs)
    planner = IncrementalPlanner(preset("edl"))
    for _ in range(2):
        assert _same(planner.plan(small, 100.0), plan(small, preset("edl"), 100.0))
    big = Snapshot((small.nodes[0], *snapshot([node("n1").gpus(4)], []).nodes), small.jobs)
    assert _same(planner.plan(big, 100.0), plan(big, preset("edl"), 100.0))
    assert planner.memo.layout(big.nodes).names == ["n0", "n1"]


def test_an_invalid_job_is_set_aside_as_plan_does_after_valid_cycles() -> None:
    good = snapshot([node("n0").gpus(4)], [job("a").min(1).max(2).running(("n0", 1))])
    planner = IncrementalPlanner(preset("edl"))
    planner.plan(good, 0.0)
    bad_job = job("b").min(1).max(2).running(("n9", 1)).build()  # an unknown node
    bad = Snapshot(good.nodes, (good.jobs[0], bad_job))
    full = plan(bad, preset("edl"), 0.0)
    assert _same(planner.plan(bad, 0.0), full)
    assert full.decision("b").reason is Reason.SET_ASIDE
    assert _same(planner.plan(good, 0.0), plan(good, preset("edl"), 0.0))
    twice = Snapshot(good.nodes, (good.jobs[0], good.jobs[0]))  # held job, duplicated
    assert _same(planner.plan(twice, 0.0), plan(twice, preset("edl"), 0.0))
    assert "appears 2 times" in plan(twice, preset("edl"), 0.0).decision("a").message


def test_names_are_checked_against_the_held_jobs_shown_now() -> None:
    """The planner's validation checks only the names of jobs it has not seen
    (``_distinct``): a new job named like a held job shown in the same snapshot is set
    aside, as by ``plan()``; one named like a held job that has left is not."""
    nodes = snapshot([node("n0").gpus(4)], []).nodes
    a, b = job("a").min(1).max(2).running(("n0", 1)).build(), job("b").min(1).build()
    planner = IncrementalPlanner(preset("edl"))
    memo = planner.memo
    for clash in (
        (a, b, job("a").min(1).build()),  # a new job, a held one's name
        (a, job("c").min(1).build(), job("c").min(2).build()),  # two new ones, one name
        (b, b),  # a held job shown twice
    ):
        for jobs in ((a, b), (a, b)):  # the second cycle takes the kept path
            snap = Snapshot(nodes, jobs)
            assert _same(planner.plan(snap, 0.0), plan(snap, preset("edl"), 0.0))
        assert memo.nodes_valid and memo.jobs  # held: the clash is checked on the kept path
        snap = Snapshot(nodes, clash)
        full = plan(snap, preset("edl"), 0.0)
        assert _same(planner.plan(snap, 0.0), full)
        assert Reason.SET_ASIDE in {d.reason for d in full.decisions}
    for jobs in ((a, b), (a, b)):
        planner.plan(Snapshot(nodes, jobs), 0.0)
    again = Snapshot(nodes, (b, job("a").min(1).max(3).build()))  # "a" left: its name is free
    assert _same(planner.plan(again, 0.0), plan(again, preset("edl"), 0.0))
    assert Reason.SET_ASIDE not in {d.reason for d in plan(again, preset("edl"), 0.0).decisions}
    assert memo.names == {d.job.name: d for d in memo.jobs.values()}


def _kept_state_is_what_scratch_derives(memo: PlanMemo, snap: Snapshot, policy: Policy) -> None:
    """The memo's kept ranking and per-node use describe exactly ``snap``'s jobs."""
    assert set(memo.jobs) == {id(j) for j in snap.jobs}
    # The walk's reference: the snapshot's entries in its order, each knowing its place.
    assert memo.last is snap.jobs and [d.job for d in memo.order] == list(snap.jobs)
    assert [d.at for d in memo.order] == list(range(len(snap.jobs)))
    assert all(memo.jobs[id(d.job)] is d for d in memo.order)
    assert all(d.state.job is d.job for d in memo.order)  # each kept state is its own job's
    assert memo.names == {d.job.name: d for d in memo.jobs.values()}
    if key_varies(policy):
        assert memo.ranked is None
        return
    key = sort_key(policy, 0.0)
    assert memo.ranked is not None
    assert [d.job for _, d in memo.ranked] == sorted(snap.jobs, key=key)
    assert [k for k, _ in memo.ranked] == [key(d.job) for _, d in memo.ranked]
    assert memo.keys == [k for k, _ in memo.ranked]  # the keys bisected, in step
    index = {n.name: i for i, n in enumerate(snap.nodes)}
    used = [[0, 0, 0] for _ in snap.nodes]
    for j in snap.jobs:
        for r in j.replicas:
            spec = j.role_spec(r.role)
            if not r.draining and spec is not None:
                res = spec.resources
                u = used[index[r.node]]
                u[0] += res.gpu
                u[1] += res.cpu_milli
                u[2] += res.memory_bytes
    assert memo.used == used


@pytest.mark.parametrize("policy_name", [*sorted(PRESETS), "starving"])
def test_kept_state_follows_snapshots_in_any_order(
    policy_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    sequence = _recorded(policy_name, monkeypatch)
    policy = _policy(policy_name)
    planner = IncrementalPlanner(policy)
    # In recorded order (a few jobs change per plan), then shuffled (many leave and arrive
    # between two plans, so a kept ranking takes many new jobs at once).
    shuffled = list(sequence)
    random.Random(7).shuffle(shuffled)
    moved = 0
    for snap, now in [*sequence, *shuffled]:
        scratch = plan(snap, policy, now)
        # The changes the planner collected as it decided are the changed decisions.
        assert scratch.changes == tuple(d for d in scratch.decisions if d.changed)
        assert _same(planner.plan(snap, now), scratch), (policy_name, now)
        _kept_state_is_what_scratch_derives(planner.memo, snap, policy)
        moved += len(scratch.changes)
    assert moved > 10
