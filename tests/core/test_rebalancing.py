"""Rebalancing: workers move from a running job that uses them poorly to one that uses them
well, within the planner's rules (``core/rebalancing.py``).

Aspects:
- a job whose measured throughput is flat gives workers to one that scales, GPU for GPU on
  the same node; each decision names the other job and the predicted speed-ups; the plan is
  a fixed point once applied (invariant 6);
- no move within the donor's minimum run or cool-down, or the recipient's cool-down unless
  it is on its way up (``stability.may_ramp``, as growth);
- no move whose gain does not pay for the pauses (two jobs of one flat curve at unequal
  sizes); on a near-linear curve the slower job takes one from the faster (fairness);
- a higher-priority job never gives to a lower-priority one; non-preemptible jobs never give;
- policies that do not grow by marginal gain (``edl-fulfillment``) never rebalance.
"""

from __future__ import annotations

from edl_scheduler.core import Action, Plan, Reason, Snapshot, apply_plan, plan, preset
from tests.core.builders import JobBuilder, job, nodes, snapshot

NOW = 1000.0


def run(snap: Snapshot, now: float = NOW, policy: str = "edl") -> Plan:
    return plan(snap, preset(policy), now)


def flat(name: str = "flat") -> JobBuilder:
    """Six workers measured barely faster than one: most of them are wasted."""
    return job(name).min(1).max(8).measured(1, 1, 100.0).measured(1, 6, 130.0)


def scales(name: str = "scales") -> JobBuilder:
    """Two workers measured twice as fast as one: more would help."""
    return job(name).min(1).max(8).measured(1, 1, 100.0).measured(1, 2, 198.0)


def test_workers_move_from_a_flat_job_to_one_that_scales() -> None:
    snap = snapshot(nodes(1), [flat().running(("n0", 6)), scales().running(("n0", 2))])
    p = run(snap)
    given, taken = p.decision("flat"), p.decision("scales")
    assert given.action is Action.SHRINK and taken.action is Action.GROW
    moved = given.workers.current - given.workers.target
    assert moved >= 1
    assert taken.workers.target - taken.workers.current == moved
    assert taken.workers.add_nodes == ("n0",) * moved  # the very GPUs the donor frees
    assert given.reason is Reason.REBALANCED and given.for_job == "scales"
    assert "scales" in given.message and "flat" in taken.message
    assert taken.reason is Reason.GREW and "predicted speed-up" in taken.message
    again = run(apply_plan(snap, p))
    assert again.is_empty, [d.message for d in again.changes]


def test_no_move_within_minimum_run_or_cool_down() -> None:
    young = snapshot(
        nodes(1), [flat().started(NOW - 100).running(("n0", 6)), scales().running(("n0", 2))]
    )
    assert run(young).is_empty
    cooling = snapshot(
        nodes(1),
        [flat().running(("n0", 6)), scales().started(0, resized=NOW - 30).running(("n0", 2))],
    )
    assert run(cooling).is_empty
    donor_cooling = snapshot(
        nodes(1),
        [flat().started(0, resized=NOW - 60).running(("n0", 6)), scales().running(("n0", 2))],
    )
    assert run(donor_cooling).is_empty


def test_a_job_on_its_way_up_takes_workers_before_its_cool_down_ends() -> None:
    """Past the ramp interval (60 s under ``edl``) and with its last step up paid by what it
    measured (``stability.may_ramp``), a recipient within its cool-down takes workers, as
    growth would give it idle ones; one not on its way up (back at a size below one it
    measured) waits."""
    ramping = snapshot(
        nodes(1),
        [flat().running(("n0", 6)), scales().started(0, resized=NOW - 60).running(("n0", 2))],
    )
    p = run(ramping)
    assert p.decision("scales").action is Action.GROW
    assert p.decision("flat").reason is Reason.REBALANCED

    def back_down(resized: float) -> Snapshot:
        """``scales`` back at 2 after running at 4: not on its way up."""
        down = scales().measured(1, 4, 390.0).started(0, resized=resized).running(("n0", 2))
        return snapshot(nodes(1), [flat().running(("n0", 6)), down])

    assert run(back_down(NOW - 60)).is_empty
    assert run(back_down(NOW - 400)).decision("scales").action is Action.GROW  # cooled down


def test_no_move_whose_gain_does_not_pay_for_the_pauses() -> None:
    def same(name: str) -> JobBuilder:
        return job(name).min(1).max(8).measured(1, 1, 100.0).measured(1, 4, 200.0)

    snap = snapshot(nodes(1), [same("a").running(("n0", 5)), same("b").running(("n0", 3))])
    assert run(snap).is_empty


def test_a_slow_job_gets_a_worker_from_a_fast_one_of_the_same_curve() -> None:
    """The objective leans to fairness (Pollux's power mean, p = -1): at 5 and 3 workers of
    one near-linear curve the sum of speed-ups would not move, the mean of -1/speed-up does."""

    def same(name: str) -> JobBuilder:
        return job(name).min(1).max(8).measured(1, 1, 100.0).measured(1, 4, 380.0)

    snap = snapshot(nodes(1), [same("a").running(("n0", 5)), same("b").running(("n0", 3))])
    p = run(snap)
    assert p.decision("a").workers.target == 4 and p.decision("a").for_job == "b"
    assert p.decision("b").workers.target == 4
    assert run(apply_plan(snap, p)).is_empty


def test_priority_and_preemptibility_bound_the_donors() -> None:
    high = snapshot(nodes(1), [flat().priority(5).running(("n0", 6)), scales().running(("n0", 2))])
    assert run(high).is_empty
    pinned = snapshot(
        nodes(1), [flat().not_preemptible().running(("n0", 6)), scales().running(("n0", 2))]
    )
    assert run(pinned).is_empty
    low = snapshot(nodes(1), [flat().running(("n0", 6)), scales().priority(5).running(("n0", 2))])
    assert run(low).decision("flat").reason is Reason.REBALANCED


def test_fulfillment_policy_never_rebalances() -> None:
    snap = snapshot(nodes(1), [flat().running(("n0", 6)), scales().running(("n0", 2))])
    assert all(
        d.reason is not Reason.REBALANCED for d in run(snap, policy="edl-fulfillment").decisions
    )
