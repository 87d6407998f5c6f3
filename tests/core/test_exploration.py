"""Rebalancing trusts a job's model only near the sizes it has measured
(``rebalancing.explored_limit``, as Pollux bounds a job by twice its largest profiled size).

Aspects:
- a job measured only at one worker takes at most one worker from a flat donor in a cycle,
  however linear the prior it is predicted by; once measured at two it may reach four;
- a job that has measured nothing takes nothing by rebalancing (its minimum is its limit,
  or its requested size where it gives one: ``test_ramping``);
- the limit never exceeds the job's maximum nor falls below its minimum;
- growth into idle GPUs is not limited where the policy does not grow on evidence
  (``Policy.ramp_s`` None; the ``edl`` preset does: ``test_ramping``).
"""

from __future__ import annotations

from dataclasses import replace

from edl_scheduler.core import Action, Reason, plan, preset
from edl_scheduler.core.margins import explored_limit
from edl_scheduler.core.session import open_session
from tests.core.builders import JobBuilder, job, nodes, snapshot

NOW = 1000.0


def flat() -> JobBuilder:
    """Seven workers measured barely faster than one: most of them are wasted."""
    return job("flat").min(1).max(8).measured(1, 1, 100.0).measured(1, 7, 110.0)


def test_a_job_measured_at_one_worker_takes_one_more_at_most() -> None:
    young = job("young").min(1).max(8).measured(1, 1, 100.0)
    snap = snapshot(nodes(1), [flat().running(("n0", 7)), young.running(("n0", 1))])
    p = plan(snap, preset("edl"), NOW)
    taken = p.decision("young")
    assert taken.action is Action.GROW and taken.workers.target == 2, taken.message
    assert p.decision("flat").reason is Reason.REBALANCED


def test_measured_at_two_workers_it_may_reach_four() -> None:
    grown = job("grown").min(1).max(8).measured(1, 1, 100.0).measured(1, 2, 199.0)
    snap = snapshot(nodes(1), [flat().running(("n0", 6)), grown.running(("n0", 2))])
    taken = plan(snap, preset("edl"), NOW).decision("grown")
    assert taken.action is Action.GROW and taken.workers.target == 4, taken.message


def test_a_job_that_measured_nothing_takes_nothing_by_rebalancing() -> None:
    blind = job("blind").min(1).max(8)
    snap = snapshot(nodes(1), [flat().running(("n0", 7)), blind.running(("n0", 1))])
    p = plan(snap, preset("edl"), NOW)
    assert p.decision("blind").action is Action.KEEP
    assert p.decision("flat").action is Action.KEEP


def test_the_limit_stays_within_the_bounds() -> None:
    big = job("big").min(3).max(5).measured(1, 4, 400.0).running(("n0", 3))
    small = job("small").min(2).max(8).running(("n0", 2))
    session = open_session(snapshot(nodes(1), [big, small]), preset("edl"), NOW)
    limits = {js.name: explored_limit(js.job, js.lo, js.hi) for js in session.jobs}
    assert limits == {"big": 5, "small": 2}


def test_growth_into_idle_gpus_is_not_limited_without_growth_on_evidence() -> None:
    young = job("young").min(1).max(8).measured(1, 1, 100.0).running(("n0", 1))
    trusting = replace(preset("edl"), ramp_s=None)
    grew = plan(snapshot(nodes(1), [young]), trusting, NOW).decision("young")
    assert grew.action is Action.GROW and grew.workers.target == 8, grew.message
