"""Retreat: a running job gives back the workers its own measurements say slow it down.

Growth and rebalancing judge a job one worker at a time from where it runs, at its present
node count, so a job that grew across nodes, where synchronization costs more than the
extra GPUs give at its batch, compares only one worker more or fewer across nodes from
there on, and may even go on growing where many workers across nodes beat a few across
nodes: a job whose fixed batch runs fastest on the four GPUs of one node was seen on 32
GPUs over eight nodes, slower than on four. Pollux re-decides every allocation whole each
round and so never keeps a job at a size its model says is slower than a smaller one; this
step gives each job that much.

A running job retreats to the smaller size its fitted model (``throughput.job_model``: its
own measurements, weighed by its efficiency where it reports one) says runs fastest, kept on
the nodes where it has most workers, when that speed-up pays for the resize pause over the
policy's horizon (``stability.worth_the_pause``, the rule growth obeys). Only sizes its
measurements give evidence for count (``best_retreat``: never above its largest measured
size, where growth and rebalancing trust the same model up to twice that,
``margins.explored_limit``); a job that measured one size or none keeps its size.

It is a voluntary shrink: the job must be past its minimum run and cool-down
(``stability.may_shrink_voluntarily``), preemptible, without parameter servers, and not
resized yet in this cycle. It runs before admission, where the policy grows by marginal gain
on elastic jobs (the policies that rebalance), so what it frees is for the others in the
same cycle; the job itself does not grow again in it (``Reason.RETREATED`` is a hold).
"""

from __future__ import annotations

from functools import lru_cache

from edl_scheduler.core.plan import Reason, counted
from edl_scheduler.core.policy import Growth
from edl_scheduler.core.session import JobState, Session
from edl_scheduler.core.snapshot import Job
from edl_scheduler.core.stability import may_shrink_voluntarily, worth_the_pause
from edl_scheduler.core.throughput import ThroughputModel


@lru_cache(maxsize=65536)
def best_retreat(
    model: ThroughputModel,
    counts: tuple[int, ...],
    lo: int,
    measured: frozenset[tuple[int, bool]],
) -> tuple[int, int, float] | None:
    """Where a job with ``counts`` workers per node (fullest first) runs fastest, by
    ``model``, among the smaller sizes from ``lo`` up that it has evidence for, each kept on
    its fullest nodes: ``(workers, nodes, relative speed-up)``, or None where none runs
    faster than its present size. Ties go to the smaller size. Whether the speed-up pays
    the pause is the caller's to ask (``stability.worth_the_pause``).

    ``measured`` holds each size the job measured as ``(workers, on one node)``. A size
    counts where the job measured it as it would run (on one node, or across nodes), or up
    to its largest measured size where the model is not guessing below a measurement: it
    measured that kind of run, with synchronization (two workers or more), at a smaller
    size, or at no larger one. A job measured at one worker and at six alone leaves the
    fit free to put the best size anywhere between (100 and 130 samples/s fit a model
    whose best is two, at 158), which is no reason to shrink it."""
    workers = sum(counts)
    now = model.throughput(len(counts), workers)
    if now <= 0:
        return None
    best: tuple[int, int, float] | None = None
    best_rate = now
    nodes, held = 0, 0
    for size in range(max(1, lo), workers):
        while held < size:
            held += counts[nodes]
            nodes += 1
        if not _known(measured, size, nodes == 1):
            continue
        rate = model.throughput(nodes, size)
        if rate > best_rate:
            best, best_rate = (size, nodes, rate / now - 1.0), rate
    return best


def _known(measured: frozenset[tuple[int, bool]], size: int, one_node: bool) -> bool:
    """Whether ``measured`` gives evidence for ``size`` workers run on one node
    (``one_node``) or across nodes (``best_retreat``)."""
    if (size, one_node) in measured:
        return True
    if size > max(workers for workers, _ in measured):
        return False
    above = False
    for workers, kind in measured:
        if kind is one_node and workers >= 2:
            if workers < size:
                return True
            above = True
    return not above


def _counts(js: JobState) -> tuple[list[str], tuple[int, ...]]:
    """The job's nodes, fullest first (then by name), and its live workers on each."""
    per: dict[str, int] = {}
    for r in js.live_w:
        per[r.node] = per.get(r.node, 0) + 1
    order = sorted(per, key=lambda n: (-per[n], n))
    return order, tuple(per[n] for n in order)


def _measured(job: Job) -> frozenset[tuple[int, bool]]:
    """Each size ``job``'s runtime measured a throughput at, as ``(workers, on one node)``."""
    return frozenset((s.workers, s.nodes <= 1) for s in job.throughput if s.samples_per_second > 0)


def target(js: JobState) -> tuple[int, int, float] | None:
    """``best_retreat`` for ``js`` at its live size, worked out once for its ``Job`` object
    and kept on its state (it reads the job and its bounds alone, and a state serves one
    Job object under one policy)."""
    if js.retreat_known:
        return js.retreat_to
    found = None
    measured = _measured(js.job)
    if len(measured) >= 2:  # (one size measured or none: nothing to compare)
        found = best_retreat(js.model(), _counts(js)[1], js.lo, measured)
    js.retreat_known, js.retreat_to = True, found
    return found


def retreat(session: Session) -> None:
    """Take every eligible running job back to a smaller size it runs faster at."""
    policy = session.policy
    if not policy.elastic or policy.growth is not Growth.MARGINAL_GAIN:
        return
    if policy.gain_horizon_s <= 0:
        return
    for js in session.jobs:
        workers = js.workers
        if workers < 2 or workers <= js.lo or len(js.live_w) != workers:
            continue  # (not running as it ran, or nothing to give back)
        job = js.job
        if js.suspended or job.suspended or job.pserver is not None or not job.preemptible:
            continue
        if js.started or js.added_w or js.removed_w or job.worker.resources.gpu <= 0:
            continue
        found = target(js)
        if found is None or not worth_the_pause(session, found[2]):
            continue
        if not may_shrink_voluntarily(session, js):
            continue
        size, nodes, gain = found
        _shrink(session, js, size)
        js.reason = Reason.RETREATED
        js.message = (
            f"shrunk {workers}->{size} on {counted(nodes, 'node')}: its measurements say it "
            f"runs {gain:.0%} faster there"
        )


def _shrink(session: Session, js: JobState, size: int) -> None:
    """Keep ``size`` workers on the job's fullest nodes, its oldest there; the rest leave."""
    order, counts = _counts(js)
    keep: dict[str, int] = {}
    left = size
    for node, n in zip(order, counts, strict=True):
        keep[node] = min(n, left)
        left -= keep[node]
    gone = []
    for r in js.live_w:  # (oldest first: rank 0 stays where its node is kept)
        if keep[r.node] > 0:
            keep[r.node] -= 1
        else:
            gone.append(r)
    stmt = session.statement()
    for r in gone:
        stmt.remove(js, r)
    stmt.commit()
