"""Invariant 7, in one place: the anti-thrash rules a policy applies to resizes.

A job is not resized more often than its cool-down allows, not shrunk voluntarily before it
has run its minimum time, and not grown when the expected gain over the policy's horizon is
smaller than the pause the resize costs. Invariant 4 overrides all of this: admitting a
higher-ranked job's gang never asks these functions (see ``preempting.may_shrink``).

The time arithmetic is here and nowhere else: when a cool-down ends (``cooldown_end``), when
a job on its way up may grow again (``ramp_end``, ``may_ramp``: growth on evidence, where the
policy ramps) and when a minimum run ends (``min_run_end``, ``has_run_minimum``), on the
job's times alone.
The planner's steps ask them, and so does a driver that must know when a plan could next
change a job for time alone (the simulator's wake-ups, ``simulations/wakes.py``).
"""

from __future__ import annotations

from collections.abc import Iterable

from edl_scheduler.core.session import JobState, Session
from edl_scheduler.core.snapshot import Job, ThroughputSample


def cooldown_end(
    last_resize_time: float | None, start_time: float | None, cooldown_s: float
) -> float | None:
    """When a running job's cool-down ends: ``cooldown_s`` after its last resize, or after
    its start where it was never resized (None: it has neither). It may be resized again
    at that instant, not before."""
    last = last_resize_time if last_resize_time is not None else start_time
    return None if last is None else last + cooldown_s


def min_run_end(start_time: float | None, min_run_s: float) -> float | None:
    """When a running job started at ``start_time`` has run its minimum time (None: it has
    not started); ``has_run_minimum`` says so from that instant on."""
    return None if start_time is None else start_time + min_run_s


def has_run_minimum(start_time: float | None, now: float, min_run_s: float) -> bool:
    """Whether a job started at ``start_time`` has run ``min_run_s`` by ``now``."""
    return start_time is not None and not now - start_time < min_run_s


def cooling_until(session: Session, js: JobState) -> float | None:
    """When the job's cool-down ends, or None if it may be resized now."""
    if not js.live_w:  # (``js.was_running``)
        return None
    job = js.job
    end = cooldown_end(job.last_resize_time, job.start_time, session.policy.cooldown_s)
    return end if end is not None and end > session.now else None


def ramp_end(
    last_resize_time: float | None, start_time: float | None, ramp_s: float
) -> float | None:
    """When a job on its way up may grow again (``may_ramp``): ``ramp_s`` after its last
    resize, or after its start (None: it has neither)."""
    return cooldown_end(last_resize_time, start_time, ramp_s)


def on_its_way_up(job: Job, workers: int, pause_s: float, horizon_s: float) -> bool:
    """Whether ``job``, now at ``workers``, measured that size, measured none larger, and
    its last step up (from the largest smaller size it measured) was worth its pause by
    what it measured: the speed-up held, so the next doubling is worth trying."""
    return measured_way_up(job.throughput, workers, pause_s, horizon_s)


def measured_way_up(
    throughput: Iterable[ThroughputSample], workers: int, pause_s: float, horizon_s: float
) -> bool:
    """``on_its_way_up`` from the job's measurements alone (in any order): what a driver
    that keeps them asks to know whether a ramp interval's end could change its plan."""
    rates: dict[int, float] = {}
    for sample in throughput:
        if sample.samples_per_second > 0:
            rates[sample.workers] = max(rates.get(sample.workers, 0.0), sample.samples_per_second)
    if not rates or max(rates) != workers:
        return False
    below = [w for w in rates if w < workers]
    if not below:
        return True
    gained = rates[workers] / rates[max(below)] - 1.0
    return gained * horizon_s > pause_s


def may_ramp(session: Session, js: JobState) -> bool:
    """Whether a running job within its cool-down may grow now on evidence: the policy
    ramps (``Policy.ramp_s``), ``ramp_s`` has passed since the job's last resize, and the
    job is ``on_its_way_up``. Growth then stops at ``margins.explored_limit``."""
    policy = session.policy
    if policy.ramp_s is None:
        return False
    job = js.job
    end = ramp_end(job.last_resize_time, job.start_time, policy.ramp_s)
    if end is None or end > session.now:
        return False
    found = js.way_up
    if found is None:  # (the job's alone: kept with its state)
        found = js.way_up = on_its_way_up(
            job, len(js.live_w), policy.resize_pause_s, policy.gain_horizon_s
        )
    return found


def may_shrink_voluntarily(session: Session, js: JobState) -> bool:
    """Whether a shrink that invariant 4 does not demand is allowed now."""
    if not has_run_minimum(js.job.start_time, session.now, session.policy.min_run_s):
        return False
    return cooling_until(session, js) is None


def resize_gain(js: JobState, nodes: tuple[int, int], workers: tuple[int, int]) -> float:
    """Predicted relative speed-up of going from ``workers[0]`` on ``nodes[0]`` nodes to
    ``workers[1]`` on ``nodes[1]``: 0.25 means 25% faster."""
    model = js.model()
    before = model.throughput(nodes[0], workers[0])
    after = model.throughput(nodes[1], workers[1])
    return after / before - 1.0 if before > 0 else float("inf")


def restart_factor(session: Session, js: JobState) -> float:
    """Pollux's re-allocation charge: what share of a changed allocation's speed-up counts,
    ``(age - resizes * pause) / (age + pause)`` (0 at least), with ``age`` the time since the
    job's run began (since submission while it waits) and ``pause`` the policy's resize
    pause. A job moved often, or a young one, must gain much more to be moved again; one
    that ran long and was rarely moved pays little. 1 where resizes cost nothing. Rebalancing
    charges its moves by it; growth into idle GPUs, which takes nothing from another job, is
    not charged (charging it too left the Pollux-workload means where they were)."""
    delay = session.policy.resize_pause_s
    if delay <= 0:
        return 1.0
    job = js.job
    since = job.start_time if job.start_time is not None else job.submit_time
    age = max(0.0, session.now - since)
    return max(0.0, age - job.resizes * delay) / (age + delay)


def worth_the_pause(session: Session, gain: float) -> bool:
    """A resize pays when the progress it adds over the horizon exceeds the pause."""
    policy = session.policy
    return gain * policy.gain_horizon_s > policy.resize_pause_s
