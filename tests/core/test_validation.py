"""An inconsistent snapshot is refused with a typed error that names the job or node.

Aspects:
- a worker on an unknown node, more live workers than maxReplicas, negative capacity,
  duplicate names, min > max: each raises its own SnapshotError subclass whose ``subject``
  is the offending job or node, and whose message says what is wrong;
- draining replicas do not count toward maxReplicas;
- an input that already over-commits a node is not an error, but nothing more is placed
  there (the plan never deepens an over-commitment).
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from edl_scheduler.core import Replica, Resources, Role, Snapshot, plan, preset
from edl_scheduler.core.validating import (
    DuplicateNameError,
    InvalidJobError,
    NegativeCapacityError,
    OverMaximumError,
    SnapshotError,
    UnknownNodeError,
)
from tests.core.builders import job, node, nodes, snapshot

EDL = preset("edl")


def _bad(snap: Snapshot) -> SnapshotError:
    with pytest.raises(SnapshotError) as info:
        plan(snap, EDL, 0.0)
    return info.value


def test_worker_on_unknown_node() -> None:
    err = _bad(snapshot(nodes(1), [job("a").min(1).max(2).running(("ghost", 1))]))
    assert isinstance(err, UnknownNodeError)
    assert err.subject == "a" and "ghost" in str(err)


def test_more_workers_than_maximum() -> None:
    err = _bad(snapshot(nodes(1), [job("a").min(1).max(2).running(("n0", 3))]))
    assert isinstance(err, OverMaximumError)
    assert err.subject == "a" and "maxReplicas (2)" in str(err)


def test_draining_workers_do_not_count_toward_the_maximum() -> None:
    snap = snapshot(nodes(1), [job("a").min(1).max(2).running(("n0", 3), draining=1)])
    assert plan(snap, EDL, 0.0).decision("a").workers.current == 2


def test_negative_node_capacity() -> None:
    broken = replace(node("n0").build(), allocatable=Resources(-1, 1000, 1))
    err = _bad(Snapshot((broken,), ()))
    assert isinstance(err, NegativeCapacityError) and err.subject == "n0"


def test_duplicate_job_and_node_names() -> None:
    err = _bad(snapshot([node("n0"), node("n0")], []))
    assert isinstance(err, DuplicateNameError) and err.subject == "n0"
    err = _bad(snapshot(nodes(1), [job("a"), job("a")]))
    assert isinstance(err, DuplicateNameError) and err.subject == "a"


def test_min_above_max() -> None:
    j = job("a").min(4).build()
    j = replace(j, worker=replace(j.worker, max_replicas=2))
    err = _bad(Snapshot((node("n0").build(),), (j,)))
    assert isinstance(err, InvalidJobError) and "below minReplicas (4)" in str(err)


def test_pserver_replicas_without_a_pserver_spec() -> None:
    j = job("a").build()
    j = replace(j, replicas=(Replica("a-ps0", Role.PSERVER, "n0"),))
    err = _bad(Snapshot((node("n0").build(),), (j,)))
    assert isinstance(err, InvalidJobError) and err.subject == "a"


def test_an_over_committed_node_gets_nothing_more() -> None:
    # Other pods use 6 of n0's 8 GPUs, yet "a" reports 4 workers there: 2 GPUs too many.
    snap = snapshot(
        [node("n0").gpus(8).used(gpu=6), node("n1").gpus(8)],
        [job("a").min(1).max(4).running(("n0", 4)), job("b").min(1).max(16)],
    )
    p = plan(snap, EDL, 0.0)
    assert "n0" not in p.decision("b").workers.add_nodes
    assert p.decision("b").workers.target == 8
