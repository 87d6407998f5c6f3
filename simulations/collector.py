"""Python's cyclic garbage collector, kept out of a simulation's way while it runs.

A long run (the full Philly trace: 82,247 jobs, about 259,000 plans) spent about 7% of its
CPU time in the collector: full collections walk every object alive (the trace, the jobs'
records, the memo), and young collections come every 700 container allocations, each
walking whatever a plan holds at that moment (lists over every active job). ``quiet``
moves the objects alive when the run begins (the trace, the workload) to the collector's
permanent generation, which no collection walks, and collects the young generation less
often while the run lasts; both are undone when it ends, whatever the caller had set.

While the planner runs, the collector is paused altogether (``paused``): a plan allocates a
few objects per job and makes no reference cycles, so reference counting frees everything,
but the collector's scans of the snapshot cost much of a plan (about 40% at 10,000 jobs).
The simulator runs on one thread, so nothing else notices; ``plan()`` itself leaves the
collector alone (it is pure: no process-wide effect), and a driver decides.

What must stay true: nothing here changes what a simulation computes (the collector frees
only cycles no one can reach), and memory stays bounded: collections still run, only less
often, and every cycle is still freed (frozen objects are unfrozen at the end, and any of
them that became garbage is collected by the next full collection).
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Final, TypeVar

T = TypeVar("T")

#: Container allocations (net of frees) between young collections while a run lasts
#: (Python's default is 700): each young collection walks the lists a plan holds, so
#: fewer of them cost less in all, for a bounded growth of uncollected young objects.
YOUNG_THRESHOLD: Final = 20_000


@contextmanager
def quiet() -> Iterator[None]:
    """Run the body with the objects alive now frozen and young collections rarer. A caller
    that froze objects itself keeps them frozen: this freezes only where nothing is."""
    thresholds = gc.get_threshold()
    froze = gc.isenabled() and gc.get_freeze_count() == 0
    if froze:
        gc.freeze()
    gc.set_threshold(max(thresholds[0], YOUNG_THRESHOLD), *thresholds[1:])
    try:
        yield
    finally:
        gc.set_threshold(*thresholds)
        if froze:
            gc.unfreeze()


def paused(call: Callable[[], T]) -> T:
    """``call()`` with the cyclic collector paused, then restored as it was. (Written out:
    a context manager is a Python-level generator, about 3% of a compiled simulation.)"""
    enabled = gc.isenabled()
    gc.disable()
    try:
        return call()
    finally:
        if enabled:
            gc.enable()
