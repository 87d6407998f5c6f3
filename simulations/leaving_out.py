"""Running jobs the planner need not see: those no plan can change.

In a congested cluster under ``tiresias`` most running jobs rank above every waiting job
(on ``philly_3d``, 99 of 108 running at an average plan, of 235 shown): no job that could
start may suspend them, and nothing else would move them. The engine leaves them out of
the snapshot and hands the planner the capacity their replicas take (``IncrementalPlanner.
plan``'s ``occupied``), so the plan's cost follows the jobs it may change. Which jobs those
are, and why the plan is the same without them, is the core's rule
(``edl_scheduler.core.incremental.unchangeable``); this module counts what they take per
node, from the engine's own tally of live workers.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

from edl_scheduler.core import Job, Policy, Resources, Role
from edl_scheduler.core.incremental.unchangeable import best_short, unchangeable

Key = tuple[float | str, ...]

_NONE = Resources()


def leave_out(
    jobs: Sequence[Job],
    live: Sequence[int],
    keys: Sequence[Key],
    policy: Policy,
    node_of: dict[str, int],
    used: Sequence[Sequence[int]] | None = None,
    *,
    best: tuple[Key | None] | None = None,
) -> tuple[list[Job], tuple[Resources, ...] | None]:
    """The jobs the planner must see (in the order of ``jobs``), and what the others (the
    ones ``unchangeable`` names; ``policy`` is one where its rule ``applies``) take per node
    (indexed as ``node_of``; None where none is left out). ``live`` and ``keys``: each
    job's live workers and rank key. ``used``, where the caller keeps it: per node, [gpu,
    cpu, memory] that the live workers of ``jobs`` take; what the left-out jobs take is then
    that less what the shown running ones take (most running jobs are left out). ``best``:
    ``(key,)`` of the best-ranked job below its size (None: none), where the caller found
    it already (``showing.shown_from_sides``)."""
    elastic = policy.elastic
    # Indexed loops over lists: compiled, ``zip`` goes through Python's iteration protocol.
    js = jobs if isinstance(jobs, list) else list(jobs)
    ns = live if isinstance(live, list) else list(live)
    ks = keys if isinstance(keys, list) else list(keys)
    assert len(ns) == len(js) == len(ks)  # (one entry per job in each)
    top = best[0] if best is not None else best_short(js, ns, ks, elastic)
    if top is None:
        return list(js), None
    shown: list[Job] = []
    left: list[Job] = []
    running: list[Job] = []  # shown ones
    for at in range(len(js)):
        n, j = ns[at], js[at]
        if n:
            if unchangeable(j, n, ks[at], top, elastic):
                left.append(j)
                continue
            running.append(j)
        shown.append(j)
    if not left:
        return shown, None
    if used is None:
        taken = [[0, 0, 0] for _ in node_of]
        _count(taken, left, 1, node_of)
    else:
        taken = [list(u) for u in used]
        _count(taken, running, -1, node_of)
    return shown, tuple(
        [_NONE if not (u[0] or u[1] or u[2]) else _made(u[0], u[1], u[2]) for u in taken]
    )


@functools.lru_cache(maxsize=1024)
def _made(gpu: int, cpu_milli: int, memory_bytes: int) -> Resources:
    """One ``Resources`` per value, reused from plan to plan: a node's usage takes few
    values, and compiled, making one runs the frozen dataclass's ``__init__`` as Python
    (about 1 us, 32 per plan on 32 nodes). Resources are immutable and compared by value,
    so a shared one is as good as a new one."""
    return Resources(gpu, cpu_milli, memory_bytes)


def _count(taken: list[list[int]], jobs: list[Job], sign: int, node_of: dict[str, int]) -> None:
    """Add (``sign`` 1) or take away (-1) what the live workers of ``jobs`` take per node
    (the planner counts live replicas only, as ``Derived.usage`` does)."""
    for j in jobs:
        res = j.worker.resources
        for r in j.replicas:
            if r.role is Role.WORKER and not r.draining:
                u = taken[node_of[r.node]]
                u[0] += sign * res.gpu
                u[1] += sign * res.cpu_milli
                u[2] += sign * res.memory_bytes
