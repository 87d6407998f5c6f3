"""The TrainingJob spec: what a user asks for, checked once, at the boundary.

Why this exists: the planner, the controller, the local backend and the runtime all read the
same spec, and none of them should have to re-check it. Every rule about a single job that
can be decided without looking at the cluster lives here (ranges, which blocks go together);
rules that need the cluster (does this PriorityClass exist?) belong to the controller.

What must stay true:
- Python attribute names are the contract with the planner (`min_replicas`, `max_replicas`,
  `resources.cpu_milli`, ...); wire names are their camelCase aliases.
- Every problem names its field and its fix, through `field_problem` for cross-field rules.
- `resources` quantities are exact (`quantity.py`); `cpu_milli` and `memory_bytes` are what
  the planner compares with node capacity.
- Only what Kubernetes 1.20 can check structurally goes into the CRD; cross-field rules are
  enforced by these validators, in the controller, and reported on the job.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Self

from pydantic import Field, model_validator

from edl_scheduler.api.meta import ApiModel, field_problem
from edl_scheduler.api.quantity import Quantity
from edl_scheduler.api.template import PodTemplate

__all__ = [
    "BatchMode",
    "BatchPolicy",
    "CoordinatorSpec",
    "CoordinatorState",
    "FailurePolicy",
    "Framework",
    "LrRule",
    "PServerSpec",
    "ReplicaResources",
    "StateKind",
    "Strategy",
    "Timeouts",
    "TrainingJobSpec",
]

# Kubernetes caps user PriorityClass values at one billion; higher values are for the system.
PRIORITY_MIN = -(2**31)
PRIORITY_MAX = 1_000_000_000
# Bounds on what a job may ask, each far above what any cluster or job needs and well within
# what the planner, a timeout and the runtime can hold: a larger number is a typo or junk,
# refused with the field rather than carried into every cycle. Counts are whole numbers as
# written (strict: `true` or `2.0` is not a count).
MAX_REPLICAS = 10_000
MAX_GPUS = 64
MAX_TIMEOUT_S = 86_400
MAX_RESTARTS = 100_000
MAX_BATCH = 2**31 - 1
MAX_STEPS = 10**9


class Framework(StrEnum):
    """The training framework whose adapter the runtime loads."""

    TORCH = "torch"
    PADDLE = "paddle"
    NONE = "none"


class Strategy(StrEnum):
    """How workers share gradients: one allreduce group, or parameter servers."""

    ALLREDUCE = "allreduce"
    PS = "ps"


class StateKind(StrEnum):
    """Where the coordinator's state outlives its pod."""

    SNAPSHOT = "snapshot"
    """The controller keeps snapshots of it in a ConfigMap the job owns."""
    VOLUME = "volume"
    """The coordinator writes it to a PersistentVolumeClaim the job names."""


class BatchMode(StrEnum):
    """What happens to the batch when the number of workers changes."""

    FIXED_GLOBAL_BATCH = "fixedGlobalBatch"
    SCALE_WITH_WORKERS = "scaleWithWorkers"
    NONE = "none"


class LrRule(StrEnum):
    """How the learning rate follows the global batch under `scaleWithWorkers`."""

    LINEAR = "linear"
    SQRT = "sqrt"
    NONE = "none"


class ReplicaResources(ApiModel):
    """What one replica requests. cpu and memory are Kubernetes quantities."""

    gpu: int = Field(default=0, ge=0, le=MAX_GPUS, strict=True, alias="nvidia.com/gpu")
    """GPUs per replica."""
    cpu: Quantity | None = None
    """CPU per replica, e.g. 4 or 500m."""
    memory: Quantity | None = None
    """Memory per replica, e.g. 16Gi."""

    @property
    def cpu_milli(self) -> int:
        """CPU in millicores, rounded up as Kubernetes does; 0 when not requested."""
        return self.cpu.milli if self.cpu is not None else 0

    @property
    def memory_bytes(self) -> int:
        """Memory in bytes, rounded up to a whole byte; 0 when not requested."""
        return self.memory.units if self.memory is not None else 0


def _check_replica_range(model: PServerSpec | TrainingJobSpec) -> None:
    if model.max_replicas < model.min_replicas:
        raise field_problem(
            "maxReplicas",
            "{max} is below {at}minReplicas ({min}): raise {at}maxReplicas or lower "
            "{at}minReplicas",
            max=model.max_replicas,
            min=model.min_replicas,
        )


class PServerSpec(ApiModel):
    """The parameter servers of a `ps` job."""

    min_replicas: int = Field(ge=1, le=MAX_REPLICAS, strict=True)
    """Fewest parameter servers the job runs with."""
    max_replicas: int = Field(ge=1, le=MAX_REPLICAS, strict=True)
    """Most parameter servers the job may be given."""
    resources: ReplicaResources = Field(default_factory=ReplicaResources)
    """What one parameter server requests."""

    @model_validator(mode="after")
    def _range(self) -> Self:
        _check_replica_range(self)
        return self


class CoordinatorState(ApiModel):
    """Where the coordinator keeps its state (generation, shard queue, committed step)."""

    kind: StateKind = StateKind.SNAPSHOT
    """snapshot (a ConfigMap the controller keeps) or volume (a claim the job names)."""
    claim_name: str | None = Field(default=None, min_length=1)
    """The PersistentVolumeClaim to use when kind is volume."""

    @model_validator(mode="after")
    def _claim_fits_kind(self) -> Self:
        if self.kind is StateKind.VOLUME and self.claim_name is None:
            raise field_problem(
                "claimName",
                "is required when kind is volume: name a PersistentVolumeClaim, or use "
                "kind: snapshot",
            )
        if self.kind is StateKind.SNAPSHOT and self.claim_name is not None:
            raise field_problem(
                "claimName",
                "only applies when kind is volume: remove claimName or set kind: volume",
            )
        return self


class CoordinatorSpec(ApiModel):
    """The per-job coordinator that hands out data shards and forms worker groups."""

    image: str | None = Field(default=None, min_length=1)
    """Image of the coordinator; defaults to the first worker container's image."""
    state: CoordinatorState = Field(default_factory=CoordinatorState)
    """Where the coordinator's state outlives its pod."""

    def effective_image(self, template: PodTemplate) -> str:
        """The image to run: `image` if given, else the worker's image."""
        return self.image if self.image is not None else template.worker_image


class Timeouts(ApiModel):
    """Bounds on the resize protocol, so that no worker waits forever."""

    join_seconds: int = Field(default=60, ge=1, le=MAX_TIMEOUT_S, strict=True)
    """How long a new worker may take to join a generation before it is replaced."""
    drain_seconds: int = Field(default=30, ge=1, le=MAX_TIMEOUT_S, strict=True)
    """How long a leaving worker may take to hand back its shards before it is deleted."""


class FailurePolicy(ApiModel):
    """What the job tolerates before it fails."""

    max_restarts: int = Field(default=3, ge=0, le=MAX_RESTARTS, strict=True)
    """Worker failures the job survives before its phase becomes Failed."""


class BatchPolicy(ApiModel):
    """How the runtime adapts the batch and learning rate when workers come and go."""

    mode: BatchMode = BatchMode.NONE
    """fixedGlobalBatch, scaleWithWorkers or none."""
    global_batch_size: int | None = Field(default=None, ge=1, le=MAX_BATCH, strict=True)
    """The global batch kept under fixedGlobalBatch (at least maxReplicas)."""
    lr_rule: LrRule = LrRule.NONE
    """How the learning rate follows the batch under scaleWithWorkers."""
    warmup_steps: int = Field(default=0, ge=0, le=MAX_STEPS, strict=True)
    """Steps over which a learning-rate change is ramped in."""
    momentum_compensation: bool = False
    """Correct momentum after a learning-rate change."""

    @model_validator(mode="after")
    def _fields_fit_mode(self) -> Self:
        fixed = self.mode is BatchMode.FIXED_GLOBAL_BATCH
        if fixed and self.global_batch_size is None:
            raise field_problem(
                "globalBatchSize",
                "is required when mode is fixedGlobalBatch: give the global batch size",
            )
        if not fixed and self.global_batch_size is not None:
            raise field_problem(
                "globalBatchSize",
                "only applies when mode is fixedGlobalBatch: set mode: fixedGlobalBatch or "
                "remove globalBatchSize",
            )
        if self.lr_rule is not LrRule.NONE and self.mode is not BatchMode.SCALE_WITH_WORKERS:
            raise field_problem(
                "lrRule",
                "{rule} only applies when mode is scaleWithWorkers: set mode: "
                "scaleWithWorkers or lrRule: none",
                rule=self.lr_rule,
            )
        if self.lr_rule is LrRule.NONE and self.warmup_steps:
            raise field_problem(
                "warmupSteps", "needs an lrRule to warm up: set lrRule or warmupSteps: 0"
            )
        if self.lr_rule is LrRule.NONE and self.momentum_compensation:
            raise field_problem(
                "momentumCompensation",
                "needs an lrRule to compensate for: set lrRule or momentumCompensation: false",
            )
        return self


class TrainingJobSpec(ApiModel):
    """What the user asks for: a range of workers, a priority, and how to run them."""

    min_replicas: int = Field(ge=1, le=MAX_REPLICAS, strict=True)
    """Fewest workers the job runs with; it starts only when this many fit at once."""
    max_replicas: int = Field(ge=1, le=MAX_REPLICAS, strict=True)
    """Most workers the job may be given; `kubectl scale` sets this."""
    replicas: int | None = Field(default=None, ge=1, le=MAX_REPLICAS, strict=True)
    """The size the job asks for: rigid policies run it so; edl gives it so before it measures."""
    priority: int | None = Field(default=None, ge=PRIORITY_MIN, le=PRIORITY_MAX, strict=True)
    """A plain priority value; higher runs first. Give this or priorityClassName."""
    priority_class_name: str | None = Field(default=None, min_length=1)
    """A Kubernetes PriorityClass whose value is the job's priority."""
    preemptible: bool = True
    """Whether higher-priority jobs may shrink this job toward minReplicas."""
    framework: Framework = Framework.TORCH
    """The framework adapter the runtime uses."""
    resources: ReplicaResources = Field(default_factory=ReplicaResources)
    """What each worker requests."""
    strategy: Strategy = Strategy.ALLREDUCE
    """allreduce, or ps (parameter servers, described by pserver)."""
    pserver: PServerSpec | None = None
    """The parameter servers; required when strategy is ps, forbidden otherwise."""
    template: PodTemplate
    """The worker pod template; its nodeSelector, affinity and tolerations bind placement."""
    coordinator: CoordinatorSpec = Field(default_factory=CoordinatorSpec)
    """The job's coordinator."""
    timeouts: Timeouts = Field(default_factory=Timeouts)
    """Join and drain deadlines of a resize."""
    failure_policy: FailurePolicy = Field(default_factory=FailurePolicy)
    """How many failures the job survives."""
    batch_policy: BatchPolicy = Field(default_factory=BatchPolicy)
    """How batch size and learning rate follow the number of workers."""
    suspend: bool = False
    """Hold the job with no workers (its state is kept) until this is false again."""

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        if self.priority is not None and self.priority_class_name is not None:
            raise field_problem(
                "priorityClassName",
                "cannot be set together with {at}priority: keep one of the two",
            )
        _check_replica_range(self)
        if self.strategy is Strategy.PS and self.pserver is None:
            raise field_problem(
                "pserver",
                "is required when strategy is ps: add a pserver block with minReplicas "
                "and maxReplicas, or use strategy: allreduce",
            )
        if self.strategy is not Strategy.PS and self.pserver is not None:
            raise field_problem(
                "pserver",
                "only applies when strategy is ps: remove pserver or set strategy: ps",
            )
        size = self.batch_policy.global_batch_size
        if size is not None and size < self.max_replicas:
            raise field_problem(
                "batchPolicy.globalBatchSize",
                "{size} is below {at}maxReplicas ({max}), so some workers would get no "
                "samples: raise {at}batchPolicy.globalBatchSize or lower {at}maxReplicas",
                size=size,
                max=self.max_replicas,
            )
        return self

    @property
    def coordinator_image(self) -> str:
        """The coordinator's image: `coordinator.image`, else the worker's image."""
        return self.coordinator.effective_image(self.template)

    @property
    def requested_replicas(self) -> int | None:
        """The size the job asks for, within its bounds (``replicas`` moved to the nearer
        bound where a scale left it outside), or None."""
        if self.replicas is None:
            return None
        return max(self.min_replicas, min(self.replicas, self.max_replicas))

    @property
    def elastic(self) -> bool:
        """Whether the planner may choose among several sizes for this job."""
        return self.max_replicas > self.min_replicas
