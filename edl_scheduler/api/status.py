"""The TrainingJob status: where a job stands, written by the controller (or the local backend).

Why this exists: the status is both the user's view (`kubectl get tj`, the one-line
`message`) and the planner's memory between cycles. The planner's snapshot reads from it the
submit time, the last resize, the attained GPU-time and the measured throughput by (nodes,
workers), so those fields are typed, not free text.

What must stay true:
- `phase` is a `JobPhase`, and its docstring is the state diagram the controller follows;
  `JobPhase.can_become` is the one place that diagram is encoded.
- Times are timezone-aware and written as RFC 3339.
- `message` is a single line (any line breaks given are folded into spaces).
- The status never invents knowledge: fields the controller has not measured stay empty.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any, Final

from pydantic import AwareDatetime, BeforeValidator, Field

from edl_gradients import FieldNames, statistics_problem
from edl_scheduler.api.meta import ApiModel

__all__ = [
    "BatchInUse",
    "Condition",
    "ConditionStatus",
    "GradientStatistics",
    "JobPhase",
    "LastResize",
    "ThroughputSample",
    "TrainingJobStatus",
]


class JobPhase(StrEnum):
    """The lifecycle of a job; `can_become` encodes exactly this diagram.

    ::

        Pending ----gang of minReplicas placed----> Running ----resize begins----> Resizing
           ^   <---failures left it below min----      ^   <---new generation formed---+
           |                                           |                               |
        resumed            spec.suspend, or preempted whole (from Pending, Running     |
           |               or Resizing)                                                |
        Suspended <------------------------------------+-------------------------------+

        Running, Resizing --the coordinator committed the last epoch--> Succeeded
        Pending, Running, Resizing, Suspended --restarts beyond maxRestarts--> Failed

    Succeeded and Failed are final: no transition leaves them.
    """

    PENDING = "Pending"
    RUNNING = "Running"
    RESIZING = "Resizing"
    SUSPENDED = "Suspended"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"

    @property
    def final(self) -> bool:
        """Whether the job has ended for good."""
        return self in (JobPhase.SUCCEEDED, JobPhase.FAILED)

    @property
    def active(self) -> bool:
        """Whether the job holds (or is about to hold) workers."""
        return self in (JobPhase.RUNNING, JobPhase.RESIZING)

    def can_become(self, other: JobPhase) -> bool:
        """Whether the diagram above allows going from this phase to `other`."""
        return other is self or other in _NEXT[self]

    def step_toward(self, wanted: JobPhase) -> JobPhase:
        """``wanted`` if the diagram allows it from here, else the phase one step on the way
        (Suspended -> Pending -> Running, Resizing -> Running -> Pending), else this one.

        The controller and the local backend move a job's phase with this, one step per
        cycle, so every phase a user sees is a legal state of the diagram.
        """
        if self.can_become(wanted):
            return wanted
        for middle in (JobPhase.RUNNING, JobPhase.PENDING):
            if self.can_become(middle) and middle.can_become(wanted):
                return middle
        return self


_NEXT: Final[dict[JobPhase, frozenset[JobPhase]]] = {
    JobPhase.PENDING: frozenset({JobPhase.RUNNING, JobPhase.SUSPENDED, JobPhase.FAILED}),
    JobPhase.RUNNING: frozenset(
        {
            JobPhase.RESIZING,
            JobPhase.PENDING,
            JobPhase.SUSPENDED,
            JobPhase.SUCCEEDED,
            JobPhase.FAILED,
        }
    ),
    JobPhase.RESIZING: frozenset(
        {JobPhase.RUNNING, JobPhase.SUSPENDED, JobPhase.SUCCEEDED, JobPhase.FAILED}
    ),
    JobPhase.SUSPENDED: frozenset({JobPhase.PENDING, JobPhase.FAILED}),
    JobPhase.SUCCEEDED: frozenset(),
    JobPhase.FAILED: frozenset(),
}


class ConditionStatus(StrEnum):
    """Whether a condition holds."""

    TRUE = "True"
    FALSE = "False"
    UNKNOWN = "Unknown"


def _one_line(value: object) -> object:
    return " ".join(value.split()) if isinstance(value, str) else value


OneLine = Annotated[str, BeforeValidator(_one_line)]

_CONDITION_TYPE: Final = r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"  # noqa: E501
_REASON: Final = r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$"


class Condition(ApiModel):
    """One observation about the job, in the shape of Kubernetes' metav1.Condition."""

    type: str = Field(max_length=316, pattern=_CONDITION_TYPE)
    """What is observed, in CamelCase (e.g. Admitted, Ready)."""
    status: ConditionStatus
    """True, False or Unknown."""
    reason: str = Field(max_length=1024, pattern=_REASON)
    """Why, as one CamelCase word (e.g. WaitingForGpus)."""
    message: OneLine = ""
    """Why, for a person."""
    last_transition_time: AwareDatetime
    """When status last changed."""
    observed_generation: int | None = Field(default=None, ge=0)
    """The metadata.generation this condition was computed from."""


class LastResize(ApiModel):
    """The most recent change in the number of workers."""

    time: AwareDatetime
    """When the resize was made."""
    from_replicas: int = Field(ge=0, alias="from")
    """Workers before."""
    to_replicas: int = Field(ge=0, alias="to")
    """Workers after."""
    reason: OneLine = ""
    """Why the planner resized the job."""


class ThroughputSample(ApiModel):
    """Measured training speed at one placement size, as the runtime reported it."""

    nodes: int = Field(ge=1)
    """Distinct nodes the workers ran on."""
    workers: int = Field(ge=1)
    """Workers in the group."""
    samples_per_second: float = Field(ge=0)
    """Samples trained per second by the whole group."""
    step_seconds: float | None = Field(default=None, gt=0)
    """Seconds per step, when known."""
    batch: int = Field(default=0, ge=0)
    """The global batch the rate was measured at (0: not reported); the planner weighs the
    rate by this batch's statistical efficiency."""


class GradientStatistics(ApiModel):
    """The job's gradient noise as its runtime measured it last, from which the planner
    weighs throughput by statistical efficiency (Pollux's ``init_batch``, ``grad_sqr``,
    ``grad_var``). Kept as reported, without bounds, so that one bad report never makes the
    whole TrainingJob unreadable: the controller checks the values when it builds the
    planner's snapshot and drops invalid ones with a warning."""

    init_batch: int
    """The global batch the job's learning rate was set for."""
    grad_sqr: float
    """Squared norm of the true gradient (smoothed estimate)."""
    grad_var: float
    """Trace of the covariance of a gradient over ``initBatch`` samples (smoothed)."""
    steps: int = 0
    """Steps the estimate rests on."""

    def problem(self) -> str | None:
        """Why the planner cannot use these values (naming the field), or None."""
        names = FieldNames("efficiency.initBatch", "efficiency.gradSqr", "gradVar")
        return statistics_problem(self.init_batch, self.grad_sqr, self.grad_var, names)


class BatchInUse(ApiModel):
    """What the job's rank 0 runs at, as it reported last: the runtime's own numbers, shown
    beside the planner's, and the bounds its batch adapts within, which the planner reads
    (``core.building.efficiency_from_status``). Kept as reported, like
    ``GradientStatistics``: no bound of ours makes a TrainingJob unreadable; bounds that
    cannot be right are left out of planning with a warning."""

    global_batch: int
    """Samples per optimizer step, over every worker and accumulation step."""
    accumulation: int = 1
    """Forward and backward passes per optimizer step (1: none accumulated)."""
    goodput: float = 0.0
    """Samples per second at the initial batch's efficiency that the job's batch policy
    predicts at this batch (0: it predicts none, or cannot yet)."""
    max_batch: int | None = None
    """The largest global batch an adaptive batch policy may choose (absent: the batch does
    not adapt). The planner then predicts each size at the batch the job would choose
    there."""
    max_local: int | None = None
    """The most samples one GPU holds per pass under that policy."""
    min_local: int | None = None
    """The fewest samples one GPU holds per pass under that policy."""

    @classmethod
    def reported(cls, m: Any) -> BatchInUse:
        """From the coordinator protocol's ``BatchInUse`` message (bounds of 0: not
        reported, left unset, so a batch that does not adapt writes none)."""
        bounds = {
            name: int(getattr(m, name))
            for name in ("max_batch", "max_local", "min_local")
            if int(getattr(m, name)) > 0
        }
        return cls(
            global_batch=int(m.global_batch),
            accumulation=int(m.accumulation),
            goodput=float(m.goodput),
            **bounds,
        )


class TrainingJobStatus(ApiModel):
    """Where the job stands. Written by the controller, read by people and the planner."""

    phase: JobPhase = JobPhase.PENDING
    """Pending, Running, Resizing, Suspended, Succeeded or Failed."""
    message: OneLine = ""
    """One line saying why the job is where it is."""
    observed_generation: int | None = Field(default=None, ge=0)
    """The metadata.generation the controller last acted on."""
    priority: int | None = None
    """The job's effective priority: spec.priority, or its PriorityClass's value."""
    replicas: int = Field(default=0, ge=0)
    """Workers that exist now."""
    ready_replicas: int = Field(default=0, ge=0)
    """Workers that have joined the current generation."""
    pserver_replicas: int = Field(default=0, ge=0)
    """Parameter servers that exist now."""
    selector: str | None = None
    """Label selector of the job's worker pods (for the scale subresource)."""
    allocation: dict[str, str] = Field(default_factory=dict)
    """The node of each replica, by pod name."""
    generation: int = Field(default=0, ge=0)
    """The runtime's group generation; it grows by one on every re-formation."""
    conditions: list[Condition] = Field(default_factory=list)
    """Observations about the job, one per type."""
    last_resize: LastResize | None = None
    """The most recent resize."""
    submit_time: AwareDatetime | None = None
    """When the job was first seen; queueing order is by this time."""
    start_time: AwareDatetime | None = None
    """When the job first ran with its gang."""
    completion_time: AwareDatetime | None = None
    """When the job reached Succeeded or Failed."""
    attained_gpu_seconds: float = Field(default=0.0, ge=0)
    """GPU-seconds the job has held so far (least-attained-service ordering uses it)."""
    throughput: list[ThroughputSample] = Field(default_factory=list)
    """Measured speed by (nodes, workers), for the planner's throughput model."""
    efficiency: GradientStatistics | None = None
    """The gradient statistics the runtime measured last, for the planner's goodput model."""
    batch: BatchInUse | None = None
    """The batch the job runs at and the goodput its runtime predicts there, as reported."""
    progress: dict[str, Any] = Field(default_factory=dict)
    """The runtime's progress report (epoch, step, ...), kept as reported."""
    restarts: int = Field(default=0, ge=0)
    """Failures the job caused so far (its replicas' and its coordinator's), compared with
    failurePolicy.maxRestarts."""
    resizes: int = Field(default=0, ge=0)
    """How often the planner changed the job's size since submission (one per lastResize);
    the planner charges a move of a job moved often more."""

    def condition(self, type_: str) -> Condition | None:
        """The condition of the given type, if the controller has set one."""
        return next((c for c in self.conditions if c.type == type_), None)
