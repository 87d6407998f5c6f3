"""Which running jobs no plan can change (``core/incremental/unchangeable.py``), against
``plan()`` and the admission rules the proof rests on.

Aspects:
- on generated snapshots (rigid and elastic jobs, parameter servers, jobs suspended by their
  spec, draining replicas, holds carried over, node constraints), under every preset the
  rule applies to and a LAS policy whose waiting jobs starve: every job it names keeps its
  size in ``plan()``'s plan, and the plan of the other jobs, with what the named ones take
  passed as ``occupied`` to an incremental planner, makes the same changes (jobs, actions,
  nodes, removed replicas, beneficiaries; only rank numbers in messages may differ) and the
  same reservations;
- the rule applies exactly where a policy moves whole jobs only and ranks do not move at
  every instant a job runs (not under ``edl``, ``edl-fulfillment``, least attained);
- a running job at its size ranked below a job short of its size, or one above its size,
  or one with parameter servers, is not named.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edl_scheduler.core import PRESETS, Plan, Policy, Resources, Role, Snapshot, plan, preset
from edl_scheduler.core.incremental import IncrementalPlanner
from edl_scheduler.core.incremental.unchangeable import applies, best_short, unchangeable
from edl_scheduler.core.ordering import sort_key
from edl_scheduler.core.policy import Ordering, with_overrides
from tests.core.builders import job, node, snapshot
from tests.core.strategies import NOW, snapshots

STARVING = with_overrides(
    preset("tiresias"), queue_thresholds_gpu_s=(200.0, 1500.0), starvation_limit_s=600.0
)
POLICIES = {**{n: p for n, p in PRESETS.items() if applies(p)}, "starving": STARVING}


def _changes(result: Plan) -> list[tuple[object, ...]]:
    return [
        (d.job, d.action, d.workers.add_nodes, d.workers.remove, d.for_job) for d in result.changes
    ]


def _split(snap: Snapshot, policy: Policy) -> tuple[Snapshot, tuple[Resources, ...], list[str]]:
    """The snapshot without the jobs the rule names, what they take per node, their names."""
    key = sort_key(policy, NOW)
    live = [len(j.live(Role.WORKER)) for j in snap.jobs]
    keys = [key(j) for j in snap.jobs]
    top = best_short(snap.jobs, live, keys, policy.elastic)
    named = [
        j
        for j, n, k in zip(snap.jobs, live, keys, strict=True)
        if top is not None and unchangeable(j, n, k, top, policy.elastic)
    ]
    index = {n.name: i for i, n in enumerate(snap.nodes)}
    taken = [Resources() for _ in snap.nodes]
    for j in named:
        for r in j.live(Role.WORKER):
            taken[index[r.node]] = taken[index[r.node]] + j.worker.resources
    kept = tuple(j for j in snap.jobs if j not in named)
    return Snapshot(snap.nodes, kept, snap.reservations), tuple(taken), [j.name for j in named]


@pytest.mark.parametrize("name", sorted(POLICIES))
@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_the_jobs_named_keep_their_size_and_the_others_plan_the_same(
    name: str, data: st.DataObject
) -> None:
    policy = POLICIES[name]
    snap = data.draw(snapshots(rigid=not policy.elastic), label="snapshot")
    part, occupied, named = _split(snap, policy)
    full = plan(snap, policy, NOW)
    for job_name in named:
        assert not full.decision(job_name).changed, full.describe()
    got = IncrementalPlanner(policy).plan(part, NOW, occupied)
    assert _changes(got) == _changes(full), full.describe()
    assert got.reservations == full.reservations


def test_the_rule_applies_where_plans_move_whole_jobs_only() -> None:
    assert sorted(n for n, p in PRESETS.items() if applies(p)) == [
        "fifo-backfill",
        "fifo-gang",
        "tiresias",
        "tiresias-pollux",
    ]
    assert not applies(with_overrides(preset("tiresias"), ordering=Ordering.LEAST_ATTAINED))
    assert not applies(with_overrides(preset("tiresias"), use_priority=True))


def test_only_jobs_at_their_size_above_every_short_job_are_named() -> None:
    policy = preset("tiresias")
    snap = snapshot(
        [node("n0").gpus(4), node("n1").gpus(4), node("n2").gpus(4)],
        [
            job("old").min(2).max(2).running(("n0", 2)).submitted(0),
            job("wait").min(4).max(4).submitted(5),
            # Demoted to queue 1: ranked below "wait", which may suspend it.
            job("long").min(2).max(2).attained(4000).running(("n1", 2)).submitted(1),
            # Above its size: the planner would shrink it back.
            job("over").min(1).max(1).running(("n2", 2)).submitted(2),
        ],
    )
    _, occupied, named = _split(snap, policy)
    assert named == ["old"]
    res = snap.jobs[0].worker.resources
    assert occupied == (res + res, Resources(), Resources())
    alone = snapshot([node("n0").gpus(4)], [job("old").min(2).max(2).running(("n0", 2))])
    assert _split(alone, policy)[2] == []  # nothing below its size: nothing is named
