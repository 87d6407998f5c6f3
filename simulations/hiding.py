"""Running jobs the planner need not see: those ranked above every job below its size.

In a congested cluster under ``tiresias`` most running jobs rank above every waiting job
(on ``philly_3d``, 99 of 108 running at an average plan, of 235 shown): no job that could
start may suspend them, and nothing else would move them. The engine leaves them out of
the snapshot and hands the planner the capacity their replicas take (``plan(...,
occupied=...)``), so the plan's cost follows the jobs it may change.

Why the plan is the same (under the premises of ``pruning.settled``: no growth, no
shrinking, no priorities, preemption none or whole-job suspension; a rank key that does
not vary with time): such a job ``H`` is at its size, so admission never visits it and
growth never runs. Admission suspends only a job ranked below the job it starts, which is
below its size, so ranked below ``H``; a job suspended in the cycle and moved again takes
only from jobs ranked below itself, below that job. ``H`` is in no preemption pool of any
job that admission asks about (each counts the jobs ranked below it). Its hold, if any, is
dropped either way (a job at its size holds nothing). Placement reads free capacity per
node only, which ``occupied`` keeps as it was; every other comparison of ranks is between
jobs that stay, whose order is unchanged. Only the rank numbers in messages differ.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

from edl_scheduler.core import Growth, Job, Ordering, Policy, Preemption, Resources, Role

Key = tuple[float | str, ...]

_NONE = Resources()


def hides(policy: Policy) -> bool:
    """Whether the premises hold under ``policy`` (the caller keeps rank keys that do not
    vary with time, and passes them)."""
    return not (
        (policy.elastic and policy.growth is not Growth.NONE)
        or policy.use_priority
        or policy.preemption not in (Preemption.NONE, Preemption.SUSPEND)
        or policy.ordering is Ordering.LEAST_ATTAINED
    )


def split(
    jobs: Sequence[Job],
    live: Sequence[int],
    keys: Sequence[Key],
    policy: Policy,
    node_of: dict[str, int],
    used: Sequence[Sequence[int]] | None = None,
    *,
    best: tuple[Key | None] | None = None,
) -> tuple[list[Job], tuple[Resources, ...] | None]:
    """The jobs the planner must see (in the order of ``jobs``), and what the others take
    per node (indexed as ``node_of``; None where none is left out). ``live`` and ``keys``:
    each job's live workers and rank key. ``used``, where the caller keeps it: per node,
    [gpu, cpu, memory] that the live workers of ``jobs`` take; what the left-out jobs take
    is then that less what the shown running ones take (most running jobs are left out).
    Every job with parameter servers, leaving by its spec, or not exactly at its size is
    shown. ``best``: ``(key,)`` of the best-ranked job below its size (None: none), where
    the caller found it already (``instant.narrow``)."""
    elastic = policy.elastic
    # Indexed loops over lists: compiled, ``zip`` goes through Python's iteration protocol.
    js = jobs if isinstance(jobs, list) else list(jobs)
    ns = live if isinstance(live, list) else list(live)
    ks = keys if isinstance(keys, list) else list(keys)
    assert len(ns) == len(js) == len(ks)  # (one entry per job in each)
    top: Key | None = None  # the best-ranked job below its size
    if best is not None:
        top = best[0]
    else:
        for at in range(len(js)):
            n, j = ns[at], js[at]
            if n:
                w = j.worker
                if n >= (w.min_replicas if elastic else j.rigid_size):
                    continue
            k = ks[at]
            if top is None or k < top:
                top = k
    if top is None:
        return list(js), None
    shown: list[Job] = []
    left: list[Job] = []
    running: list[Job] = []  # shown ones
    for at in range(len(js)):
        n, j = ns[at], js[at]
        if n:
            if not j.suspended and j.pserver is None and ks[at] < top:
                w = j.worker
                if n == (w.min_replicas if elastic else j.rigid_size):
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
