"""What one worker more or fewer is worth to a running job, derived once per ``Job`` object.

Rebalancing (``rebalancing``) values a move by each job's fitted model at the job's size and
node count when the step begins, and by ``stability.restart_factor``, which depends on
``now``. Everything else in those values is a function of the job object alone (its samples
and efficiency, its live workers and their nodes, its bounds) and of the policy, so it is
derived once and kept on the job's session state (``JobState.worth``); with an incremental
planner (``incremental``) that state lives from plan to plan for as long as the ``Job``
object does, so a job that did not change is not fitted or scored again. This module knows
the job's values only, not the session, which keeps them.

What must stay true:

- A ``Margins`` describes the job as it was when the cycle began (its live workers): it is
  read only for jobs that this cycle has not moved (rebalancing's members before any move),
  never for a job with replicas added or removed.
- It is valid for one ``Job`` object under one policy: any change of a job's samples,
  efficiency, replicas or bounds is a new ``Job`` (they are frozen) and gets a new
  ``JobState`` (an incremental planner keeps a state only for the very object it was built
  for, under the one policy it plans for).
- ``best_gain`` is never below the value rebalancing gives the job's first extra worker
  (``Rebalancer._gain``), and ``least_loss`` never above the cost it gives the job's first
  lost worker (``Rebalancer._loss``), whatever ``now`` is. Those read ``now`` only through
  the restart factor ``f``, which is within [0, 1] at every instant and multiplies the
  speed-up ``s`` at a changed size: ``-1 / (s f) <= -1 / s`` (``-inf`` at ``f = 0``). So
  the gain ``(-1 / (s+ f) + 1 / s) H - pause`` is at most its value at ``f = 1`` and the
  loss ``(-1 / s + 1 / (s- f)) H + pause`` at least its value at ``f = 1``, which is what
  is kept. Each IEEE operation used is monotone in its operands, so the inequalities hold
  for the computed floats, not only for the reals. Cool-downs and the minimum run (the
  other rules that read ``now``) only remove jobs from the step, never add one.
"""

from __future__ import annotations

from typing import Final

from edl_scheduler.core.snapshot import Job, Replica
from edl_scheduler.core.throughput import ThroughputModel, job_model

_INF: Final = float("inf")


class Margins:
    """A job's model and its values at its live size (``workers`` on ``nodes`` nodes).
    Nothing changes one once made. A plain class: compiled, its ``__init__`` is C, where a
    dataclass's is generated Python code (one is made for every new Job object)."""

    __slots__ = (
        "above",
        "at",
        "below",
        "best_gain",
        "growth_score",
        "least_loss",
        "limit",
        "model",
        "nodes",
        "pause",
        "workers",
    )

    def __init__(
        self,
        model: ThroughputModel,
        limit: int,
        nodes: int,
        workers: int,
        at: float,
        above: float,
        below: float,
        pause: float,
        growth_score: float,
        best_gain: float,
        least_loss: float,
    ) -> None:
        self.model = model
        #: ``explored_limit``: the most workers a rebalancing move may give the job.
        self.limit = limit
        #: Nodes its live workers are on (at least 1) and how many live workers it has.
        self.nodes = nodes
        self.workers = workers
        #: Speed-ups at ``workers`` on ``nodes`` (0 at none), one worker more, one fewer.
        self.at = at
        self.above = above
        self.below = below
        #: What one pause costs the job in the objective, horizon-weighted.
        self.pause = pause
        #: Growth's rank term for one more worker (``growing._score``):
        #: ``-round(above - at, 9)``.
        self.growth_score = growth_score
        #: Upper bound of the value of one more worker (``-inf`` at its explored limit).
        self.best_gain = best_gain
        #: Lower bound of the cost of one worker fewer (``inf`` at one worker or its
        #: minimum).
        self.least_loss = least_loss


def explored_limit(job: Job, lo: int, hi: int) -> int:
    """The most workers a rebalancing move, or growth on evidence (``Policy.ramp_s``), may
    give ``job`` (bounds ``lo`` and ``hi`` under the policy): its requested size (the size
    its user asked for, taken on their word), or twice the largest size its runtime
    measured a throughput at, whichever is larger, within its bounds (its minimum when it
    has neither). Beyond that its speed-up is the prior's guess."""
    measured = max((s.workers for s in job.throughput if s.samples_per_second > 0), default=0)
    asked = job.requested if job.requested is not None else 0
    return min(hi, max(lo, 1, asked, 2 * measured))


def derive(
    job: Job, live: list[Replica], lo: int, hi: int, horizon_s: float, pause_s: float
) -> Margins:
    """The margins of ``job`` with ``live`` workers and bounds ``lo``, ``hi``, under a
    policy's gain horizon and resize pause."""
    workers = len(live)
    nodes = max(1, len({r.node for r in live}))
    model = job_model(job)
    limit = explored_limit(job, lo, hi)
    # The same operations, in the same order, as ``Rebalancer._gain`` and ``_loss`` at
    # f = 1 (``_Member.utility``: -1 / speed-up, -inf at none).
    at = model.speedup(nodes, workers) if workers > 0 else 0.0
    above = model.speedup(nodes, workers + 1)
    below = model.speedup(nodes, workers - 1) if workers > 1 else 0.0
    pause = pause_s / at if at > 0 else 0.0
    u_at = -1.0 / at if at > 0 else -_INF
    if workers >= limit:
        best = -_INF
    else:
        u_above = -1.0 / above if above > 0 else -_INF
        best = (u_above - u_at) * horizon_s - pause
    if workers <= max(1, lo):
        least = _INF
    else:
        u_below = -1.0 / below if below > 0 else -_INF
        least = (u_at - u_below) * horizon_s + pause
    growth = -round(above - at, 9)
    return Margins(model, limit, nodes, workers, at, above, below, pause, growth, best, least)


def first_gain(kept: Margins, factor: float, horizon_s: float) -> float:
    """The value rebalancing gives the job's first extra worker at restart factor
    ``factor`` (``Rebalancer._gain`` of an unmoved member below its explored limit): the
    same operations on the same floats, so the very value, not a bound. Unmoved, the member
    is at ``workers`` on ``nodes``, where its speed-ups are the kept ones."""
    up = kept.above * factor  # (``_Member.utility`` at a changed size)
    u_above = -1.0 / up if up > 0 else -_INF
    at = kept.at
    u_at = -1.0 / at if at > 0 else -_INF
    return (u_above - u_at) * horizon_s - kept.pause


def first_loss(kept: Margins, factor: float, horizon_s: float) -> float:
    """The cost rebalancing gives the job's first lost worker at restart factor ``factor``
    (``Rebalancer._loss`` of an unmoved member above one worker and its minimum): the very
    value, as ``first_gain``."""
    at = kept.at
    u_at = -1.0 / at if at > 0 else -_INF
    down = kept.below * factor
    u_below = -1.0 / down if down > 0 else -_INF
    return (u_at - u_below) * horizon_s + kept.pause
