"""T1: rebalancing's exact moveless proof and its candidate pool change no step.

Two shortcuts of ``core.rebalancing``, each checked at every rebalancing step of engine runs
under elastic ``edl`` (the first 300 Philly jobs on 16 x 8 GPUs, where queues form, and a
synthetic workload with two priority levels on 4 x 8):

- The step reads only ``growing.Grower``'s pool (the candidates and the jobs at their
  maximum) instead of every job: its takers and givers from the pool equal those from every
  job of the session, in the same order.
- ``_no_move_can_pay`` compares first gains and losses computed at this plan's restart
  factor (``margins.first_gain`` / ``first_loss``): wherever it calls a step moveless, the
  step run in full (no proof, no kept bounds) makes no move. The first values are also
  checked to be the very floats the step computes for an unmoved member.

Growth's heap (``growing._scored``, ``_score`` written out for unmoved jobs) is checked
against ``_score`` at every hand-out of the same runs.

Seen to fail: with the jobs at their maximum left out of the pool (the givers differ), with
``first_loss`` counting the pause twice (a step it called moveless moved a worker), and with
``_scored``'s fulfillment taken from one worker more.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import pytest

from edl_scheduler.core import growing, preset, rebalancing
from edl_scheduler.core.margins import explored_limit, first_gain, first_loss
from edl_scheduler.core.session import JobState, Session
from edl_scheduler.core.stability import (
    cooling_until,
    may_ramp,
    may_shrink_voluntarily,
    restart_factor,
)
from simulations.engine import SimConfig, simulate
from simulations.synthetic import SyntheticSpec, generate
from simulations.traces import default_traces, load_cluster, load_philly, load_pollux
from simulations.workload import ClusterSpec, Elasticity, ScalingRule, SimJob, shape

PHILLY = default_traces() / "pollux" / "traces" / "philly.csv"


@dataclass
class _Seen:
    steps: int = 0
    pooled: int = 0
    proven: int = 0
    unproven_moves: int = 0
    values: int = 0
    scored: int = 0
    weighted: int = 0


def _check_first_values(
    step: rebalancing.Rebalancer, takers: list[JobState], weights: dict[int, float]
) -> int:
    """``first_gain`` / ``first_loss`` against the step's own ``_gain`` / ``_loss``, each
    times the job's weight (``remaining``) as the proof counts them."""
    s, horizon, checked = step.s, step.s.policy.gain_horizon_s, 0
    for js in takers:
        w = weights.get(js.rank, 1.0)
        member = rebalancing._Member(js, s, True, True, w)
        factor = restart_factor(s, js)
        gain = w * first_gain(js.worth(s.policy), factor, horizon)
        assert gain == step._gain(member), js.name
        if js.workers > max(1, js.lo):
            loss = w * first_loss(js.worth(s.policy), factor, horizon)
            assert loss == step._loss(member), js.name
        checked += 1
    return checked


def _reference_split(s: Session, jobs: list[JobState]) -> tuple[list[JobState], list[JobState]]:
    """``Rebalancer.split`` as the step split its jobs before it read growth's pool and
    left cooling jobs out (``explored_limit`` where the split reads the kept limit; the
    cycle's own moves and holds; a cooling job on its way up a taker); a cooling job it
    leaves out of the givers must be one that ``may_shrink_voluntarily`` refuses (so it
    never gave)."""
    w = rebalancing._W
    takers: list[JobState] = []
    givers: list[JobState] = []
    for js in jobs:
        job = js.job
        if not js.workers or js.workers < js.lo or js.suspended or js.started:
            continue
        if job.suspended or job.pserver is not None or job.worker.resources.gpu <= 0:
            continue
        if js.for_job is not None or js.added[w] or js.removed[w]:
            continue
        if id(js.reason) in rebalancing._HELD:
            continue
        cooling = cooling_until(s, js) is not None
        if js.size() < explored_limit(js.job, js.lo, js.hi):
            # (a cooling job on its way up takes, as growth gives it idle GPUs)
            if not cooling or (s.policy.ramp_s is not None and may_ramp(s, js)):
                takers.append(js)
        elif js.size() > max(1, js.lo) and job.preemptible:
            if cooling:
                assert not may_shrink_voluntarily(s, js), js.name
            else:
                givers.append(js)
    return takers, givers


@pytest.fixture
def seen(monkeypatch: pytest.MonkeyPatch) -> Iterator[_Seen]:
    """Wraps every step: the pool against every job, the proof against the full step."""
    counts = _Seen()
    run = rebalancing.Rebalancer.run

    def checked_run(self: rebalancing.Rebalancer) -> int:
        s = self.s
        pooled = self.pool is not None
        if pooled:
            assert self.pool is not None
            assert self.split(self.pool) == self.split(s.jobs) == _reference_split(s, s.jobs)
            counts.pooled += 1
        takers, givers = self.split(s.jobs)
        weights = self.weigh(takers + givers)
        counts.weighted += bool(weights)
        proven = bool(takers) and rebalancing._no_move_can_pay(takers, givers, s, weights)
        if counts.steps % 7 == 0:
            counts.values += _check_first_values(self, takers, weights)
        monkeypatch.setattr(rebalancing, "USE_KEPT_BOUNDS", False)
        try:
            moves = run(self)  # the full step: no proof, every giver valued
        finally:
            monkeypatch.setattr(rebalancing, "USE_KEPT_BOUNDS", True)
        counts.steps += 1
        if proven:
            counts.proven += 1
            assert moves == 0, f"a step proven moveless moved {moves} workers at t={s.now}"
        elif moves:
            counts.unproven_moves += 1
        return moves

    scored = growing._scored

    def checked_scored(
        jobs: list[JobState], session: Session
    ) -> list[tuple[tuple[float, ...], int, JobState]]:
        found = scored(jobs, session)
        assert found == [(growing._score(js, session), i, js) for i, js in enumerate(jobs)]
        counts.scored += len(jobs)
        return found

    monkeypatch.setattr(rebalancing.Rebalancer, "run", checked_run)
    monkeypatch.setattr(growing, "_scored", checked_scored)
    yield counts


def _run(jobs: Sequence[SimJob], cluster: ClusterSpec, seen: _Seen) -> None:
    result = simulate(jobs, cluster, preset("edl"), SimConfig())
    assert any(r.end is not None for r in result.jobs)
    # The checks mean something only where the proof fired and steps still moved workers.
    assert seen.pooled == seen.steps > 0
    assert seen.proven > 0 and seen.unproven_moves > 0 and seen.values > 0
    assert seen.scored > 0


def test_philly_prefix_under_contention(seen: _Seen) -> None:
    cluster = load_cluster("16x8")
    jobs = shape(
        load_philly(PHILLY, cluster, limit=300).jobs,
        elasticity=Elasticity.ELASTIC,
        scaling=ScalingRule.parse("amdahl:0.1"),
        cluster=cluster,
        seed=0,
    )
    _run(jobs, cluster, seen)


def test_synthetic_contention_with_priorities(seen: _Seen) -> None:
    cluster = ClusterSpec(4, 8)
    spec = SyntheticSpec(jobs=160, arrivals_per_hour=40.0, priority_mix=((0, 0.7), (1, 0.3)))
    jobs = shape(
        generate(spec, seed=3).jobs,
        elasticity=Elasticity.ELASTIC,
        scaling=ScalingRule.parse("amdahl:0.1"),
        cluster=cluster,
        seed=3,
    )
    _run(jobs, cluster, seen)


def test_pollux_workload_whose_jobs_report_what_they_have_left(seen: _Seen) -> None:
    """Profiled jobs report their remaining samples: the steps are weighted (``remaining``)
    and the proof, which counts each bound by its job's weight, still holds."""
    cluster = load_cluster("16x4")
    root = default_traces() / "pollux"
    workload = load_pollux(root / "workloads" / "workload-6.csv", root / "traces", cluster)
    jobs = shape(
        workload.jobs[:60],
        elasticity=Elasticity.ELASTIC,
        scaling=ScalingRule(0.0, 0.0),
        cluster=cluster,
        seed=0,
    )
    _run(jobs, cluster, seen)
    assert seen.weighted > 0
