"""The active jobs kept split into running and waiting, each in arrival order, from one
instant to the next, so that an instant lists only the running jobs.

A waiting job's snapshot ``Job``, rank key and gang do not change while it waits (the engine
rebuilds a job's ``Job`` only after a plan changed it, or where its attained GPU-time moves,
which needs workers), so each is kept as one entry (``showing.Waiting``) from the first
instant it is seen waiting until it starts; an instant reads the entries, not the runs. The
running jobs are listed at each instant as ``showing.collect`` lists them (their ``Job`` may
change with their LAS queue).

What must stay true: ``listing`` gives what ``showing.entries`` gives from ``collect`` over
the active jobs in arrival order (``tests/simulations/test_running_and_waiting.py`` compares them at
every instant of the simulations). That holds while ``place`` is told of every change of a
job's worker count (start, suspension, resize, completion) and ``arrive`` of every arrival:
only then does a job enter or leave either list, or a waiting job's ``Job`` change
(``Engine._apply`` drops the cached ``Job`` of every job a plan changes; the entry is built
at the next instant from the ``Job`` that instant builds).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable

from edl_scheduler.core import Job
from simulations.runs import Run
from simulations.showing import Key, Running, Waiting, waiting_entry


def _index(run: Run) -> int:
    return run.index


def _entry_index(entry: Waiting) -> int:
    return entry.index


class RunningAndWaiting:
    """Running runs and waiting entries, each sorted by arrival index (see the module)."""

    def __init__(self, elastic: bool) -> None:
        self.elastic = elastic
        self.running: list[Run] = []
        self.waiting: list[Waiting] = []
        #: The waiting entries' rank keys, sorted: the best-ranked first.
        self.keys: list[Key] = []
        #: Waiting runs with no entry yet (built at the next instant), by arrival index.
        self.pending: dict[int, Run] = {}
        #: One object per distinct element of the rank keys listed (``_interned``).
        self.elements: dict[float | str, float | str] = {}

    def arrive(self, run: Run) -> None:
        self.pending[run.index] = run

    def place(self, run: Run, before: int, after: int) -> None:
        """``run`` had ``before`` live workers and now has ``after``."""
        if before:
            at = bisect.bisect_left(self.running, run.index, key=_index)
            assert self.running[at] is run
            del self.running[at]
        elif self.pending.pop(run.index, None) is None:
            at = bisect.bisect_left(self.waiting, run.index, key=_entry_index)
            entry = self.waiting.pop(at)
            assert entry.index == run.index
            del self.keys[bisect.bisect_left(self.keys, entry.key)]
        if after:
            bisect.insort(self.running, run, key=_index)
        else:
            self.pending[run.index] = run

    def finish(self, run: Run) -> None:
        """``run`` completed (it ran): it leaves both lists."""
        at = bisect.bisect_left(self.running, run.index, key=_index)
        assert self.running[at] is run
        del self.running[at]

    def listing(
        self, now: float, rebuild: Callable[[Run, float], Job], queue_only: bool, fresh: bool
    ) -> tuple[list[Running], list[Waiting], Key | None]:
        """The running jobs (``Job`` as ``collect`` takes it), the waiting entries, and the
        best-ranked waiting key."""
        if self.pending:
            for index in sorted(self.pending):
                run = self.pending[index]
                job = run.cached if run.cached is not None else rebuild(run, now)
                entry = waiting_entry(index, job, self._interned(run), self.elastic)
                bisect.insort(self.waiting, entry, key=_entry_index)
                bisect.insort(self.keys, entry.key)
            self.pending.clear()
        running: list[Running] = []
        for r in self.running:
            n, cached = len(r.replicas), r.cached
            if cached is None or (
                (queue_only and not r.queue_low <= r.attained + n * (now - r.last) < r.queue_high)
                or (fresh and not queue_only)
            ):
                cached = rebuild(r, now)
                self._interned(r)
            running.append((r.index, cached, n, r.rank_key))
        return running, self.waiting, self.keys[0] if self.keys else None

    def _interned(self, run: Run) -> Key:
        """``run``'s rank key rebuilt of shared elements, and kept as its key. ``shown_from_sides``
        compares hundreds of keys per instant, and a tuple comparison skips by identity the
        elements two keys share (most rank keys agree but for the submit time and the name),
        where it would compare equal floats. An element is replaced only by one equal to it
        (a NaN, hashed by identity, never is), so every comparison answers as before."""
        seen = self.elements
        key = tuple([seen.setdefault(x, x) for x in run.rank_key])
        run.rank_key = key
        return key
