"""Growth on evidence (``Policy.ramp_s``, ``stability.may_ramp``): where a policy ramps, a
job grows only as far as its runtime's measurements vouch for, and often while they do.

Aspects:
- growth never takes a job past its requested size or twice the largest size it measured,
  whichever is larger: a job that measured nothing starts at its requested size among idle
  GPUs, one measured at one worker reaches two; a job that gives neither (no requested
  size, no measurement) is bounded by its maximum alone;
- a job on its way up (at the largest size it measured, its last step up measured worth the
  pause) grows again once ``ramp_s`` has passed since its last resize, within its cool-down;
  not before ``ramp_s``, and not when its last step up measured too little speed-up;
- ``on_its_way_up`` reads the measurements alone: a job that measured a larger size than
  it runs at is not on its way up;
- without ``ramp_s`` nothing changes (``test_exploration``: growth into idle GPUs is not
  limited).
"""

from __future__ import annotations

from dataclasses import replace

from edl_scheduler.core import Action, Reason, plan, preset
from edl_scheduler.core.margins import explored_limit
from edl_scheduler.core.policy import Policy
from edl_scheduler.core.snapshot import Job
from edl_scheduler.core.stability import on_its_way_up
from tests.core.builders import JobBuilder, job, nodes, snapshot

NOW = 10_000.0
RAMP_S = 60.0


def ramping() -> Policy:
    return replace(preset("edl"), ramp_s=RAMP_S)


def no_ramp() -> Policy:
    return replace(preset("edl"), ramp_s=None)


def grown_to_two(rate_at_two: float, resized_ago: float) -> JobBuilder:
    """A job measured at one worker (100 samples/s) and at two, running at two since it
    grew ``resized_ago`` seconds ago, within its cool-down."""
    return (
        job("up")
        .min(1)
        .max(16)
        .measured(1, 1, 100.0)
        .measured(1, 2, rate_at_two)
        .started(NOW - 500, resized=NOW - resized_ago)
        .running(("n0", 2))
    )


def test_a_job_that_measured_nothing_starts_at_its_requested_size() -> None:
    asking = job("asking").min(1).max(8).requested(3).submitted(NOW - 10)
    started = plan(snapshot(nodes(1), [asking]), ramping(), NOW).decision("asking")
    assert started.action is Action.START and started.workers.target == 3, started.message
    assert started.reason is Reason.AWAITING_MEASUREMENT
    assert "held at 3 workers (its requested size)" in started.message
    unbounded = plan(snapshot(nodes(1), [asking]), no_ramp(), NOW).decision("asking")
    assert unbounded.workers.target == 8  # the prior's word alone, without the rule


def test_a_job_that_asks_its_minimum_starts_there() -> None:
    small = job("small").min(1).max(8).requested(1).submitted(NOW - 10)
    started = plan(snapshot(nodes(1), [small]), ramping(), NOW).decision("small")
    assert started.action is Action.START and started.workers.target == 1, started.message
    assert started.reason is Reason.AWAITING_MEASUREMENT


def test_a_job_with_nothing_to_go_by_is_bounded_by_its_maximum() -> None:
    # No requested size and a runtime that reports no throughput: nothing would ever
    # raise an evidence bound, so growth treats it as without the rule.
    blind = job("blind").min(1).max(8).submitted(NOW - 10)
    started = plan(snapshot(nodes(1), [blind]), ramping(), NOW).decision("blind")
    assert started.action is Action.START and started.workers.target == 8, started.message


def test_the_limit_is_the_larger_of_requested_and_twice_measured() -> None:
    def limit(requested: int | None, measured: int, lo: int = 1, hi: int = 16) -> int:
        built = job("j").min(lo).max(hi)
        if requested is not None:
            built = built.requested(requested)
        if measured:
            built = built.measured(1, measured, 100.0)
        return explored_limit(built.build(), lo, hi)

    assert limit(None, 0) == 1
    assert limit(None, 3) == 6
    assert limit(4, 1) == 4
    assert limit(4, 3) == 6
    assert limit(4, 0, lo=5) == 5
    assert limit(12, 0, hi=10) == 10


def test_past_its_cool_down_a_job_reaches_twice_what_it_measured() -> None:
    young = job("young").min(1).max(8).measured(1, 1, 100.0).started(NOW - 1000)
    grew = plan(snapshot(nodes(1), [young.running(("n0", 1))]), ramping(), NOW).decision("young")
    assert grew.action is Action.GROW and grew.workers.target == 2, grew.message
    assert grew.reason is Reason.AWAITING_MEASUREMENT
    assert grew.message.startswith("grew 1->2 into idle GPUs; below maximum, held at 2 workers")
    assert "(twice the largest size it measured)" in grew.message


def test_on_its_way_up_it_grows_again_after_the_ramp_interval() -> None:
    up = grown_to_two(190.0, RAMP_S + 1)
    grew = plan(snapshot(nodes(1), [up]), ramping(), NOW).decision("up")
    assert grew.action is Action.GROW and grew.workers.target == 4, grew.message
    held = plan(snapshot(nodes(1), [up]), no_ramp(), NOW).decision("up")
    assert held.reason is Reason.COOLING_DOWN  # the same job, without the rule


def test_not_before_the_ramp_interval() -> None:
    up = grown_to_two(190.0, RAMP_S - 1)
    held = plan(snapshot(nodes(1), [up]), ramping(), NOW).decision("up")
    assert held.reason is Reason.COOLING_DOWN, held.message


def test_not_when_its_last_step_up_measured_too_little() -> None:
    # 1% faster at two: 6 s gained over the 600 s horizon, less than the 10 s pause
    flat = grown_to_two(101.0, RAMP_S + 1)
    held = plan(snapshot(nodes(1), [flat]), ramping(), NOW).decision("up")
    assert held.reason is Reason.COOLING_DOWN, held.message


def test_on_its_way_up_reads_the_measurements() -> None:
    def measured(*sizes: tuple[int, float]) -> Job:
        built = job("j").min(1).max(8)
        for workers, rate in sizes:
            built = built.measured(1, workers, rate)
        return built.build()

    assert on_its_way_up(measured((1, 100.0)), 1, 10.0, 600.0)
    assert not on_its_way_up(measured((1, 100.0), (4, 350.0)), 1, 10.0, 600.0)
    assert not on_its_way_up(measured(), 1, 10.0, 600.0)
    assert on_its_way_up(measured((1, 100.0), (2, 190.0)), 2, 10.0, 600.0)
    assert not on_its_way_up(measured((1, 100.0), (2, 101.0)), 2, 10.0, 600.0)
