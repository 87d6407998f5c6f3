"""Policies: configurations of the one planner, never separate planners.

EDL's own policy and the baselines the simulator compares against (rigid FIFO gang
scheduling, Tiresias' discretized 2D-LAS, Paddle EDL's original autoscaler) are all values of
``Policy``, so a comparison runs the same placement, fit and bookkeeping code on every side.

Each policy declares which invariants of DESIGN.md section 3 it promises; the property tests
check each policy on exactly those.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from enum import Enum, IntEnum


class Invariant(IntEnum):
    """The numbered invariants of DESIGN.md section 3."""

    NO_OVERCOMMIT = 1
    GANG = 2
    MIN_KEPT = 3
    PRIORITY_FIRST = 4
    WORK_CONSERVING = 5
    IDEMPOTENT = 6
    STABLE = 7


class Ordering(Enum):
    """How jobs are ranked within a priority level (or overall, without priorities).

    FIFO: by submit time. LEAST_ATTAINED: least attained GPU-time first (job durations are
    unknown; favouring jobs that had little service shortens average JCT). LAS_QUEUES:
    Tiresias' discretized 2D-LAS, queues by attained GPU-time thresholds, FIFO inside
    (running jobs first where the policy's ``las_running_first`` says so).
    """

    FIFO = "fifo"
    LEAST_ATTAINED = "least-attained"
    LAS_QUEUES = "las-queues"


class Admission(Enum):
    """HEAD_OF_LINE: a waiting job blocks every job ranked below it (strict FIFO).
    BACKFILL: jobs ranked below a waiting job may start where they fit."""

    HEAD_OF_LINE = "head-of-line"
    BACKFILL = "backfill"


class Preemption(Enum):
    """What may be taken from running jobs to admit a waiting one.

    SHRINK: workers above the victims' minimum. SHRINK_THEN_SUSPEND: then whole
    lower-priority jobs. SUSPEND: whole jobs only (rigid, preemptive baselines)."""

    NONE = "none"
    SHRINK = "shrink"
    SHRINK_THEN_SUSPEND = "shrink-then-suspend"
    SUSPEND = "suspend"


class EqualShrinking(Enum):
    """Which running jobs of its own priority, ranked below it, a waiting job may shrink
    (take workers above their minimum from) to start.

    ANY: every one. AFTER_MINIMUM_RUN: those that have run ``Policy.suspension_min_run_s``
    since they started, the run after which the policy would suspend one whole: a job
    shrunk to its minimum soon after it started loses more than the newcomer gains, and
    one that has run that long has paid for the pause. NEVER: none."""

    ANY = "any"
    AFTER_MINIMUM_RUN = "after-minimum-run"
    NEVER = "never"


class Growth(Enum):
    """How idle GPUs are shared among running jobs below their maximum.

    MARGINAL_GAIN: the largest predicted speed-up from the job's throughput model (a prior
    model where the job has measured nothing), ties by fulfillment. FULFILLMENT: the least
    fulfilled first, EDL's (cur-min)/(max-min)."""

    NONE = "none"
    FULFILLMENT = "fulfillment"
    MARGINAL_GAIN = "marginal-gain"


ALL_INVARIANTS = frozenset(Invariant)
#: A job of the waiting job's own level is suspended only after a run of at least this many
#: times what its suspension costs (``Policy.suspension_min_run_s``).
SUSPEND_PAYBACK = 10.0
#: What suspending a job and resuming it costs, as measured on our PyTorch runtime for a
#: 1 GiB checkpoint (``python benchmarks/suspend_cost.py``, two workers, 2-core CPU, gloo:
#: 7.9 s fixed + 44.6 s per GiB; ``docs/runtime.md``, "Numbers"): the checkpoint written by
#: the drained rank 0, fresh processes started, the group formed, the checkpoint loaded and
#: broadcast. The ``edl`` preset's estimate, and the simulator's default charge.
MEASURED_SUSPEND_COST_S = 52.0


@dataclass(frozen=True, slots=True)
class Policy:
    """One scheduling policy. Times are seconds.

    ``cooldown_s``: least time between two resizes of a job. ``min_run_s``: least time a job
    runs before it may be shrunk (unless invariant 4 demands it). ``reservation_timeout_s``:
    how long GPUs freed for a job stay held for it. ``resize_pause_s``: what one resize costs
    a job; a resize is made only when its expected gain over ``gain_horizon_s`` exceeds it.
    ``max_load``: growth stops once this fraction of the cluster's GPUs is allocated.
    ``queue_thresholds_gpu_s``: LAS queue boundaries in attained GPU-seconds.
    ``starvation_limit_s``: a LAS job waiting this long returns to the first queue.
    ``las_running_first``: within one LAS queue, jobs that run rank above jobs that wait, so
    a waiting job preempts only jobs of lower queues, never one of its own. The Tiresias
    simulator works so (after every round it moves each waiting job behind the running jobs
    of its queue); without it, FIFO inside a queue lets an older waiting job suspend a
    younger running one of the same queue, and in the last queue (no demotion below it)
    long jobs then wait for every older long job to finish.
    ``shrink_equal_priority``: which running jobs of its own priority ranked below it a
    waiting job may shrink (``EqualShrinking``); jobs of lower priority it always may.
    ``reclaim_equal_priority``: a waiting job may also shrink an equal ranked above it once
    that one is past its minimum run and cool-down (it gives back workers it borrowed).
    ``suspend_equal_priority``: where the policy suspends and ranks by priority, admission
    may also suspend a whole running job of the waiting job's own priority ranked below it
    (by the ordering); off, only jobs of lower priority. Without priorities every job
    ranked below may be suspended. Either way, one of the waiting job's own level only once
    it has run ``suspension_min_run_s`` since its start (``preempting.may_suspend``).
    ``suspend_cost_s``: what the planner takes one suspension and its resume to cost a job
    (the checkpoint saved, the job restarted, the checkpoint restored: measured by
    ``benchmarks/suspend_cost.py``); 0 where the policy counts no cost.
    ``ramp_s``: growth on evidence (``stability.may_ramp``). Set, growth never takes a job
    past its requested size or twice the largest size its runtime measured, whichever is
    larger (``margins.explored_limit``; a job that gives neither is bounded by its maximum
    alone), and a job on its way up (at the largest size it measured, its last growth's
    measured speed-up worth the pause) may grow again ``ramp_s`` after its last resize
    instead of after its cool-down. None: growth trusts the fitted model or the prior at
    any size, once per cool-down.
    """

    name: str
    elastic: bool = True
    use_priority: bool = True
    ordering: Ordering = Ordering.FIFO
    admission: Admission = Admission.BACKFILL
    preemption: Preemption = Preemption.SHRINK
    reclaim_equal_priority: bool = True
    shrink_equal_priority: EqualShrinking = EqualShrinking.ANY
    growth: Growth = Growth.MARGINAL_GAIN
    cooldown_s: float = 300.0
    min_run_s: float = 300.0
    reservation_timeout_s: float = 600.0
    resize_pause_s: float = 10.0
    gain_horizon_s: float = 600.0
    max_load: float = 1.0
    queue_thresholds_gpu_s: tuple[float, ...] = ()
    starvation_limit_s: float | None = None
    las_running_first: bool = False
    suspend_equal_priority: bool = False
    suspend_cost_s: float = 0.0
    ramp_s: float | None = None
    promises: frozenset[Invariant] = field(default=ALL_INVARIANTS)

    def promised(self, invariant: Invariant) -> bool:
        return invariant in self.promises

    # What the policy's fields make the planner do, asked by its steps and by every proof
    # that something cannot happen (``incremental``, the simulator's shortcuts): one answer
    # each, here.

    @property
    def grows(self) -> bool:
        """Whether growth (and rebalancing) can change a running job's size."""
        return self.elastic and self.growth is not Growth.NONE

    @property
    def shrinks(self) -> bool:
        """Whether admission may take workers above their minimum from running jobs. Without
        priorities every job is an equal: where equals are never shrunk, only reclaiming
        does."""
        return self.preemption in (Preemption.SHRINK, Preemption.SHRINK_THEN_SUSPEND) and (
            self.use_priority
            or self.shrink_equal_priority is not EqualShrinking.NEVER
            or self.reclaim_equal_priority
        )

    @property
    def reclaims(self) -> bool:
        """Whether admission may shrink an equal ranked above the job it starts."""
        return self.shrinks and self.reclaim_equal_priority

    @property
    def suspends(self) -> bool:
        """Whether admission may suspend whole running jobs."""
        return self.preemption in (Preemption.SUSPEND, Preemption.SHRINK_THEN_SUSPEND)

    @property
    def suspension_min_run_s(self) -> float:
        """Least time a job runs before a waiting job of its own level may suspend it: its
        minimum run, and at least ``SUSPEND_PAYBACK`` times what the suspension costs, so
        that suspending and resuming a job never costs more than a tenth of the run it
        ends (the ski-rental rule: pay the switch only once the run has paid for it)."""
        return max(self.min_run_s, SUSPEND_PAYBACK * self.suspend_cost_s)

    @property
    def suspends_by_rank(self) -> bool:
        """Whether admission may suspend any job ranked below the one it starts, not only
        jobs of lower priority (those that have not run their minimum time excepted, where
        the two differ: ``preempting.may_suspend``)."""
        return self.suspends and (not self.use_priority or self.suspend_equal_priority)

    @property
    def equals_yield_after_s(self) -> float | None:
        """How long after its start a running job first becomes one that a waiting job of
        its own priority may shrink or suspend, where a run of its own decides that
        (``preempting.equal_may_shrink``, ``may_suspend``); None where nothing does. A
        time-based rule: a driver that plans only when something happens (the simulator)
        wakes a plan then."""
        after = self.suspension_min_run_s
        shrink = self.shrinks and self.shrink_equal_priority is EqualShrinking.AFTER_MINIMUM_RUN
        return after if after > 0 and (shrink or self.suspends_by_rank) else None

    @property
    def moves_whole_jobs_only(self) -> bool:
        """Whether a plan changes a job only by starting it or suspending it whole: no
        growth, no shrinking, no priorities (which let an arrival reach past the ranks)."""
        return not self.grows and not self.use_priority and not self.shrinks


_RIGID_PROMISES = frozenset(
    {Invariant.NO_OVERCOMMIT, Invariant.GANG, Invariant.MIN_KEPT, Invariant.IDEMPOTENT}
)

#: The Tiresias paper's LAS queue boundaries (GPU-seconds): a job is in the first queue
#: until it has held about one GPU-hour, the second until two, the last after.
TIRESIAS_THRESHOLDS_GPU_S = (3250.0, 7200.0)

#: How soon a job on its way up may grow again (``Policy.ramp_s``): one planning period
#: of the Pollux simulator's rounds, so a young job doubles each round while it pays.
RAMP_S = 60.0

PRESETS: dict[str, Policy] = {
    # Within a priority level, least attained service first, in discretized queues (job
    # durations are unknown and heavy-tailed: a job that has had little service is likely
    # to need little more), running jobs first inside a queue (no job of a queue suspends
    # another of the same queue). A waiting job takes workers above the minimum of jobs
    # ranked below it, those of its own priority only once they have run their minimum
    # time, then suspends whole jobs ranked below it (of its own priority, after that
    # minimum too); it does not reclaim workers from equals ranked above it. It grows on
    # evidence: a job gets its requested size on its user's word and more as its measured
    # speed-up vouches, a minute after each step up while each step pays.
    "edl": Policy(
        name="edl",
        ordering=Ordering.LAS_QUEUES,
        queue_thresholds_gpu_s=TIRESIAS_THRESHOLDS_GPU_S,
        las_running_first=True,
        preemption=Preemption.SHRINK_THEN_SUSPEND,
        reclaim_equal_priority=False,
        shrink_equal_priority=EqualShrinking.AFTER_MINIMUM_RUN,
        suspend_equal_priority=True,
        suspend_cost_s=MEASURED_SUSPEND_COST_S,
        ramp_s=RAMP_S,
    ),
    "edl-fulfillment": Policy(
        name="edl-fulfillment",
        use_priority=False,
        growth=Growth.FULFILLMENT,
        cooldown_s=0.0,
        min_run_s=0.0,
        resize_pause_s=0.0,
        max_load=0.97,
        # Paddle EDL's autoscaler has no cool-down and reclaims from the most fulfilled job
        # whatever its rank, so a job grown in one plan can be shrunk by the next at the same
        # instant: it promises neither rank-based priority (4) nor idempotence (6).
        promises=frozenset(
            {
                Invariant.NO_OVERCOMMIT,
                Invariant.GANG,
                Invariant.MIN_KEPT,
                Invariant.WORK_CONSERVING,
            }
        ),
    ),
    "fifo-gang": Policy(
        name="fifo-gang",
        elastic=False,
        use_priority=False,
        admission=Admission.HEAD_OF_LINE,
        preemption=Preemption.NONE,
        growth=Growth.NONE,
        promises=_RIGID_PROMISES,
    ),
    "fifo-backfill": Policy(
        name="fifo-backfill",
        elastic=False,
        use_priority=False,
        preemption=Preemption.NONE,
        growth=Growth.NONE,
        promises=_RIGID_PROMISES,
    ),
    "tiresias": Policy(
        name="tiresias",
        elastic=False,
        use_priority=False,
        ordering=Ordering.LAS_QUEUES,
        preemption=Preemption.SUSPEND,
        growth=Growth.NONE,
        min_run_s=0.0,
        queue_thresholds_gpu_s=TIRESIAS_THRESHOLDS_GPU_S,
        las_running_first=True,
        promises=_RIGID_PROMISES,
    ),
    "tiresias-pollux": Policy(
        name="tiresias-pollux",
        elastic=False,
        use_priority=False,
        ordering=Ordering.LAS_QUEUES,
        preemption=Preemption.SUSPEND,
        growth=Growth.NONE,
        min_run_s=0.0,
        queue_thresholds_gpu_s=(16 * 3600.0,),
        # The Pollux simulator's port of Tiresias keeps each queue in arrival (or demotion)
        # order whatever runs: a waiting job may suspend a younger one of its own queue.
        las_running_first=False,
        promises=_RIGID_PROMISES,
    ),
}


class UnknownPolicyError(ValueError):
    """Raised for a policy name that is not a preset."""


def preset(name: str) -> Policy:
    try:
        return PRESETS[name]
    except KeyError:
        known = ", ".join(sorted(PRESETS))
        raise UnknownPolicyError(f"policy {name!r} is not known: use one of {known}") from None


def with_overrides(policy: Policy, **overrides: object) -> Policy:
    """A copy of ``policy`` with some fields replaced (the config loader's one entry point)."""
    return replace(policy, **overrides)  # type: ignore[arg-type]
