"""When the engine next plans for a time-based rule (``Engine._next_wake``), kept as a heap
(``simulations.wakes``).

Aspects:
- after every plan of the ``60_job.csv`` simulations (every preset and the LAS variants,
  ticks and event-driven, elastic where the policy is), the first end of a running job's
  cool-down or minimum run time that the heap gives (``GrowthWakes.next_after``) equals the one
  a loop over every running job finds, and so does the whole wake-up;
- so does the first instant a running job has run long enough for a waiting equal to take
  from it (``Policy.equals_yield_after_s``, ``YieldWakes``);
- a ramp interval's end is noted only for a job on its way up by what it measured;
- the heap's entries are dropped once stale: a job that finished, was resized again or
  was suspended leaves nothing behind that a later answer takes;
- a running job's next LAS queue crossing (``next_queue``) is when its attained GPU-time,
  growing at its worker count, reaches the first threshold above it; a job past every
  threshold, or one that waits, adds none.
Seen to fail with the entries' version left unchecked (a resized job's old cool-down end
taken), with entries not after ``now`` kept, and with a job without workers in the queue
crossing's loop (a division by zero).
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from edl_scheduler.core import (
    Growth,
    Job,
    Policy,
    Replica,
    Resources,
    Role,
    RoleSpec,
    ThroughputSample,
)
from edl_scheduler.core.stability import on_its_way_up
from simulations.engine import Engine
from simulations.runs import Run
from simulations.wakes import GrowthWakes, next_queue
from simulations.workload import SimJob
from tests.simulations.test_settled import CLUSTER, CONFIGS, POLICIES, _jobs

_INF = float("inf")
#: The presets and variants of ``test_settled`` (``edl`` grows on evidence: its jobs on their
#: way up, by what they measured, wake a plan at the end of their ramp interval,
#: ``Policy.ramp_s``), and ``edl`` without it.
WAKE_POLICIES = {
    **POLICIES,
    "edl-trusting": replace(POLICIES["edl"], name="edl-trusting", ramp_s=None),
}


def _by_a_loop(running: list[Run], policy: Policy, now: float) -> float:
    """The first end of a running job's cool-down or minimum run time after ``now``, from
    every running job (the loop the heap replaces)."""
    wake = _INF
    if not policy.elastic or policy.growth is Growth.NONE:
        return wake
    for run in running:
        if run.last_resize_time is None:
            continue
        job, workers = run.job, len(run.replicas)
        if workers < job.max_workers:
            at = run.last_resize_time + policy.cooldown_s
            if now < at < wake:
                wake = at
            if policy.ramp_s is not None and _on_its_way_up(run, workers, policy):
                at = run.last_resize_time + policy.ramp_s
                if now < at < wake:
                    wake = at
        if workers > job.min_workers and run.start_time is not None:
            at = run.start_time + policy.min_run_s
            if now < at < wake:
                wake = at
    return wake


def _on_its_way_up(run: Run, workers: int, policy: Policy) -> bool:
    """Whether the planner would find ``run`` on its way up from what it measured."""
    job = Job(
        name=run.job.name,
        worker=RoleSpec(run.job.min_workers, run.job.max_workers, Resources(gpu=1)),
        submit_time=run.job.submit_time,
        throughput=tuple(run.samples.values()),
    )
    return on_its_way_up(job, workers, policy.resize_pause_s, policy.gain_horizon_s)


class _Checked(Engine):
    """An engine that compares the heap's answer with the loop's at every wake-up asked."""

    asked = 0
    found = 0
    yielded = 0

    def _next_wake(self, now: float) -> float:
        expected = _by_a_loop(list(self.running.values()), self.policy, now)
        got = self.wakes.next_after(now, self.running) if self.grows else _INF
        assert got == expected, (now, got, expected)
        type(self).asked += 1
        type(self).found += got < _INF
        after = self.policy.equals_yield_after_s
        if after is not None:
            assert self.yields is not None
            starts = [r.start_time for r in self.running.values() if r.start_time is not None]
            expected = min((s + after for s in starts if s + after > now), default=_INF)
            got = self.yields.next_after(now, self.running)
            assert got == expected, ("yield", now, got, expected)
            type(self).yielded += got < _INF
        return super()._next_wake(now)


@pytest.mark.parametrize("config", sorted(CONFIGS))
@pytest.mark.parametrize("name", sorted(WAKE_POLICIES))
def test_the_heap_gives_the_loops_wake(name: str, config: str) -> None:
    policy = WAKE_POLICIES[name]
    _Checked.asked = _Checked.found = _Checked.yielded = 0
    _Checked(_jobs(policy), CLUSTER, policy, CONFIGS[config]).run()
    assert _Checked.asked > 0
    if policy.equals_yield_after_s is not None:
        assert _Checked.yielded > 0  # (``edl``: equals shrunk after their minimum run)
    if policy.elastic and policy.growth is not Growth.NONE and policy.cooldown_s > 0:
        assert _Checked.found > 0  # the heap answered something, not only "never"


def _running(name: str, attained: float, workers: int, last: float) -> Run:
    run = Run(SimJob(name, 0.0, workers, 1e6, 1, 8), 0, 1e6, attained=attained, last=last)
    run.replicas = [Replica(f"{name}-w{i}", Role.WORKER, "n0") for i in range(workers)]
    return run


def test_the_next_queue_crossing_is_the_first_threshold_reached() -> None:
    thresholds = (3250.0, 7200.0)
    # 3,000 GPU-s at t=100 on 2 workers: 3,200 at t=200, 3,250 at t=225.
    slow = _running("slow", 3000.0, 2, 100.0)
    assert next_queue([slow], 200.0, thresholds) == pytest.approx(225.0)
    # Past the first threshold: the second, 7,200, at 4 workers from 4,000 at t=0.
    fast = _running("fast", 4000.0, 4, 0.0)
    assert next_queue([fast], 0.0, thresholds) == pytest.approx(800.0)
    assert next_queue([slow, fast], 200.0, thresholds) == pytest.approx(225.0)
    # Past every threshold, or waiting (no workers): no crossing.
    done = _running("done", 9000.0, 1, 0.0)
    waiting = _running("waiting", 0.0, 0, 0.0)
    assert next_queue([done, waiting], 10.0, thresholds) == _INF


def test_a_ramp_interval_wakes_a_plan_only_for_a_job_on_its_way_up() -> None:
    """At 2 workers, a job whose step up from 1 held (190 against 100 samples/s) may grow
    again at the end of its ramp interval; one whose step gained 1% may not, and an entry
    for it would wake a plan that its ramp cannot change."""
    policy = POLICIES["edl"]
    assert policy.ramp_s is not None and policy.ramp_s < policy.cooldown_s

    def wake(two: float) -> float:
        wakes = GrowthWakes(policy, reported=True)
        run = _running("j", 0.0, 2, 0.0)
        run.start_time = run.last_resize_time = 100.0
        run.samples = {(1, 1): ThroughputSample(1, 1, 100.0), (1, 2): ThroughputSample(1, 2, two)}
        wakes.push(run)
        return wakes.next_after(100.0, {"j": run})

    assert wake(190.0) == 100.0 + policy.ramp_s
    assert wake(101.0) == 100.0 + policy.cooldown_s  # its cool-down: it may grow then
