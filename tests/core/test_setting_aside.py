"""One job's bad state never changes the plan of the others.

Aspects:
- for any valid snapshot and any job of it corrupted in one of the ways a driver or a user
  can (a replica on a node that is gone, negative resources, min above max, min below 1,
  parameter-server replicas without a spec, a replica named twice, a requested size outside
  the bounds), under every preset policy: the corrupted job is set aside, keeping what it
  has, and the plan of every other job, and the reservations, equal the plan of the
  snapshot without that job, where the capacity its live replicas take on known nodes is
  used by others;
- the same holds of the changes of a plan made by an incremental planner that saw the
  valid snapshot first.
"""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from edl_scheduler.core import (
    PRESETS,
    Job,
    Reason,
    Replica,
    Resources,
    Role,
    Snapshot,
    plan,
    preset,
)
from edl_scheduler.core.incremental import IncrementalPlanner
from tests.core.strategies import NOW, snapshots

CORRUPTIONS = (
    "unknown-node",
    "negative-resources",
    "min-above-max",
    "min-below-one",
    "pserver-without-spec",
    "replica-named-twice",
    "requested-outside",
)


def corrupt(job: Job, how: str, node: str) -> Job:
    """``job`` broken in the way ``how`` names; ``node`` is a node of the snapshot."""
    spec = job.worker
    if how == "unknown-node":
        ghost = Replica(f"{job.name}-ghost", Role.WORKER, "gone-node")
        return replace(job, replicas=(*job.replicas, ghost))
    if how == "negative-resources":
        return replace(job, worker=replace(spec, resources=Resources(-1, 0, 0)))
    if how == "min-above-max":
        return replace(job, worker=replace(spec, min_replicas=spec.max_replicas + 1))
    if how == "min-below-one":
        return replace(job, worker=replace(spec, min_replicas=0))
    if how == "pserver-without-spec":
        server = Replica(f"{job.name}-ps-extra", Role.PSERVER, node)
        return replace(job, pserver=None, replicas=(*job.replicas, server))
    if how == "replica-named-twice":
        if job.replicas:
            return replace(job, replicas=(*job.replicas, job.replicas[-1]))
        twins = (Replica(f"{job.name}-w", Role.WORKER, node),) * 2
        return replace(job, replicas=twins, start_time=0.0)
    assert how == "requested-outside"
    return replace(job, requested=spec.max_replicas + 1)


def without(snap: Snapshot, bad: Job) -> Snapshot:
    """``snap`` without ``bad``: what its live replicas on known nodes take is used by
    others there (nothing where its role has no spec or negative resources)."""
    extra: dict[str, Resources] = {}
    names = {n.name for n in snap.nodes}
    for r in bad.replicas:
        spec = bad.role_spec(r.role)
        if r.draining or r.node not in names or spec is None or spec.resources.is_negative():
            continue
        extra[r.node] = extra.get(r.node, Resources()) + spec.resources
    nodes = tuple(
        replace(n, used_by_others=n.used_by_others + extra[n.name]) if n.name in extra else n
        for n in snap.nodes
    )
    jobs = tuple(j for j in snap.jobs if j is not bad)
    return Snapshot(nodes, jobs, tuple(r for r in snap.reservations if r.job != bad.name))


@st.composite
def corrupted(draw: st.DrawFn) -> tuple[Snapshot, Snapshot, Job]:
    """(a valid snapshot, the same with one job corrupted, that job)."""
    snap = draw(snapshots(max_nodes=6, max_jobs=8).filter(lambda s: bool(s.jobs)))
    at = draw(st.integers(0, len(snap.jobs) - 1))
    how = draw(st.sampled_from(CORRUPTIONS))
    node = snap.nodes[draw(st.integers(0, len(snap.nodes) - 1))].name
    bad = corrupt(snap.jobs[at], how, node)
    jobs = (*snap.jobs[:at], bad, *snap.jobs[at + 1 :])
    return snap, Snapshot(snap.nodes, jobs, snap.reservations), bad


@settings(max_examples=150, deadline=None)
@given(corrupted(), st.sampled_from(sorted(PRESETS)))
def test_the_others_are_planned_as_if_the_job_were_not_there(
    case: tuple[Snapshot, Snapshot, Job], policy_name: str
) -> None:
    valid, broken, bad = case
    policy = preset(policy_name)
    got = plan(broken, policy, NOW)
    mine = [d for d in got.decisions if d.job == bad.name]
    assert len(mine) == 1 and mine[0].reason is Reason.SET_ASIDE and not mine[0].changed
    live = sum(1 for r in bad.replicas if r.role is Role.WORKER and not r.draining)
    assert mine[0].workers.current == mine[0].workers.target == live
    expected = plan(without(broken, bad), policy, NOW)
    assert tuple(d for d in got.decisions if d.job != bad.name) == expected.decisions
    assert got.reservations == expected.reservations
    planner = IncrementalPlanner(policy)
    planner.plan(valid, NOW)
    quick = planner.plan(broken, NOW)
    assert (quick.decisions, quick.reservations) == (got.changes, got.reservations)
