"""Each run as the planner sees it: its snapshot ``Job``, built once and kept until the
engine changes the run.

A plan's snapshot shows every active job, and an instant changes about one: building each
Job afresh would cost a pass of allocations over every job per plan. So a run keeps the
Job it was last shown as (``Run.cached``), with its rank key where the policy's keys do not
depend on ``now`` (``Run.rank_key``) and, under LAS queues, the band of attained GPU-time
its queue holds for (``Run.queue_low``, ``queue_high``: ``ordering.queue_band``).

What must stay true: a kept Job is the Job a fresh build would give, as far as the planner
reads it. That holds while every change of a run's replicas, samples, times, efficiency or
remaining samples drops its Job (``drop``: from ``Engine._apply`` and ``remeasure``, the
only places they change), and a running job's Job is rebuilt where the ranking reads its
attained GPU-time (``ordering.ranks_continuously``; under ``ordering.ranks_by_queue`` only
when it leaves its queue's band). ``tests/simulations/test_incremental.py`` compares the
engine with the path that builds every Job afresh.
"""

from __future__ import annotations

from collections.abc import Iterable

from edl_scheduler.core import Job, Policy, Resources, RoleSpec, ThroughputSample
from edl_scheduler.core.ordering import (
    key_varies,
    queue_band,
    queue_of,
    ranks_by_queue,
    ranks_continuously,
    sort_key,
)
from edl_scheduler.core.snapshot import Efficiency
from simulations.runs import Run
from simulations.snapshot_lists import SnapshotLists

_WORKER = Resources(gpu=1)


class SnapshotJobs:
    """The runs' snapshot Jobs under one policy (see the module)."""

    def __init__(self, policy: Policy, report_throughput: bool, incremental: bool) -> None:
        self.policy = policy
        #: Give the planner the throughput each job measured at the sizes it has run.
        self.report_throughput = report_throughput
        #: Whether a running job's rank reads its attained GPU-time.
        self.fresh_attained = ranks_by_queue(policy) or ranks_continuously(policy)
        #: Under LAS queues the planner reads attained GPU-time only through the job's queue
        #: (``ordering.sort_key``), so a running job's Job is rebuilt only when its queue
        #: changes; its attained GPU-time in the snapshot may lag until then.
        self.by_queue = ranks_by_queue(policy)
        self.queue_only = incremental and self.by_queue
        #: The policy's rank key where it does not depend on ``now``: kept per snapshot Job
        #: (``Run.rank_key``) for pruning, on the incremental path.
        self.fixed_key = sort_key(policy, 0.0) if incremental and not key_varies(policy) else None
        #: Running jobs' Jobs rebuilt for attained time, in all.
        self.rekeyed = 0
        #: The engine's kept snapshot lists, told of every Job dropped (``drop``).
        self.lists: SnapshotLists | None = None

    def job(self, run: Run, now: float) -> Job:
        """The job as the planner sees it now. The Job is cached until the engine changes
        the job (``Engine._apply``, the only place its replicas, samples and times change);
        where the ranking reads attained GPU-time, a running job's Job is rebuilt at every
        plan, reusing the cached spec, replicas and samples."""
        fresh = self.fresh_attained and run.workers > 0
        cached = run.cached
        if cached is not None:
            if not fresh:
                return cached
            # Under LAS queues its rank moves only with its queue; the path that builds
            # every Job afresh (not ``queue_only``) rebuilds it all the same.
            moved = not self.by_queue or self.queue(run.attained_at(now)) != self.queue(
                cached.attained_gpu_seconds
            )
            if self.queue_only and not moved:
                return cached
            if moved:
                self.rekeyed += 1  # a running job's rank may have moved: see ``Engine._plan``
            worker, replicas, samples = cached.worker, cached.replicas, cached.throughput
            efficiency, remaining = cached.efficiency, cached.remaining_samples
        else:
            job = run.job
            worker = RoleSpec(job.min_workers, job.max_workers, _WORKER)
            replicas = tuple(run.replicas)
            samples = (
                tuple(run.samples[k] for k in sorted(run.samples)) if self.report_throughput else ()
            )
            efficiency, remaining = self.efficiency(run), self.remaining(run)
        job = run.job
        built = Job(
            name=job.name,
            worker=worker,
            submit_time=job.submit_time,
            priority=job.priority,
            requested=job.requested,
            replicas=replicas,
            start_time=run.start_time,
            last_resize_time=run.last_resize_time,
            resizes=run.resizes + run.preemptions,
            attained_gpu_seconds=run.attained_at(now),
            throughput=samples,
            efficiency=efficiency,
            remaining_samples=remaining,
        )
        run.cached = built
        if self.fixed_key is not None:
            run.rank_key = self.fixed_key(built)
        if self.queue_only:
            band = queue_band(built.attained_gpu_seconds, self.policy.queue_thresholds_gpu_s)
            run.queue_low, run.queue_high = band
        return built

    def efficiency(self, run: Run) -> Efficiency | None:
        """A profiled job's statistical efficiency now, once it has measured anything."""
        profile = run.job.profile
        if profile is None or not run.samples:
            return None
        return profile.efficiency(run.placement, run.done)

    def remaining(self, run: Run) -> float | None:
        """What a running profiled job's runtime would report it has left, in samples: its
        remaining progress at the progress one sample makes now (the statistical efficiency
        of its batch at its epoch), as a job on the project's runtime counts the samples to
        its declared last epoch. None for a job not running or without a profile: a trace's
        durations are not what its users declared, so jobs without one report nothing."""
        profile = run.job.profile
        if profile is None or not run.workers or not run.samples:
            return None
        rate = profile.rate(run.placement, run.done)
        if rate <= 0:
            return None
        measured, _ = profile.measured(run.placement, run.done)
        return max(0.0, run.total - run.done) * measured / rate

    def remeasure(self, running: Iterable[Run], now: float) -> None:
        """A runtime keeps measuring at its job's current size (the coordinator's smoothed
        rate, which the controller copies into the status), so the sample at that size
        follows the job now, and so do its gradient statistics (``Efficiency``). A profiled
        job's batch (with adaptation) and statistical efficiency change with its epoch; the
        samples at sizes it left keep what it measured there."""
        for run in running:
            profile = run.job.profile
            if profile is None or run.paused_until > now:
                continue
            run.advance(now)
            key = (len(run.placement), run.workers)
            rate, batch = profile.measured(run.placement, run.done)
            sample = run.samples[key]
            if (sample.samples_per_second, sample.batch) != (rate, batch):
                run.samples[key] = ThroughputSample(key[0], key[1], rate, batch)
                self.drop(run)
            cached = run.cached
            if cached is not None and (
                cached.efficiency != self.efficiency(run)
                or cached.remaining_samples != self.remaining(run)
            ):
                self.drop(run)

    def drop(self, run: Run) -> None:
        """``run``'s snapshot Job is rebuilt at the next plan (its replicas, samples or
        times changed): the only place a cached Job is dropped."""
        run.cached = None
        if self.lists is not None:
            self.lists.touch(run)

    def queue(self, attained: float) -> int:
        """The LAS queue index of a running job with ``attained`` GPU-seconds."""
        return queue_of(attained, self.policy.queue_thresholds_gpu_s)
