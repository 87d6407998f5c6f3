"""Retreat (``retreating``): a running job that its own measurements say runs faster at a
smaller size goes back to it.

Aspects:
- a job measured much slower on eight workers over three nodes than on four of one node goes
  back to four on its fullest node, its oldest workers kept, and says why;
- what it frees starts a waiting job in the same cycle;
- no retreat within its minimum run, for a job that scales, for one measured at one worker
  only (its model of more is the prior's), for one measured at one worker and at six alone
  (the fit's best size between them is a guess), for one that cannot be preempted, or under
  a policy that does not grow by marginal gain;
- the speed-up must pay the pause over the horizon;
- ``best_retreat`` looks only at faster sizes the measurements give evidence for, from the
  minimum, and takes the smaller size on a tie.
"""

from __future__ import annotations

from dataclasses import replace

from edl_scheduler.core import Action, Reason, plan, preset
from edl_scheduler.core.retreating import best_retreat
from edl_scheduler.core.throughput import ThroughputModel
from tests.core.builders import JobBuilder, job, nodes, snapshot

NOW = 1000.0


def wide(name: str = "wide") -> JobBuilder:
    """Fastest on the four GPUs of one node: across nodes, its batch is mostly
    synchronization (as a fixed-batch yolov3 in the Pollux profiles)."""
    return (
        job(name)
        .min(1)
        .max(16)
        .priority(10)
        .measured(1, 1, 25.0)
        .measured(1, 4, 72.0)
        .measured(3, 8, 39.0)
    )


def test_a_job_slower_across_nodes_goes_back_to_its_fastest_size() -> None:
    snap = snapshot(nodes(3, gpus=4), [wide().running(("n1", 2), ("n0", 4), ("n2", 2))])
    decision = plan(snap, preset("edl"), NOW).decision("wide")
    assert decision.action is Action.SHRINK, decision.message
    assert decision.reason is Reason.RETREATED
    assert decision.workers.target == 4
    # the two on n1 and the two on n2 leave; the four on n0 stay
    assert sorted(decision.workers.remove) == ["wide-w0", "wide-w1", "wide-w6", "wide-w7"]
    assert decision.message.startswith("shrunk 8->4 on 1 node")


def test_what_it_frees_starts_a_waiting_job_in_the_same_cycle() -> None:
    waiting = job("next").min(4).max(4).submitted(900.0)
    snap = snapshot(nodes(3, gpus=4), [wide().running(("n0", 4), ("n1", 2), ("n2", 2)), waiting])
    p = plan(snap, preset("edl"), NOW)
    assert p.decision("wide").reason is Reason.RETREATED
    started = p.decision("next")
    assert started.action is Action.START and started.workers.target == 4, started.message


def test_no_retreat_before_its_minimum_run() -> None:
    young = wide().started(NOW - 100.0).running(("n0", 4), ("n1", 2), ("n2", 2))
    decision = plan(snapshot(nodes(3, gpus=4), [young]), preset("edl"), NOW).decision("wide")
    assert decision.reason is not Reason.RETREATED
    assert decision.workers.target == 8, decision.message


def test_a_job_that_scales_keeps_its_size() -> None:
    scales = job("scales").min(1).max(8).measured(1, 1, 25.0).measured(1, 4, 90.0)
    scales = scales.measured(2, 8, 170.0).running(("n0", 4), ("n1", 4))
    decision = plan(snapshot(nodes(2, gpus=4), [scales]), preset("edl"), NOW).decision("scales")
    assert decision.action is Action.KEEP, decision.message


def test_a_job_measured_at_one_worker_only_keeps_its_size() -> None:
    # Its model of more workers is the prior's (its measurement at eight is what it has)
    one = job("one").min(1).max(8).measured(1, 1, 25.0).running(("n0", 4), ("n1", 4))
    decision = plan(snapshot(nodes(2, gpus=4), [one]), preset("edl"), NOW).decision("one")
    assert decision.action is Action.KEEP, decision.message


def test_the_speed_up_must_pay_the_pause() -> None:
    # About 85% faster on four of one node: over the 600 s horizon that pays a 300 s
    # pause, not a 600 s one
    snap = snapshot(nodes(3, gpus=4), [wide().running(("n0", 4), ("n1", 2), ("n2", 2))])
    paid = plan(snap, replace(preset("edl"), resize_pause_s=300.0), NOW).decision("wide")
    assert paid.reason is Reason.RETREATED, paid.message
    unpaid = plan(snap, replace(preset("edl"), resize_pause_s=600.0), NOW).decision("wide")
    assert unpaid.action is Action.KEEP, unpaid.message


def test_a_job_that_cannot_be_preempted_keeps_its_size() -> None:
    kept = wide().not_preemptible().running(("n0", 4), ("n1", 2), ("n2", 2))
    decision = plan(snapshot(nodes(3, gpus=4), [kept]), preset("edl"), NOW).decision("wide")
    assert decision.action is Action.KEEP, decision.message


def test_policies_that_grow_by_fulfillment_do_not_retreat() -> None:
    snap = snapshot(nodes(3, gpus=4), [wide().running(("n0", 4), ("n1", 2), ("n2", 2))])
    decision = plan(snap, preset("edl-fulfillment"), NOW).decision("wide")
    assert decision.reason is not Reason.RETREATED
    assert decision.workers.target == 8, decision.message


def test_a_job_measured_at_one_worker_and_at_six_alone_keeps_its_six() -> None:
    # The fit of those two puts its best size at two (158 samples/s against 130 at six): a
    # guess between two measurements of which only one synchronizes
    flat = job("flat").min(1).max(8).measured(1, 1, 100.0).measured(1, 6, 130.0)
    snap = snapshot(nodes(1), [flat.running(("n0", 6))])
    decision = plan(snap, preset("edl"), NOW).decision("flat")
    assert decision.action is Action.KEEP, decision.message


ONE = frozenset({(1, True)})


def test_the_best_size_is_one_the_measurements_give_evidence_for() -> None:
    # Linear on one node, a step eleven times as long across nodes: on (3, 3) the best
    # smaller size is the three of the fuller node where its measurements reach it
    linear = ThroughputModel(1.0, 0.0, 0.0, 10.0, 0.0)
    gain3, gain2 = 3 / (6 / 11) - 1.0, 2 / (6 / 11) - 1.0
    measured = ONE | {(6, False), (2, True)}
    assert best_retreat(linear, (3, 3), 1, measured) == (3, 1, gain3)
    # measured at two at most: no larger size counts
    assert best_retreat(linear, (3, 3), 1, ONE | {(2, True)}) == (2, 1, gain2)
    # at four on one node, and at two: three lies between
    assert best_retreat(linear, (3, 3), 1, ONE | {(4, True), (2, True)}) == (3, 1, gain3)
    # at four on one node alone: below it the fit's shape is a guess; one worker is measured
    assert best_retreat(linear, (3, 3), 1, ONE | {(4, True)}) == (1, 1, 1 / (6 / 11) - 1.0)
    assert best_retreat(linear, (3, 3), 2, ONE | {(4, True)}) is None
    assert best_retreat(linear, (3, 3), 4, measured) is None  # its minimum is four


def test_a_tie_goes_to_the_smaller_size() -> None:
    # One worker and two on one node run equally fast (a second doubles the step)
    model = ThroughputModel(1.0, 1.0, 0.0, 10.0, 0.0)
    found = best_retreat(model, (2, 2), 1, ONE | {(2, True), (4, False)})
    assert found is not None and found[:2] == (1, 1)


def test_a_job_that_scales_is_never_sent_back() -> None:
    model = ThroughputModel(1.0, 0.05, 0.01, 0.1, 0.02)
    assert best_retreat(model, (4, 4), 1, ONE | {(4, True), (8, False)}) is None
