"""A job's kept margins (``core/margins.py``) against the formulas they stand for.

Rebalancing and growth read a job's speed-ups, growth score and move bounds from its kept
``Margins`` rather than fitting its model again; the engine-level equality tests compare a
run with them against a run that also reads them, so this file checks them against the
plain formulas: the fitted model's speed-ups at the job's live size, one more and one fewer
worker; growth's rank term; and the bounds, which must hold at every restart factor in
[0, 1] (the only way time enters a move's value)."""

from __future__ import annotations

import pytest

from edl_scheduler.core import preset
from edl_scheduler.core.session import open_session
from edl_scheduler.core.snapshot import Role
from edl_scheduler.core.throughput import job_model
from tests.core.builders import JobBuilder, job, nodes, snapshot

NOW = 5000.0
FACTORS = (0.0, 1e-9, 0.05, 0.5, 0.93, 1.0)


def _jobs() -> list[JobBuilder]:
    return [
        job("flat").min(1).max(8).measured(1, 1, 100.0).measured(1, 7, 110.0).running(("n0", 7)),
        job("young").min(1).max(8).measured(1, 1, 100.0).running(("n1", 1)),
        job("spread").min(2).max(16).measured(2, 4, 390.0).running(("n1", 2), ("n2", 2)),
        job("blind").min(1).max(4).running(("n2", 1)),
        job("atmin").min(3).max(6).measured(1, 3, 250.0).running(("n3", 3)),
        job("atmax").min(1).max(2).measured(1, 2, 190.0).running(("n3", 2)),
    ]


def _charged(speedup: float, factor: float) -> float:
    """``-1 / speed-up`` at a changed allocation, charged by the restart factor."""
    up = speedup * factor
    return -1.0 / up if up > 0 else float("-inf")


@pytest.mark.parametrize("policy_name", ["edl", "edl-fulfillment"])
def test_margins_are_the_models_values_and_bound_every_move(policy_name: str) -> None:
    policy = preset(policy_name)
    session = open_session(snapshot(nodes(4), _jobs()), policy, NOW)
    horizon, pause_s = policy.gain_horizon_s, policy.resize_pause_s
    for js in session.jobs:
        kept = js.worth(policy)
        model = job_model(js.job)
        live = js.live[Role.WORKER]
        workers, count = len(live), max(1, js.node_count(session.cluster))
        assert (kept.workers, kept.nodes) == (workers, count), js.name
        at = model.speedup(count, workers)
        above = model.speedup(count, workers + 1)
        below = model.speedup(count, workers - 1) if workers > 1 else 0.0
        assert (kept.at, kept.above, kept.below) == (at, above, below), js.name
        assert kept.growth_score == -round(above - at, 9), js.name
        pause = pause_s / at if at > 0 else 0.0
        assert kept.pause == pause, js.name
        for factor in FACTORS:
            if workers < kept.limit:
                gain = (_charged(above, factor) - (-1.0 / at)) * horizon - pause
                assert gain <= kept.best_gain, (js.name, factor)
            else:
                assert kept.best_gain == float("-inf"), js.name
            if workers > max(1, js.lo):
                loss = (-1.0 / at - _charged(below, factor)) * horizon + pause
                assert loss >= kept.least_loss, (js.name, factor)
            else:
                assert kept.least_loss == float("inf"), js.name
        assert js.worth(policy) is kept  # derived once per Job object


def test_a_new_job_object_gets_new_margins() -> None:
    """Kept state follows the very Job object: a job that measured more is a new object."""
    policy = preset("edl")
    before = job("young").min(1).max(8).measured(1, 1, 100.0).running(("n0", 1))
    after = job("young").min(1).max(8).measured(1, 1, 100.0).measured(1, 2, 30.0)
    first = open_session(snapshot(nodes(1), [before]), policy, NOW)
    second = open_session(snapshot(nodes(1), [after.running(("n0", 1))]), policy, NOW)
    a, b = (s.jobs[0].worth(policy) for s in (first, second))
    assert b.above != a.above and b.above == job_model(second.jobs[0].job).speedup(1, 2)
