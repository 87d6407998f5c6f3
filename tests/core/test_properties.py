"""Property tests of the planner's invariants (DESIGN.md section 3), each policy of
``PRESETS`` checked on exactly the invariants it promises, over random clusters, jobs and
event sequences (arrivals, completions, time passing, worker failures, finished drains)
between planning cycles driven by ``apply_plan``.

Aspects tested:

- ``plan`` never raises on valid input, its plans are well formed, and it is deterministic;
- 1: no node that receives a replica ends over-committed; no replica lands where its pod
  template excludes it;
- 2: a job starts only with its whole gang (workers and parameter servers);
- 3: a running job never drops below its minimum, except whole-job suspension where the
  policy allows it; a job already below it is never shrunk further;
- 4: priority first: no waiting job's gang would start on free capacity plus the workers
  above the minimum of the preemptible jobs ranked below it;
- 5: work-conserving: a running job below its maximum with room for one more worker says,
  in its reason, what holds it back;
- 6: idempotence: planning again at the same instant on the applied plan moves nothing;
- 7: stability: cool-downs, minimum run times and resize pauses are respected, shrinks
  name the job they admit, reservations keep freed GPUs for their job, and two elastic
  jobs of equal priority never ping-pong over 100 cycles.

The checkers are in ``oracles`` (independent of the planner's own capacity and placement
code), the strategies in ``strategies``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edl_scheduler.core import (
    PRESETS,
    Action,
    Constraints,
    Invariant,
    Job,
    Plan,
    Policy,
    Replica,
    Resources,
    Role,
    RoleSpec,
    Snapshot,
    apply_plan,
    plan,
)
from tests.core import oracles
from tests.core.strategies import (
    NOW,
    SHRINKING_AFTER_MINIMUM,
    SHRINKING_EQUALS,
    Scenario,
    advances,
    apply_event,
    cluster_nodes,
    job_specs,
    running_job,
    scenarios,
)
from tests.core.strategies import _Usage as Usage

#: Every preset, ``edl`` without growth on evidence (``Policy.ramp_s`` None: growth trusts
#: the model at any size), ``edl`` shrinking every equal, and ``edl`` shrinking only (equals
#: after their minimum run).
POLICIES = [
    *PRESETS.values(),
    replace(PRESETS["edl"], name="edl-trusting", ramp_s=None),
    SHRINKING_EQUALS,
    SHRINKING_AFTER_MINIMUM,
]


def promising(invariant: Invariant) -> list[object]:
    return [pytest.param(p, id=p.name) for p in POLICIES if p.promised(invariant)]


ALL = [pytest.param(p, id=p.name) for p in POLICIES]

#: Examples per policy; the file runs thousands in all and stays within a few minutes.
FEW = settings(max_examples=25, deadline=None)
SOME = settings(max_examples=50, deadline=None)
MANY = settings(max_examples=150, deadline=None)


def cycles(scenario: Scenario, policy: Policy) -> Iterator[tuple[Snapshot, Plan, Snapshot, float]]:
    """(snapshot, plan, applied snapshot, now) for each planning cycle of ``scenario``."""
    snap, now = scenario.snapshot, scenario.now
    for serial, event in enumerate((None, *scenario.events)):
        if event is not None:
            snap, now = apply_event(snap, now, event, serial)
        p = plan(snap, policy, now)
        after = apply_plan(snap, p)
        yield snap, p, after, now
        snap = after


def explain(violations: list[str], p: Plan) -> str:
    return "\n".join(violations) + "\n--- plan ---\n" + p.describe()


def draw_scenario(data: st.DataObject, policy: Policy) -> Scenario:
    return data.draw(scenarios(rigid=not policy.elastic), label="scenario")


@pytest.mark.parametrize("policy", ALL)
@SOME
@given(data=st.data())
def test_plan_never_raises_is_well_formed_and_deterministic(
    policy: Policy, data: st.DataObject
) -> None:
    for snap, p, _, now in cycles(draw_scenario(data, policy), policy):
        violations = oracles.check_well_formed(snap, p)
        assert not violations, explain(violations, p)
        assert plan(snap, policy, now) == p


@pytest.mark.parametrize("policy", promising(Invariant.NO_OVERCOMMIT))
@SOME
@given(data=st.data())
def test_invariant_1_no_node_over_committed_or_excluded(
    policy: Policy, data: st.DataObject
) -> None:
    for snap, p, after, _ in cycles(draw_scenario(data, policy), policy):
        violations = oracles.check_no_overcommit(snap, p, after)
        assert not violations, explain(violations, p)


@pytest.mark.parametrize("policy", promising(Invariant.GANG))
@SOME
@given(data=st.data())
def test_invariant_2_jobs_start_as_whole_gangs(policy: Policy, data: st.DataObject) -> None:
    for snap, p, _, _ in cycles(draw_scenario(data, policy), policy):
        violations = oracles.check_gang(snap, p, policy)
        assert not violations, explain(violations, p)


@pytest.mark.parametrize("policy", promising(Invariant.MIN_KEPT))
@SOME
@given(data=st.data())
def test_invariant_3_running_jobs_keep_their_minimum(policy: Policy, data: st.DataObject) -> None:
    for snap, p, _, _ in cycles(draw_scenario(data, policy), policy):
        violations = oracles.check_min_kept(snap, p, policy)
        assert not violations, explain(violations, p)


@pytest.mark.parametrize("policy", promising(Invariant.PRIORITY_FIRST))
@MANY
@given(data=st.data())
def test_invariant_4_priority_first(policy: Policy, data: st.DataObject) -> None:
    """Checked for waiting jobs without parameter servers (see
    ``oracles.check_priority_first``)."""
    for snap, p, after, now in cycles(draw_scenario(data, policy), policy):
        violations = oracles.check_priority_first(snap, p, after, policy, now)
        assert not violations, explain(violations, p)


@pytest.mark.parametrize("policy", promising(Invariant.WORK_CONSERVING))
@MANY
@given(data=st.data())
def test_invariant_5_work_conserving(policy: Policy, data: st.DataObject) -> None:
    for snap, p, after, now in cycles(draw_scenario(data, policy), policy):
        violations = oracles.check_work_conserving(snap, p, after, policy, now)
        assert not violations, explain(violations, p)


@pytest.mark.parametrize("policy", promising(Invariant.IDEMPOTENT))
@SOME
@given(data=st.data())
def test_invariant_6_idempotent(policy: Policy, data: st.DataObject) -> None:
    for _, p, after, now in cycles(draw_scenario(data, policy), policy):
        again = plan(after, policy, now)
        assert again.is_empty, "first plan:\n" + p.describe() + "\nsecond:\n" + again.describe()


@pytest.mark.parametrize("policy", promising(Invariant.STABLE))
@MANY
@given(data=st.data())
def test_invariant_7_resizes_respect_cooldown_min_run_pause_and_holds(
    policy: Policy, data: st.DataObject
) -> None:
    for snap, p, after, now in cycles(draw_scenario(data, policy), policy):
        violations = oracles.check_stable_step(snap, p, after, policy, now)
        assert not violations, explain(violations, p)


@st.composite
def two_elastic_jobs(draw: st.DrawFn, rigid: bool = False) -> Snapshot:
    """A random cluster and two elastic jobs of equal priority, placed or waiting."""
    nodes = draw(cluster_nodes(max_nodes=6))
    usage = Usage(nodes)
    jobs = []
    for name in ("a", "b"):
        job = draw(job_specs(name, NOW, st.just(1)))
        if draw(st.booleans()):
            job = draw(running_job(job, usage, NOW, rigid))
        jobs.append(job)
    return Snapshot(nodes, tuple(jobs))


@pytest.mark.parametrize("policy", promising(Invariant.STABLE))
@FEW
@given(snap=two_elastic_jobs(), steps=st.lists(advances, min_size=1, max_size=4))
def test_invariant_7_no_ping_pong_between_equal_elastic_jobs(
    policy: Policy, snap: Snapshot, steps: list
) -> None:
    """100 cycles with time passing and nothing arriving: no job is shrunk, grown and shrunk
    again (growing back once into GPUs the admitted job left idle is fine)."""
    history: dict[str, str] = {j.name: "" for j in snap.jobs}
    now = NOW
    for cycle in range(100):
        p = plan(snap, policy, now)
        for job, way in oracles.directions(p).items():
            history[job] += way
        snap = apply_plan(snap, p)
        now += steps[cycle % len(steps)].seconds
    flapping = {job: h for job, h in history.items() if oracles.ping_pong(h)}
    assert not flapping, flapping


@st.composite
def reclaims(draw: st.DrawFn) -> Snapshot:
    """A cluster filled by one elastic job ``v`` (one GPU per worker, minimum 1, long past
    its minimum run and cool-down) and a waiting job ``j`` that can start only by shrinking
    it: ``j`` is of higher priority, or of equal priority and submitted first (reclaim)."""
    nodes = tuple(
        replace(n, taints=(), schedulable=True, labels=()) for n in draw(cluster_nodes(max_nodes=4))
    )
    usage = Usage(nodes)
    small = Resources(1, 100, 2**20)
    v = Job("v", RoleSpec(1, 64, small), submit_time=NOW - 5000, priority=0)
    replicas: list[Replica] = []
    while options := usage.candidates(v, small):
        node = options[draw(st.integers(0, len(options) - 1))]
        usage.take(node, small)
        replicas.append(Replica(f"v-w{len(replicas)}", Role.WORKER, node))
    v = replace(v, replicas=tuple(replicas), start_time=NOW - 5000)
    higher = draw(st.booleans())
    j = draw(job_specs("j", NOW, st.just(1 if higher else 0)))
    j = replace(
        j,
        worker=replace(j.worker, resources=replace(j.worker.resources, cpu_milli=100)),
        pserver=None,
        constraints=Constraints(),
        submit_time=NOW - 10 if higher else NOW - 6000,
    )
    return Snapshot(nodes, (v, j))


@pytest.mark.parametrize("policy", promising(Invariant.STABLE))
@SOME
@given(snap=reclaims(), data=st.data())
def test_invariant_7_freed_gpus_are_held_for_the_admitted_job(
    policy: Policy, snap: Snapshot, data: st.DataObject
) -> None:
    """When shrinking ``v`` admits ``j``, the next snapshot (victims still draining, ``j``'s
    workers not yet there, a competing job of ``j``'s priority and rank below it just
    arrived) must start
    ``j`` again on the held GPUs, not hand them to the competitor."""
    name = "j"
    first = plan(snap, policy, NOW)
    victims = [d for d in first.decisions if d.for_job == name]
    if first.decision(name).action is not Action.START or not victims:
        return  # j fitted without preemption, or not even with v at its minimum
    applied = apply_plan(snap, first)
    gone = {r for d in victims for r in d.workers.remove}
    original = {j.name: j for j in snap.jobs}
    jobs = []
    for job in applied.jobs:
        if job.name == name:
            jobs.append(original[name])
            continue
        drained = tuple(
            replace(r, draining=True) for r in original[job.name].replicas if r.name in gone
        )
        jobs.append(replace(job, replicas=job.replicas + drained))
    j = original[name]
    competitor = data.draw(job_specs("c", NOW, st.just(j.priority)), label="competitor")
    # Ranked below j under every ordering: later, with as much attained GPU-time (a job
    # ranked above j may take what is held for j).
    competitor = replace(
        competitor,
        submit_time=NOW + 1,
        attained_gpu_seconds=j.attained_gpu_seconds,
        suspended=False,
        constraints=replace(competitor.constraints, node_selector=(), required_terms=()),
    )
    jobs.append(competitor)
    later = NOW + data.draw(st.sampled_from((0.0, 1.0, 100.0, 500.0)), label="later")
    replay = Snapshot(snap.nodes, tuple(jobs), first.reservations)
    second = plan(replay, policy, later)
    again = second.decision(name)
    assert again.action is Action.START, second.describe()
    assert again.workers.target >= j.worker.min_replicas
    violations = oracles.check_stable_step(
        replay, second, apply_plan(replay, second), policy, later
    )
    assert not violations, explain(violations, second)
