"""``plan(..., memo=PlanMemo())`` gives the plan ``plan()`` gives without one.

Aspects:
- on recorded snapshot sequences (a simulator's plans, where most Job objects repeat from
  one plan to the next) under every preset, and under a LAS policy with a starvation limit
  (a waiting job's rank then depends on ``now``), each plan made with one memo carried through
  the sequence equals the plan made from scratch, decision for decision, with reservations;
- the memo forgets everything when the policy or the nodes change (a job's bounds and its
  replicas' node indices depend on both);
- an invalid job raises the same error with a memo as without, also after valid cycles, and
  a job that was valid stays valid only as the same object;
- the state a memo keeps from plan to plan (the ranking, the replicas' use per node, the
  decisions of jobs nobody touched) equals, after every plan, what the plan would derive
  from scratch, also when the snapshots come in an order where many jobs leave and arrive
  between two plans (the merge of a kept ranking with many new jobs), and the plans equal
  the plans made without a memo;
- a plan asked for its changes only (``changes_only``, the simulator's mode) carries exactly
  the full plan's changes, in order, and its reservations, with and without a memo, on the
  same sequences in recorded and shuffled order (every preset: rigid LAS with demotions,
  elastic ``edl`` with growth and rebalancing, fulfillment growth, strict FIFO).
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from edl_scheduler.core import PRESETS, PlanMemo, Policy, Reason, Snapshot, plan, preset
from edl_scheduler.core.ordering import key_varies, sort_key
from edl_scheduler.core.policy import with_overrides
from simulations.engine import SimConfig, simulate
from simulations.traces import load_tiresias
from simulations.workload import ClusterSpec, Elasticity, with_elasticity
from tests.core.builders import job, node, snapshot
from tests.simulations.recording import recorded

DATA = Path(__file__).parents[1] / "simulations" / "data" / "60_job.csv"


#: Tiresias where a job waiting 10 minutes returns to the first queue: a waiting job's rank
#: then depends on ``now``, so the memo may not keep its rank key.
STARVING = with_overrides(
    preset("tiresias"), queue_thresholds_gpu_s=(200.0, 1500.0), starvation_limit_s=600.0
)


def _policy(name: str) -> Policy:
    return STARVING if name == "starving" else preset(name)


def _recorded(policy_name: str, monkeypatch: pytest.MonkeyPatch) -> list[tuple[Snapshot, float]]:
    """The snapshots a simulation of ``60_job.csv`` on 8 GPUs plans on (queues form)."""
    cluster = ClusterSpec(2, 4)
    jobs = load_tiresias(DATA, cluster).jobs
    policy = _policy(policy_name)
    if policy.elastic:
        jobs = with_elasticity(jobs, Elasticity.ELASTIC, cluster.gpus)
    return recorded(monkeypatch, lambda: simulate(jobs, cluster, policy, SimConfig(tick_s=300.0)))


@pytest.mark.parametrize("policy_name", [*sorted(PRESETS), "starving"])
def test_a_memo_carried_through_a_sequence_changes_no_plan(
    policy_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    sequence = _recorded(policy_name, monkeypatch)
    assert len(sequence) > 20
    policy = _policy(policy_name)
    memo = PlanMemo()
    changed = reused = 0
    for snap, now in sequence:
        expected = plan(snap, policy, now)
        reused += sum(1 for j in snap.jobs if memo.get(j) is not None)
        assert plan(snap, policy, now, memo=memo) == expected
        changed += bool(expected.changes)
    assert changed > 5  # the sequence moves jobs, not only waits
    assert reused > len(sequence)  # and the memo served jobs seen before


def test_the_memo_forgets_on_another_policy_or_other_nodes() -> None:
    jobs = [
        job("a").min(1).max(4).requested(2).running(("n0", 2)),
        job("b").min(2).max(2).submitted(10),
    ]
    small = snapshot([node("n0").gpus(4)], jobs)
    memo = PlanMemo()
    for name in ("edl", "tiresias", "edl"):
        assert plan(small, preset(name), 100.0, memo=memo) == plan(small, preset(name), 100.0)
    big = Snapshot((small.nodes[0], *snapshot([node("n1").gpus(4)], []).nodes), small.jobs)
    assert plan(big, preset("edl"), 100.0, memo=memo) == plan(big, preset("edl"), 100.0)


def test_an_invalid_job_is_set_aside_as_without_a_memo_after_valid_cycles() -> None:
    good = snapshot([node("n0").gpus(4)], [job("a").min(1).max(2).running(("n0", 1))])
    memo = PlanMemo()
    plan(good, preset("edl"), 0.0, memo=memo)
    bad_job = job("b").min(1).max(2).running(("n9", 1)).build()  # an unknown node
    bad = Snapshot(good.nodes, (good.jobs[0], bad_job))
    memoized = plan(bad, preset("edl"), 0.0, memo=memo)
    assert memoized == plan(bad, preset("edl"), 0.0)
    assert memoized.decision("b").reason is Reason.SET_ASIDE
    assert memo.jobs == {}  # a cycle that sets a job aside forgets: the next starts afresh
    assert plan(good, preset("edl"), 0.0, memo=memo) == plan(good, preset("edl"), 0.0)
    twice = Snapshot(good.nodes, (good.jobs[0], good.jobs[0]))  # held job, duplicated
    memoized = plan(twice, preset("edl"), 0.0, memo=memo)
    assert memoized == plan(twice, preset("edl"), 0.0)
    assert "appears 2 times" in memoized.decision("a").message


def test_names_are_checked_against_the_held_jobs_shown_now() -> None:
    """Validation with a memo checks only the names of jobs it has not seen (``_distinct``):
    a new job named like a held job shown in the same snapshot is set aside, as without a
    memo; one named like a held job that has left is not."""
    nodes = snapshot([node("n0").gpus(4)], []).nodes
    a, b = job("a").min(1).max(2).running(("n0", 1)).build(), job("b").min(1).build()
    memo = PlanMemo()
    for clash in (
        (a, b, job("a").min(1).build()),  # a new job, a held one's name
        (a, job("c").min(1).build(), job("c").min(2).build()),  # two new ones, one name
        (b, b),  # a held job shown twice
    ):
        for jobs in ((a, b), (a, b)):  # the second cycle takes the memo's path
            snap = Snapshot(nodes, jobs)
            assert plan(snap, preset("edl"), 0.0, memo=memo) == plan(snap, preset("edl"), 0.0)
        assert memo.nodes_valid and memo.jobs  # held: the clash is checked on the memo's path
        snap = Snapshot(nodes, clash)
        memoized = plan(snap, preset("edl"), 0.0, memo=memo)
        assert memoized == plan(snap, preset("edl"), 0.0)
        assert Reason.SET_ASIDE in {d.reason for d in memoized.decisions}
    for jobs in ((a, b), (a, b)):
        plan(Snapshot(nodes, jobs), preset("edl"), 0.0, memo=memo)
    again = Snapshot(nodes, (b, job("a").min(1).max(3).build()))  # "a" left: its name is free
    assert plan(again, preset("edl"), 0.0, memo=memo) == plan(again, preset("edl"), 0.0)
    assert Reason.SET_ASIDE not in {d.reason for d in plan(again, preset("edl"), 0.0).decisions}
    assert memo.names == {d.job.name: d for d in memo.jobs.values()}


def _kept_state_is_what_scratch_derives(memo: PlanMemo, snap: Snapshot, policy: Policy) -> None:
    """The memo's kept ranking and per-node use describe exactly ``snap``'s jobs."""
    assert set(memo.jobs) == {id(j) for j in snap.jobs}
    # The walk's reference: the snapshot's entries in its order, each knowing its place.
    assert memo.last is snap.jobs and [d.job for d in memo.order] == list(snap.jobs)
    assert [d.at for d in memo.order] == list(range(len(snap.jobs)))
    assert all(memo.jobs[id(d.job)] is d for d in memo.order)
    assert set(memo.steady) <= set(memo.jobs)
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
    memo = PlanMemo()
    # In recorded order (a few jobs change per plan), then shuffled (many leave and arrive
    # between two plans, so a kept ranking takes many new jobs at once).
    shuffled = list(sequence)
    random.Random(7).shuffle(shuffled)
    for snap, now in [*sequence, *shuffled]:
        got, scratch = plan(snap, policy, now, memo=memo), plan(snap, policy, now)
        assert got == scratch
        # The changes the planner collected as it decided are the changed decisions.
        for made in (got, scratch):
            assert made.changes == tuple(d for d in made.decisions if d.changed)
        _kept_state_is_what_scratch_derives(memo, snap, policy)


@pytest.mark.parametrize("policy_name", [*sorted(PRESETS), "starving"])
def test_a_plan_of_changes_only_carries_the_full_plans_changes(
    policy_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    sequence = _recorded(policy_name, monkeypatch)
    policy = _policy(policy_name)
    memo, fresh = PlanMemo(), PlanMemo()
    shuffled = list(sequence)
    random.Random(11).shuffle(shuffled)
    moved = 0
    for snap, now in [*sequence, *shuffled]:
        full = plan(snap, policy, now)
        for kept in (memo, None):
            got = plan(snap, policy, now, memo=kept, changes_only=True)
            assert got.decisions == full.changes, (policy_name, now)
            assert got.changes == full.changes
            assert got.reservations == full.reservations
        moved += len(full.changes)
        # A memo used for full plans and changes-only plans alike keeps serving both.
        assert plan(snap, policy, now, memo=fresh) == full
        assert plan(snap, policy, now, memo=fresh, changes_only=True).decisions == full.changes
    assert moved > 10
