"""One submitted job as the engine runs it (its size, progress and costs, kept lazily), and
the record of what happened to it (``JobRecord``, the run's per-job result).

A job's remaining work and attained GPU-time are brought up to date only when its size
changes or the snapshot needs them (``advance``), so an instant of the simulation costs time
in the number of jobs it touches, not in the number running. What must stay true: ``done``
never exceeds ``total`` and never decreases; ``attained`` grows by workers x seconds
whether the job trains or pauses (a paused job holds its GPUs); training happens only after
``paused_until``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from edl_scheduler.core import Job, Replica, ThroughputSample
from simulations.workload import ClusterSpec, SimJob

_INF = math.inf


@dataclass(frozen=True, slots=True)
class JobRecord:
    """What happened to one job. ``end`` is None for a job that never finished."""

    name: str
    submit_time: float
    requested: int
    min_workers: int
    max_workers: int
    priority: int
    first_start: float | None
    end: float | None
    resizes: int
    preemptions: int
    gpu_seconds: float

    @property
    def jct(self) -> float | None:
        return None if self.end is None else self.end - self.submit_time

    @property
    def queueing_delay(self) -> float | None:
        return None if self.first_start is None else self.first_start - self.submit_time


@dataclass(slots=True, eq=False)
class Run:
    """The engine's mutable state of one submitted job."""

    job: SimJob
    index: int
    total: float
    done: float = 0.0
    replicas: list[Replica] = field(default_factory=list)
    placement: tuple[int, ...] = ()
    rate: float = 0.0
    last: float = 0.0
    paused_until: float = 0.0
    attained: float = 0.0
    start_time: float | None = None
    first_start: float | None = None
    last_resize_time: float | None = None
    resizes: int = 0
    preemptions: int = 0
    version: int = 0
    serial: int = 0
    samples: dict[tuple[int, int], ThroughputSample] = field(default_factory=dict)
    cached: Job | None = None
    #: Under LAS queues (the incremental path): ``cached`` stays right while the job's
    #: attained GPU-time is in ``[queue_low, queue_high)``, the thresholds around the
    #: attained GPU-time it was built with (so its queue is the same); empty until built.
    queue_low: float = _INF
    queue_high: float = -_INF
    #: ``ordering.sort_key`` of ``cached``, where the policy's key does not depend on
    #: ``now`` (pruning reads it at every plan).
    rank_key: tuple[float | str, ...] = ()
    #: What this job adds to the engine's useful-GPU tally now (0 while paused).
    useful: float = 0.0

    @property
    def workers(self) -> int:
        return len(self.replicas)

    def attained_at(self, now: float) -> float:
        return self.attained + self.workers * (now - self.last)

    def in_queue_band(self, now: float) -> bool:
        """Whether the attained GPU-time at ``now`` is still in ``[queue_low, queue_high)``,
        so that ``cached`` (and ``rank_key``) still has the job's LAS queue."""
        return self.queue_low <= self.attained_at(now) < self.queue_high

    def advance(self, now: float) -> None:
        if self.workers:
            self.attained += self.workers * (now - self.last)
            begin = max(self.last, self.paused_until)
            if now > begin:
                self._train(now - begin)
        self.last = now

    def _train(self, seconds: float) -> None:
        profile = self.job.profile
        if profile is None:
            self.done = min(self.total, self.done + self.rate * seconds)
            return
        while seconds > 0 and self.done < self.total:
            rate = profile.rate(self.placement, self.done)
            if rate <= 0:
                return
            edge = min(profile.horizon(self.done), self.total)
            need = (edge - self.done) / rate
            if need >= seconds:
                self.done += rate * seconds
                return
            self.done, seconds = edge, seconds - need

    def finish_time(self) -> float:
        if not self.workers or self.rate <= 0:
            return _INF
        at = max(self.last, self.paused_until)
        profile = self.job.profile
        if profile is None:
            return at + (self.total - self.done) / self.rate
        done = self.done
        while done < self.total:
            rate = profile.rate(self.placement, done)
            if rate <= 0:
                return _INF
            edge = min(profile.horizon(done), self.total)
            at += (edge - done) / rate
            done = edge
        return at

    def useful_now(self) -> float:
        profile = self.job.profile
        if profile is None:
            return self.job.useful_gpus(self.workers)
        return profile.useful(self.placement, self.done)

    def record(self, end: float | None) -> JobRecord:
        """What happened to the job, once it has ended (``end``) or the run has."""
        job = self.job
        return JobRecord(
            job.name,
            job.submit_time,
            job.requested,
            job.min_workers,
            job.max_workers,
            job.priority,
            self.first_start,
            end,
            self.resizes,
            self.preemptions,
            self.attained,
        )


@dataclass(frozen=True, slots=True)
class SimResult:
    """What one run of one policy over one workload gives: every job's record, the
    allocation over time, and what the run cost."""

    policy: str
    cluster: ClusterSpec
    jobs: tuple[JobRecord, ...]
    #: (time, allocated GPUs, useful GPUs) at every change, a step function.
    timeline: tuple[tuple[float, int, float], ...]
    plans: int
    wall_s: float
    plan_wall_s: float
