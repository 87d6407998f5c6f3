"""Which running jobs no plan can change, so that a driver may leave them out of the
snapshot (``IncrementalPlanner.plan``'s ``occupied`` carries the capacity they take).

Where it applies (``applies``: a policy that moves whole jobs only, ``Policy.
moves_whole_jobs_only``: no growth, no shrinking, no priorities; whose rank keys do not move
at every instant a job runs), with every job's rank key as the plan's ``now`` gives it: a
running job ``H`` exactly at its size (``sizing.gang_size``), with no parameter servers and
not suspended by its spec, ranked above every job below its size (``best_short``), is
unchangeable (``unchangeable``). A driver that keeps rank keys between plans may use them
only where they do not depend on ``now`` (``ordering.key_varies``).

Why no plan changes it, and why the plan of the others is the same without it: ``H`` is at
its size, so admission never visits it and growth never runs. Admission suspends only a job
ranked below the job it starts (``admitting._may_suspend`` without priorities), and the job
it starts is below its size, so ranked below ``H``; a job suspended in the cycle and moved
again takes only from jobs ranked below itself, below that job. ``H`` is in no preemption
pool of any job that admission asks about (each counts the jobs ranked below it). A hold
for it, if any, is dropped either way (a job at its size holds nothing). Placement reads
free capacity per node only, which ``occupied`` keeps as it was; every other comparison of
ranks is between jobs that stay, whose order is unchanged. Only the rank numbers in
messages differ.

What must stay true: the proof above rests on admission, growth and the policy's fields;
``tests/core/test_unchangeable.py`` checks it against ``plan()`` on generated snapshots, so
a change to admission that breaks it fails there.
"""

from __future__ import annotations

from collections.abc import Sequence

from edl_scheduler.core.ordering import ranks_continuously
from edl_scheduler.core.policy import Policy
from edl_scheduler.core.sizing import gang_size
from edl_scheduler.core.snapshot import Job

Key = tuple[float | str, ...]


def applies(policy: Policy) -> bool:
    """Whether the rule holds under ``policy`` (see the module)."""
    return policy.moves_whole_jobs_only and not ranks_continuously(policy)


def best_short(
    jobs: Sequence[Job], live: Sequence[int], keys: Sequence[Key], elastic: bool
) -> Key | None:
    """The rank key of the best-ranked job below its size (None: no job is); ``live`` and
    ``keys``: each job's live workers and rank key, in the order of ``jobs``."""
    # Indexed loops over lists: compiled, ``zip`` goes through Python's iteration protocol.
    js = jobs if isinstance(jobs, list) else list(jobs)
    ns = live if isinstance(live, list) else list(live)
    ks = keys if isinstance(keys, list) else list(keys)
    top: Key | None = None
    for at in range(len(js)):
        n = ns[at]
        if n and n >= gang_size(js[at], elastic):
            continue
        k = ks[at]
        if top is None or k < top:
            top = k
    return top


def unchangeable(job: Job, live: int, key: Key, top: Key, elastic: bool) -> bool:
    """Whether no plan can change ``job`` (``live`` workers, rank key ``key``), where
    ``top`` is the best-ranked key of a job below its size (``best_short``) and the rule
    ``applies``."""
    return (
        live > 0
        and not job.suspended
        and job.pserver is None
        and key < top
        and live == gang_size(job, elastic)
    )
