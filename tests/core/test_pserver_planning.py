"""The planner and parameter servers (`strategy: ps`, `spec.pserver.minReplicas/maxReplicas`).

Aspects:
- admission is a gang of workers and servers: a job whose workers fit but whose minimum of
  servers does not waits, says why, and places nothing; where both fit it starts with its
  minimum workers and its minimum servers in one plan;
- growth grows the servers beside the workers (ceil(workers * psMax / workerMax)), never
  above `maxReplicas` nor below `minReplicas`, and only where their resources fit;
- a job without a `pserver` spec gets no server decision;
- a job shrunk to admit another keeps at least its minimum of servers;
- every plan here is idempotent: planning again on the applied state changes nothing;
- a job at its worker maximum still gets the servers its rule gives.
"""

from __future__ import annotations

from edl_scheduler.core import Action, Plan, Role, Snapshot, apply_plan, plan, preset
from tests.core.builders import job, node, snapshot

EDL = preset("edl")


def run(snap: Snapshot, now: float = 1000.0) -> Plan:
    return plan(snap, EDL, now)


def settled(snap: Snapshot, p: Plan, now: float = 1000.0) -> bool:
    return plan(apply_plan(snap, p), EDL, now).is_empty


def test_a_job_whose_server_minimum_does_not_fit_waits_and_places_nothing() -> None:
    # 8 GPUs free, room for the workers' CPU, but only one 4-core server of the two needed.
    snap = snapshot(
        [node("n0").gpus(8).cpu(7000)],
        [job("p").min(2).max(4).cpu(1000).pservers(2, 2, 4000)],
    )
    p = run(snap)
    d = p.decision("p")
    assert d.workers.add_nodes == () and d.pservers is not None and d.pservers.add_nodes == ()
    assert d.action is not Action.START
    assert d.message, "a waiting job says why"
    assert settled(snap, p)


def test_a_job_starts_with_its_minimum_workers_and_servers_at_once() -> None:
    snap = snapshot(
        [node("gpu").gpus(2).cpu(2500), node("cpu").gpus(0).cpu(16000)],
        [job("p").min(2).max(2).cpu(1000).pservers(2, 3, 4000)],
    )
    p = run(snap)
    d = p.decision("p")
    assert d.action is Action.START
    assert d.workers.add_nodes == ("gpu", "gpu")
    assert d.pservers is not None and d.pservers.role is Role.PSERVER
    # The gang is 2 workers and 2 servers; the rule ceil(2 * 3 / 2) then adds a third server.
    assert d.pservers.add_nodes == ("cpu", "cpu", "cpu"), "servers go where their CPU fits"
    assert d.pservers.target == 3
    assert settled(snap, p)


def test_a_job_at_its_worker_maximum_gets_the_servers_its_rule_gives() -> None:
    def at_maximum(started: float) -> Snapshot:
        p = job("p").min(2).max(2).cpu(1000).started(started).running(("gpu", 2))
        return snapshot(
            [node("gpu").gpus(2).cpu(2500), node("cpu").gpus(0).cpu(16000)],
            [p.pservers(2, 3, 4000, "cpu", "cpu")],
        )

    d = run(at_maximum(started=0.0)).decision("p")
    assert d.workers.target == 2 and d.pservers is not None
    assert d.pservers.target == 3 and d.pservers.add_nodes == ("cpu",), "ceil(2 * 3 / 2) = 3"
    cooling = run(at_maximum(started=900.0))
    assert cooling.is_empty, "within its cool-down it waits for the third server"


def test_growth_grows_servers_beside_workers_up_to_their_maximum() -> None:
    snap = snapshot(
        [node("n0").gpus(8)],
        [job("p").min(2).max(8).running(("n0", 2)).pservers(1, 3, 2000, "n0")],
    )
    p = run(snap)
    d = p.decision("p")
    assert d.workers.target == 8
    assert d.pservers is not None
    assert d.pservers.target == 3, "ceil(8 * 3 / 8) servers, never above the maximum of 3"
    assert len(d.pservers.add_nodes) == 2 and d.pservers.remove == ()
    assert settled(snap, p)


def test_server_growth_follows_the_worker_share_and_never_drops_below_minimum() -> None:
    snap = snapshot(
        [node("n0").gpus(4)],
        [job("p").min(1).max(8).running(("n0", 1)).pservers(2, 4, 2000, "n0", "n0")],
    )
    p = run(snap)
    d = p.decision("p")
    assert d.workers.target == 4
    assert d.pservers is not None and d.pservers.target == 2, "ceil(4 * 4 / 8) = 2 = minimum"
    assert d.pservers.remove == ()
    assert settled(snap, p)


def test_servers_grow_only_where_their_resources_fit() -> None:
    # The GPUs let the workers grow to 8, but the CPU left fits one more server, not three.
    snap = snapshot(
        [node("n0").gpus(8).cpu(8 * 1000 + 2 * 2000)],
        [job("p").min(2).max(8).cpu(1000).running(("n0", 2)).pservers(1, 4, 2000, "n0")],
    )
    p = run(snap)
    d = p.decision("p")
    assert d.pservers is not None
    assert d.workers.target == 8 and d.pservers.target == 2
    assert settled(snap, p)


def test_a_job_without_a_server_spec_gets_no_server_decision() -> None:
    snap = snapshot([node("n0").gpus(4)], [job("a").min(1).max(4)])
    assert run(snap).decision("a").pservers is None


def test_a_job_shrunk_to_admit_another_keeps_its_server_minimum() -> None:
    snap = snapshot(
        [node("n0").gpus(8)],
        [
            job("low").min(2).max(8).priority(1).running(("n0", 8))
            .pservers(2, 4, 2000, "n0", "n0", "n0", "n0"),
            job("high").min(4).max(4).priority(10).submitted(50),
        ],
    )  # fmt: skip
    p = run(snap)
    low = p.decision("low")
    assert low.action is Action.SHRINK and low.workers.target == 4
    assert low.pservers is not None and low.pservers.target >= 2
    assert p.decision("high").action is Action.START
    assert settled(snap, p)
