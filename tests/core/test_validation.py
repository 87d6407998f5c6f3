"""A job whose state the planner cannot accept is set aside; only inconsistent nodes stop
the cycle; a maximum lowered below what runs is a request, not an error.

Aspects:
- each ``JobError`` (a replica on an unknown node, negative resources, duplicate job or
  replica names, min above max, min below 1, parameter-server replicas without a spec, a
  requested size outside the bounds): the job is set aside with ``Reason.SET_ASIDE``, a
  message that names the problem and the fix, and the replicas it had; another job in the
  same snapshot is planned as usual;
- a job set aside keeps the capacity of its live replicas: nobody is placed on it;
- each ``ClusterError`` (a node listed twice, negative node capacity) raises, naming the
  node;
- more live workers (or parameter servers) than the maximum: the newest drain, with
  ``Reason.SHRUNK_TO_MAXIMUM``, whatever the cool-down; planning again on the drained state
  is empty; draining replicas do not count toward the maximum;
- an input that already over-commits a node is not an error, but nothing more is placed
  there (the plan never deepens an over-commitment).
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from edl_scheduler.core import (
    Action,
    Job,
    Plan,
    Reason,
    Replica,
    Resources,
    Role,
    Snapshot,
    apply_plan,
    plan,
    preset,
)
from edl_scheduler.core.policy import with_overrides
from edl_scheduler.core.validating import (
    ClusterError,
    DuplicateNameError,
    DuplicateNodeError,
    InvalidJobError,
    JobError,
    NegativeCapacityError,
    NegativeNodeCapacityError,
    UnknownNodeError,
    validate,
)
from tests.core.builders import job, node, nodes, snapshot

EDL = preset("edl")


def _set_aside(snap: Snapshot, name: str, kind: type[JobError], *words: str) -> Plan:
    """Plans ``snap`` beside a healthy job "ok": ``name`` is set aside for ``kind``, with
    each of ``words`` in its message; "ok" starts."""
    ok = job("ok").min(1).max(1).build()
    full = Snapshot(snap.nodes, (*snap.jobs, ok), snap.reservations)
    assert [type(p) for p in validate(full) if p.subject == name] != []
    assert all(isinstance(p, kind) for p in validate(full) if p.subject == name)
    p = plan(full, EDL, 0.0)
    d = p.decision(name)
    assert d.reason is Reason.SET_ASIDE and not d.changed
    for word in words:
        assert word in d.message, d.message
    assert p.decision("ok").action is Action.START
    return p


def test_worker_on_unknown_node() -> None:
    snap = snapshot(nodes(1), [job("a").min(1).max(2).running(("ghost", 1))])
    d = _set_aside(snap, "a", UnknownNodeError, "ghost", "delete the replica").decision("a")
    assert d.action is Action.KEEP and d.workers.current == d.workers.target == 1


def test_negative_job_resources() -> None:
    j = job("a").build()
    j = replace(j, worker=replace(j.worker, resources=Resources(-1, 0, 0)))
    _set_aside(Snapshot((node("n0").build(),), (j,)), "a", NegativeCapacityError, "negative")


def test_duplicate_job_names_set_every_one_aside() -> None:
    snap = snapshot(nodes(1), [job("a"), job("a").min(2)])
    p = _set_aside(snap, "a", DuplicateNameError, "appears 2 times", "rename")
    assert [d.reason for d in p.decisions if d.job == "a"] == [Reason.SET_ASIDE] * 2


def test_duplicate_replica_names() -> None:
    j = job("a").min(1).max(2).running(("n0", 2)).build()
    j = replace(j, replicas=(j.replicas[0], replace(j.replicas[1], name=j.replicas[0].name)))
    _set_aside(Snapshot((node("n0").build(),), (j,)), "a", DuplicateNameError, "twice")


def test_min_above_max() -> None:
    j = job("a").min(4).build()
    j = replace(j, worker=replace(j.worker, max_replicas=2))
    _set_aside(
        Snapshot((node("n0").build(),), (j,)),
        "a",
        InvalidJobError,
        "below minReplicas (4)",
        "raise maxReplicas",
    )


def test_min_below_one() -> None:
    j = job("a").build()
    j = replace(j, worker=replace(j.worker, min_replicas=0))
    _set_aside(Snapshot((node("n0").build(),), (j,)), "a", InvalidJobError, "at least 1")


def test_pserver_replicas_without_a_pserver_spec() -> None:
    j = job("a").build()
    j = replace(j, replicas=(Replica("a-ps0", Role.PSERVER, "n0"),))
    _set_aside(Snapshot((node("n0").build(),), (j,)), "a", InvalidJobError, "no pserver spec")


def test_requested_size_outside_the_bounds() -> None:
    snap = snapshot(nodes(1), [job("a").min(1).max(2).requested(3)])
    _set_aside(snap, "a", InvalidJobError, "outside [1, 2]")


def test_a_job_set_aside_keeps_the_capacity_of_its_replicas() -> None:
    # "bad" lists 6 workers on n0's 8 GPUs, one name twice (each listed replica counts: the
    # planner cannot tell which is real); "b" may take only what is left of n0.
    bad = job("bad").min(1).max(8).running(("n0", 5)).build()
    bad = replace(bad, replicas=(*bad.replicas, bad.replicas[0]))
    b = job("b").min(1).max(8).build()
    p = plan(Snapshot((node("n0").gpus(8).build(),), (bad, b)), EDL, 0.0)
    assert p.decision("bad").reason is Reason.SET_ASIDE
    assert p.decision("b").workers.target == 2


def test_nodes_listed_twice_stop_the_cycle() -> None:
    with pytest.raises(DuplicateNodeError) as info:
        plan(snapshot([node("n0"), node("n0")], [job("a")]), EDL, 0.0)
    assert isinstance(info.value, ClusterError) and info.value.subject == "n0"


def test_negative_node_capacity_stops_the_cycle() -> None:
    broken = replace(node("n0").build(), allocatable=Resources(-1, 1000, 1))
    with pytest.raises(NegativeNodeCapacityError) as info:
        plan(Snapshot((broken,), ()), EDL, 0.0)
    assert info.value.subject == "n0" and "negative" in str(info.value)


def _drained(snap: Snapshot, p: Plan) -> None:
    """Applying ``p`` and planning again at the same instant changes nothing more."""
    assert plan(apply_plan(snap, p), EDL, 0.0).is_empty


def test_more_workers_than_the_maximum_drain_the_newest() -> None:
    # Lowered from 4 to 2 a second after its last resize: no cool-down holds a user's word.
    cooling = with_overrides(EDL, cooldown_s=600.0)
    snap = snapshot(nodes(1), [job("a").min(1).max(2).running(("n0", 4)).started(0.0, 9.0)])
    p = plan(snap, cooling, 10.0)
    d = p.decision("a")
    assert d.action is Action.SHRINK and d.reason is Reason.SHRUNK_TO_MAXIMUM
    assert d.workers.remove == ("a-w3", "a-w2") and d.workers.target == 2
    assert "maxReplicas is 2" in d.message
    _drained(snap, plan(snap, EDL, 0.0))


def test_more_pservers_than_their_maximum_drain_the_surplus() -> None:
    snap = snapshot(
        nodes(1), [job("a").min(1).max(1).running(("n0", 1)).pservers(1, 1, 2000, "n0", "n0")]
    )
    p = plan(snap, EDL, 0.0)
    d = p.decision("a")
    assert d.reason is Reason.SHRUNK_TO_MAXIMUM and d.pservers is not None
    assert d.pservers.remove == ("a-ps2",) and d.pservers.target == 1
    assert d.workers.target == 1 and not d.workers.remove
    _drained(snap, p)


def test_what_the_surplus_frees_admits_another_job_in_the_same_cycle() -> None:
    snap = snapshot(
        nodes(1, gpus=4),
        [job("a").min(1).max(1).running(("n0", 4)), job("b").min(3).max(3).submitted(1.0)],
    )
    p = plan(snap, EDL, 0.0)
    assert p.decision("a").workers.target == 1
    assert p.decision("b").action is Action.START and p.decision("b").workers.target == 3


def test_draining_workers_do_not_count_toward_the_maximum() -> None:
    snap = snapshot(nodes(1), [job("a").min(1).max(2).running(("n0", 3), draining=1)])
    d = plan(snap, EDL, 0.0).decision("a")
    assert d.workers.current == 2 and not d.changed


def test_a_suspended_job_above_its_maximum_gives_up_everything() -> None:
    snap = snapshot(nodes(1), [job("a").min(1).max(1).running(("n0", 3)).suspended()])
    d = plan(snap, EDL, 0.0).decision("a")
    assert d.reason is Reason.USER_SUSPENDED and d.workers.target == 0


def test_an_over_committed_node_gets_nothing_more() -> None:
    # Other pods use 6 of n0's 8 GPUs, yet "a" reports 4 workers there: 2 GPUs too many.
    snap = snapshot(
        [node("n0").gpus(8).used(gpu=6), node("n1").gpus(8)],
        [job("a").min(1).max(4).running(("n0", 4)), job("b").min(1).max(16)],
    )
    p = plan(snap, EDL, 0.0)
    assert "n0" not in p.decision("b").workers.add_nodes
    assert p.decision("b").workers.target == 8


def test_jobs_built_by_hand_are_valid_input() -> None:
    j: Job = job("a").min(1).max(2).running(("n0", 2)).build()
    assert validate(Snapshot((node("n0").build(),), (j,))) == ()
