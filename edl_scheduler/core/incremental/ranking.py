"""The kept ranking: a cycle with a memo ranks and counts only the jobs that changed.

A driver that plans again and again (the simulator) shows mostly the same Job objects from
one cycle to the next; the session's ranking and the replicas' use per node are then the
last cycle's (``PlanMemo.ranked``, ``PlanMemo.used``), patched for the jobs that left and
the jobs not seen before. The cost of a cycle here follows those jobs: which ones they are
is found by one look-up per shown job by its identity, which marks the kept ones (a job
that left is one left unmarked), a job that left is found in the ranking by binary search
on its kept key (in ``PlanMemo.keys``, the ranking's keys alone: bisected without a key
function, each step compares two tuples), and a new one goes in the same way. A job that
left is parked (``PlanMemo.parked``): where the same Job object comes back (the simulator
leaves out jobs no plan can change and shows them again later), what was derived from it
and its kept ``JobState`` are taken back instead of derived again.

What must stay true: the result equals a ranking and count made from scratch. Every key
ends in the job's name, so the order is total and a key finds exactly its entry; a kept
entry's key is still its job's key (it depends on the job alone where ``key_varies`` is
false, and the job is the same immutable object, kept alive by its entry).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from itertools import islice
from typing import Final, cast

from edl_scheduler.core.incremental.memo import Derived, PlanMemo
from edl_scheduler.core.snapshot import Job, Snapshot

Key = tuple[float | str, ...]
Ranked = list[tuple[Key, Derived]]

#: Whether a job that left the snapshot and comes back as the same Job object takes back
#: what was derived from it (``PlanMemo.parked``); off only in tests, for the reference.
USE_PARKED = True
#: Jobs not seen before that a kept ranking takes one by one (binary search); more are
#: merged in by one sort of the two runs.
_INSERTS: Final = 8


def first(pair: tuple[Key, Derived]) -> Key:
    return pair[0]


def count(used: list[list[int]], d: Derived, sign: int) -> None:
    """Add (``sign`` 1) or take away (-1) what ``d``'s live replicas take per node."""
    for n, g, c, m in d.usage:
        u = used[n]
        u[0] += sign * g
        u[1] += sign * c
        u[2] += sign * m


def kept_ranking(
    snapshot: Snapshot,
    memo: PlanMemo,
    derive: Callable[[Job], Derived],
) -> tuple[Ranked, list[list[int]]]:
    """The ranking and the use per node for ``snapshot``, from the memo's (updated in
    place, and returned with a copy of the use). ``derive`` gives a job not seen before
    its ``Derived``, with its key."""
    jobs = snapshot.jobs
    known = memo.jobs
    names = memo.names
    ranked, keys = memo.ranked, memo.keys
    assert ranked is not None
    used = memo.used
    # Validation sorted this snapshot out already (``PlanMemo.sort_out``), unless it took
    # the path without the memo; either way the result is taken once.
    fresh = memo.fresh if memo.shown is jobs else memo.sort_out(jobs)
    memo.shown, memo.fresh = None, []
    cycle = memo.cycle
    parked = memo.parked
    order = memo.sorted
    # Each removal and insertion is on its own entry and sums: their order changes nothing.
    if len(jobs) - len(fresh) < len(known):  # some jobs left: the ones left unmarked
        gone = [d for d in memo.skipped if d.seen != cycle]  # (each one left is there)
        for d in gone:
            i = id(d.job)
            del known[i]
            if names.get(d.job.name) is d:
                del names[d.job.name]
            parked[i] = d  # (its kept state goes with it: ``Derived.state``)
            count(used, d, -1)
            assert d.key is not None  # a kept ranking's keys do not vary
            at = bisect.bisect_left(keys, d.key)
            assert ranked[at][1] is d  # keys are unique: the key finds its entry
            del ranked[at]
            del keys[at]
        # At most four snapshots' worth of jobs stay parked, the longest parked leaving
        # first (a job that finished never comes back; one left out while it runs does).
        for i in list(islice(parked, max(0, len(parked) - 4 * len(jobs)))):
            del parked[i]
    if fresh:
        added: Ranked = []
        for k in range(len(fresh)):
            job = fresh[k]
            found = parked.pop(id(job), None) if USE_PARKED else None
            # Left and came back as the same Job: taken back, its kept state with it.
            d = found if found is not None and found.job is job else derive(job)
            order[memo.fresh_at[k]] = d
            known[id(job)] = d
            names[job.name] = d
            count(used, d, 1)
            assert d.key is not None  # the key does not vary: it is kept
            added.append((d.key, d))
        if len(added) <= _INSERTS:
            for entry in added:
                at = bisect.bisect_left(keys, entry[0])
                ranked.insert(at, entry)
                keys.insert(at, entry[0])
        else:  # two sorted runs: the sort merges them
            ranked += added
            ranked.sort(key=first)
            keys[:] = [k for k, _ in ranked]
    memo.remember(jobs, cast("list[Derived]", order), memo.since)  # (no None is left)
    return ranked, [list(u) for u in used]
