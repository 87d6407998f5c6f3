"""When running jobs' cool-downs, ramp intervals (``Policy.ramp_s``, of the jobs on their
way up) and minimum run times end, when they have run long enough for a waiting equal to
take from them (``Policy.equals_yield_after_s``), when profiled jobs enter a new epoch, and
when a running job's attained GPU-time crosses a LAS queue's threshold: the instants at
which a plan may change a job that the last plan had to leave alone (``Engine._next_wake``).

A heap of (when, job version, job name), pushed where the engine changes a running job's
size, start or last resize (``Engine._apply``, the only place those change), so that the
next such instant is found without a loop over every running job after every plan.

What must stay true: ``next_after`` equals the first such end after ``now`` over the jobs
running now, as a loop over them finds it (``tests/simulations/test_wakes.py`` compares
them after every plan). An entry of an older version of its job (resized, suspended or
finished since), of a job no longer running, or not after ``now`` is stale: it is dropped
when it comes to the top, and one not after ``now`` never stands again, as time only goes
on.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable

from edl_scheduler.core import Policy
from edl_scheduler.core.stability import cooldown_end, measured_way_up, min_run_end, ramp_end
from simulations.runs import Run

#: Floating-point slack: attained GPU-time this close below a threshold has crossed it.
_EPS = 1e-6


class _Wakes:
    """A heap of (when, job version, job name), least first."""

    def __init__(self) -> None:
        self.heap: list[tuple[float, int, str]] = []

    def next_after(self, now: float, running: dict[str, Run]) -> float:
        """The first instant after ``now`` noted for a job in ``running`` as it is now
        (infinity: none)."""
        heap = self.heap
        while heap:
            at, version, name = heap[0]
            run = running.get(name)
            if at > now and run is not None and run.version == version:
                return at
            heapq.heappop(heap)
        return math.inf


class YieldWakes(_Wakes):
    """When running jobs have run ``Policy.equals_yield_after_s``, least first: from then
    on a waiting job of their own priority may shrink or suspend them."""

    def __init__(self, after_s: float) -> None:
        super().__init__()
        self.after_s = after_s

    def push(self, run: Run) -> None:
        """Note when ``run``, as the engine just left it (running), has run that long."""
        at = min_run_end(run.start_time, self.after_s)
        if at is not None:
            heapq.heappush(self.heap, (at, run.version, run.job.name))


class GrowthWakes(_Wakes):
    """The ends of running jobs' cool-downs, ramp intervals and minimum run times, least
    first. ``reported``: whether the planner is told what jobs measured (a job that told it
    nothing is never on its way up)."""

    def __init__(self, policy: Policy, reported: bool) -> None:
        super().__init__()
        self.cooldown_s = policy.cooldown_s
        self.min_run_s = policy.min_run_s
        self.ramp_s = policy.ramp_s
        self.pause_s = policy.resize_pause_s
        self.horizon_s = policy.gain_horizon_s
        self.reported = reported

    def push(self, run: Run) -> None:
        """Note when ``run``'s cool-down, ramp interval and minimum run time end, as the
        engine just left it (running; the rules' arithmetic is ``core.stability``'s)."""
        job, workers = run.job, len(run.replicas)
        if workers < job.max_workers:
            at = cooldown_end(run.last_resize_time, run.start_time, self.cooldown_s)
            if at is not None:
                heapq.heappush(self.heap, (at, run.version, job.name))
            if self.ramp_s is not None and self.ramps(run, workers):
                at = ramp_end(run.last_resize_time, run.start_time, self.ramp_s)
                if at is not None:
                    heapq.heappush(self.heap, (at, run.version, job.name))
        if workers > job.min_workers:
            at = min_run_end(run.start_time, self.min_run_s)
            if at is not None:
                heapq.heappush(self.heap, (at, run.version, job.name))

    def ramps(self, run: Run, workers: int) -> bool:
        """Whether the end of ``run``'s ramp interval could let it grow: only a job on its
        way up by what it measured (``stability.measured_way_up``) ramps, and an unprofiled
        job's measurements change only where the engine resizes it, which notes its times
        again. A profiled job's measurements change with its epoch as well
        (``SnapshotJobs.remeasure``): its end is always noted."""
        if run.job.profile is not None:
            return True
        samples = run.samples.values() if self.reported else ()
        return measured_way_up(samples, workers, self.pause_s, self.horizon_s)


def next_epoch(running: Iterable[Run], now: float) -> float:
    """When a running profiled job next enters a new epoch: its measured rate changes
    there, so the plan may change (a controller, planning every cycle, would see it)."""
    wake = math.inf
    for run in running:
        profile = run.job.profile
        if profile is None or run.rate <= 0:
            continue
        edge = profile.horizon(run.done)
        if edge < run.total:
            rate = profile.rate(run.placement, run.done)
            at = max(run.last, run.paused_until) + (edge - run.done) / rate
            if at > now:
                wake = min(wake, at)
    return wake


def next_queue(running: Iterable[Run], now: float, thresholds: tuple[float, ...]) -> float:
    """When a running job's attained GPU-time next crosses one of the LAS ``thresholds``:
    its rank moves there, so the plan may change."""
    wake = math.inf
    for run in running:
        workers = len(run.replicas)  # ``attained_at`` and ``workers``, inlined
        if not workers:
            continue  # (its attained GPU-time stands still)
        got = run.attained + workers * (now - run.last)
        for t in thresholds:
            if t > got + _EPS:
                at = now + (t - got) / workers
                if at < wake:
                    wake = at
                break
    return wake
