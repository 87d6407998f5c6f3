"""The active jobs' snapshot lists kept from one plan to the next, where nothing but the
engine's own changes alters them.

``showing.collect`` lists every active job afresh before each plan: its snapshot ``Job``,
live workers and rank key, in arrival order. Where the policy's ranking does not read the
clock and does not read attained GPU-time (``Engine.fresh_attained`` false: no job's
``Job`` is rebuilt for time alone), a job's entry changes only where the engine changes the
job: it arrives, a plan resizes it (``Engine._apply`` drops its cached ``Job``), a profiled
job measures a new rate (``Engine._remeasure`` drops it), or it completes. ``SnapshotLists`` keeps
the three lists and patches the entries of those jobs alone, so a plan no longer pays a
pass of list appends over every active job (about a tenth of a full Philly run under
``edl``).

It keeps ``pruning.shown``'s tally of them the same way (``tally``: where the waiting jobs
are, the largest waiting gang, the running jobs' GPUs above their minimum, whether all of
them may be preempted), so that the waiting jobs that cannot start are found without a pass
over the running ones, and most plans, where the largest gang fits, without one over the
waiting ones.

What must stay true: ``listing`` returns exactly ``collect``'s ``jobs``, ``live`` and
``keys`` over the active jobs in arrival order, and ``tally`` what ``pruning.tally`` counts
of them (``tests/simulations/test_snapshot_lists.py`` compares both at every plan of the
simulations).
That holds while the engine tells ``arrive`` of every arrival, ``touch`` of every job whose
cached ``Job`` it drops, and ``finish`` of every completion. The lists returned are this
object's own: a caller reads them and never changes them.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable

from edl_scheduler.core import Job
from edl_scheduler.core.sizing import gang_gpus
from simulations.pruning import Tally, surplus_of
from simulations.runs import Run
from simulations.showing import Key


class SnapshotLists:
    """Per active job, in arrival order: its arrival index, run, snapshot Job, live
    workers and rank key (see the module)."""

    def __init__(self, elastic: bool) -> None:
        #: Whether a waiting job's gang is its minimum (else its rigid size: ``sizing``).
        self.elastic = elastic
        #: Arrival indices, ascending (searched by bisection: a job's place in the lists).
        self.indices: list[int] = []
        self.runs: list[Run] = []
        self.jobs: list[Job] = []
        self.live: list[int] = []
        self.keys: list[Key] = []
        #: Arrived since the last listing (they go at the end: arrival indices ascend).
        self.pending: list[Run] = []
        #: Runs whose entry the next listing rebuilds (a run may be named twice).
        self.stale: list[Run] = []
        #: The tally of the listed entries (``pruning.Tally``): the waiting ones' arrival
        #: indices and their gangs' GPUs (each ascending), the running ones' GPUs above
        #: their minimum, and how many running ones may not be preempted.
        self.waiting: list[int] = []
        self.gangs: list[int] = []
        self.surplus = 0
        self.fixed = 0

    def arrive(self, run: Run) -> None:
        self.pending.append(run)

    def touch(self, run: Run) -> None:
        """``run``'s cached ``Job`` or its live workers changed."""
        self.stale.append(run)

    def finish(self, run: Run) -> None:
        """``run`` completed: its entry leaves."""
        at = self._place(run)
        assert at >= 0, f"{run.job.name} is not listed"
        self._count(at, -1)
        del self.indices[at]
        del self.runs[at]
        del self.jobs[at]
        del self.live[at]
        del self.keys[at]

    def listing(
        self, now: float, rebuild: Callable[[Run, float], Job]
    ) -> tuple[list[Job], list[int], list[Key]]:
        """The active jobs' snapshot Jobs, live workers and rank keys, in arrival order
        (``rebuild`` makes the Job of a run whose cached one was dropped; it sets the run's
        rank key)."""
        for run in self.pending:
            job = run.cached if run.cached is not None else rebuild(run, now)
            self.indices.append(run.index)
            self.runs.append(run)
            self.jobs.append(job)
            self.live.append(len(run.replicas))
            self.keys.append(run.rank_key)
            self._count(len(self.runs) - 1, 1)
        self.pending.clear()
        for run in self.stale:
            at = self._place(run)
            if at < 0:
                continue  # completed since it was touched
            self._count(at, -1)
            self.jobs[at] = run.cached if run.cached is not None else rebuild(run, now)
            self.live[at] = len(run.replicas)
            self.keys[at] = run.rank_key
            self._count(at, 1)
        self.stale.clear()
        return self.jobs, self.live, self.keys

    def tally(self) -> Tally:
        """``pruning.tally`` of the last listing (the surplus counted as under shrinking);
        where the waiting jobs are is found only if asked (most plans show them all)."""
        largest = self.gangs[-1] if self.gangs else -1
        return Tally(None, self.surplus, self.fixed == 0, largest, self._waiting_at)

    def _waiting_at(self) -> list[int]:
        """The waiting entries' places: one walk of both ascending lists of indices (a
        bisection per waiting job compared boxed integers through Python's protocol)."""
        indices, out = self.indices, []
        at = 0
        for index in self.waiting:
            while indices[at] != index:
                at += 1
            out.append(at)
            at += 1
        return out

    def _count(self, at: int, sign: int) -> None:
        """Count (1) or uncount (-1) the entry at ``at`` in the tally."""
        n, job = self.live[at], self.jobs[at]
        if not n:
            g = gang_gpus(job, self.elastic)
            if sign > 0:
                bisect.insort(self.waiting, self.indices[at])
                bisect.insort(self.gangs, g)
            else:
                del self.waiting[bisect.bisect_left(self.waiting, self.indices[at])]
                del self.gangs[bisect.bisect_left(self.gangs, g)]
            return
        self.surplus += sign * surplus_of(job, n, self.elastic)
        if not job.preemptible:
            self.fixed += sign

    def _place(self, run: Run) -> int:
        """Where ``run`` is in the lists (-1: not listed)."""
        at = bisect.bisect_left(self.indices, run.index)
        if at < len(self.runs) and self.runs[at] is run:
            return at
        return -1
