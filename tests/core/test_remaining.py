"""Rebalancing weighs each job by what it has left (``core/remaining.py``).

Aspects:
- weights by position from the most time left at one worker, ``(i / m) ** 2``: the job
  with least left counts 1; time left at one worker is samples left over the rate its
  fitted throughput gives at one worker, the same at any size the job holds;
- a job that reports nothing, or has measured nothing, takes the median reporter's
  weight; where none reports there are no weights;
- the rebalancing move that the unweighted objective would not make (two jobs of one
  curve at 4 and 4 workers) is made toward the job with less left, and none is made back;
- a status progress report gives the samples left (``building.remaining_from_status``);
  a report without whole numbers gives None; a negative count is refused with the field
  named.
"""

from __future__ import annotations

import pytest

from edl_scheduler.api import TrainingJobStatus
from edl_scheduler.core import Action, apply_plan, plan, preset
from edl_scheduler.core.building import remaining_from_status
from edl_scheduler.core.remaining import RANK_EXPONENT, left_at_one, weights
from tests.core.builders import JobBuilder, job, nodes, snapshot

NOW = 1000.0


def curve(name: str) -> JobBuilder:
    """A near-linear curve: 4 workers measured 3.8x one."""
    return job(name).min(1).max(8).measured(1, 1, 100.0).measured(1, 4, 380.0)


def member_weights(*builders: JobBuilder) -> dict[str, float]:
    """Each job's weight, its rank its place in ``builders``."""
    jobs = [b.build() for b in builders]
    got = weights(list(enumerate(jobs)))
    return {j.name: got[rank] for rank, j in enumerate(jobs) if rank in got}


def test_the_job_with_least_left_counts_fully_the_longest_least() -> None:
    got = member_weights(
        curve("long").left(3.8e6).running(("n0", 4)),
        curve("mid").left(3.8e5).running(("n1", 4)),
        curve("short").left(3.8e4).running(("n0", 4)),
    )
    assert got["short"] == 1.0
    assert got["mid"] == pytest.approx((2 / 3) ** RANK_EXPONENT)
    assert got["long"] == pytest.approx((1 / 3) ** RANK_EXPONENT)


def test_time_left_is_counted_at_one_worker_whatever_the_size() -> None:
    """``wide`` has fewer samples left, but runs slower at one worker (its fit); and a
    job's weight is the same at any size it holds (a plan applied changes no weight)."""
    slow = job("wide").min(1).max(8).measured(1, 1, 50.0).measured(1, 4, 190.0).left(1.5e5)
    got = member_weights(slow.running(("n0", 4)), curve("narrow").left(2.0e5).running(("n1", 1)))
    assert got == {"wide": pytest.approx(0.25), "narrow": 1.0}  # 3,000 s against 2,000 s
    assert left_at_one(curve("a").left(1e5).running(("n0", 4)).build()) == pytest.approx(
        left_at_one(curve("a").left(1e5).running(("n0", 1)).build())
    )


def test_a_job_that_reports_nothing_takes_the_median_weight() -> None:
    got = member_weights(
        curve("a").left(1.0e4).running(("n0", 1)),
        curve("b").left(1.0e6).running(("n0", 1)),
        curve("c").left(1.0e5).running(("n1", 1)),
        curve("silent").running(("n1", 1)),
        job("unmeasured").min(1).max(8).left(10.0).running(("n1", 1)),
    )
    assert got["b"] < got["c"] < got["a"] == 1.0
    assert got["silent"] == got["c"] == pytest.approx((2 / 3) ** RANK_EXPONENT)
    assert member_weights(curve("x").running(("n0", 4)), curve("y").running(("n1", 4))) == {}


def test_a_move_goes_to_the_job_with_less_left() -> None:
    """Two jobs of one curve at 4 workers each: the unweighted objective moves nothing;
    with ``short`` near its end and ``long`` far from it, a worker goes to ``short``."""
    even = [curve("long").running(("n0", 4)), curve("short").running(("n0", 4))]
    assert plan(snapshot(nodes(1), even), preset("edl"), NOW).is_empty
    snap = snapshot(
        nodes(1),
        [
            curve("long").left(3.8e7).running(("n0", 4)),
            curve("short").left(3.8e4).running(("n0", 4)),
        ],
    )
    p = plan(snap, preset("edl"), NOW)
    taken, given = p.decision("short"), p.decision("long")
    assert taken.action is Action.GROW and given.action is Action.SHRINK
    assert given.for_job == "short"
    assert plan(apply_plan(snap, p), preset("edl"), NOW).is_empty


def test_the_status_progress_gives_the_samples_left() -> None:
    report = {"epochs": 3, "samplesPerEpoch": 1000, "samplesDone": 1200, "epoch": 1}
    assert remaining_from_status(TrainingJobStatus(progress=report)) == 1800.0
    assert remaining_from_status(TrainingJobStatus()) is None
    partial = {"epochs": 3, "samplesPerEpoch": "many", "samplesDone": 1200}
    assert remaining_from_status(TrainingJobStatus(progress=partial)) is None


def test_a_negative_count_left_is_refused_with_its_field() -> None:
    with pytest.raises(ValueError, match="remaining_samples"):
        curve("a").left(-1.0).build()
