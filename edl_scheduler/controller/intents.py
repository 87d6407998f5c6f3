"""The vocabulary of a cycle's decisions: intents (what ``actuating`` carries out), Event
types and reasons, what the controller sees of a job (``JobView``), and one job's working
state while its rules run (``JobCycle``).

Intents are frozen values: ``deciding`` produces them, ``actuating`` is the only place that
turns them into API or coordinator calls.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from edl_scheduler.api import TrainingJob
from edl_scheduler.controller.coordinating import Progress
from edl_scheduler.controller.podstate import meta_of
from edl_scheduler.controller.shaping import Manifest

Obj = Mapping[str, Any]


class EventType(StrEnum):
    NORMAL = "Normal"
    WARNING = "Warning"


class EventReason(StrEnum):
    """The Events a job's history is told in."""

    ADMITTED = "Admitted"
    SCALED_UP = "ScaledUp"
    SCALED_DOWN = "ScaledDown"
    PREEMPTED = "Preempted"
    SUSPENDED = "Suspended"
    RESUMED = "Resumed"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    INVALID = "Invalid"
    #: The planner could not accept the job's state this cycle (``Reason.SET_ASIDE``).
    SET_ASIDE = "SetAside"
    REPLICA_FAILED = "ReplicaFailed"
    COORDINATOR_FAILED = "CoordinatorFailed"
    REFUSED_AT_ADMISSION = "RefusedAtAdmission"


@dataclass(frozen=True, slots=True)
class CreatePod:
    """A replica pod. ``job``: the job's key, when the same cycle ensures the job's Service
    (``EnsureObjects``): the pod is then created only once it exists, so that no replica
    ever runs without it. ``credential``: the Secret with the pod's own credential, created
    before the pod; like the pod, owned by the job (the controller deletes no Secret)."""

    manifest: Manifest
    job: str = ""
    credential: Manifest | None = None


@dataclass(frozen=True, slots=True)
class CreateCoordinator:
    """The job's coordinator pod; the actuator adds the state its ConfigMap keeps."""

    job: TrainingJob
    node: str
    port: int


@dataclass(frozen=True, slots=True)
class DeletePod:
    namespace: str
    name: str


@dataclass(frozen=True, slots=True)
class DeleteOrphan:
    """A pod of ``job``, a TrainingJob the watch no longer lists: deleted once a live read
    confirms that the job is gone (the garbage collector would, later)."""

    namespace: str
    name: str
    job: str


@dataclass(frozen=True, slots=True)
class MarkDraining:
    namespace: str
    name: str
    since: float


@dataclass(frozen=True, slots=True)
class Drain:
    job: str
    worker_id: str


@dataclass(frozen=True, slots=True)
class SetTarget:
    job: str
    workers: int


@dataclass(frozen=True, slots=True)
class EnsureObjects:
    """The Secret, the Service and the NetworkPolicy of a job (created once; 'already
    exists' is success)."""

    job: str
    manifests: tuple[Manifest, ...]


@dataclass(frozen=True, slots=True)
class PatchStatus:
    namespace: str
    name: str
    status: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Emit:
    namespace: str
    name: str
    uid: str
    type: EventType
    reason: EventReason
    message: str


Intent = (
    CreatePod
    | CreateCoordinator
    | DeletePod
    | DeleteOrphan
    | MarkDraining
    | Drain
    | SetTarget
    | EnsureObjects
    | PatchStatus
    | Emit
)


@dataclass(frozen=True, slots=True)
class JobView:
    """One TrainingJob and everything of it the controller sees."""

    body: Obj
    tj: TrainingJob | None
    rejected: str | None = None
    replicas: tuple[Obj, ...] = ()
    coordinator: Obj | None = None
    progress: Progress | None = None
    #: The job's effective priority (spec.priority or its PriorityClass's value).
    priority: int | None = None
    #: Its coordinator pod is Running and has answered the controller: only then is it
    #: asked anything (drains, the target), and a replica failing before is not charged.
    coordinator_ready: bool = False
    #: That coordinator has not been told the job's size yet (it just answered for the
    #: first time): its workers may have been created with it, so the size did not change.
    target_due: bool = False
    #: The status laid over ``body`` is one this controller queued or wrote and has not yet
    #: seen through the watch (``expecting.Expectations``): a final phase in it may still be
    #: lost with the controller, so the job's coordinator stays until it is seen.
    status_unseen: bool = False


@dataclass(slots=True)
class Counts:
    """What the metrics count this cycle."""

    resizes: dict[tuple[str, str], int] = field(default_factory=dict)
    preemptions: int = 0
    waited_s: list[float] = field(default_factory=list)
    completed_s: list[float] = field(default_factory=list)


@dataclass(slots=True)
class Decisions:
    intents: list[Intent] = field(default_factory=list)
    counts: Counts = field(default_factory=Counts)
    #: Jobs whose status carries a new attained GPU-time (the loop remembers when).
    attained_written: set[str] = field(default_factory=set)


def job_event(tj: TrainingJob, type_: EventType, reason: EventReason, message: str) -> Emit:
    return Emit(
        tj.metadata.namespace, tj.metadata.name, tj.metadata.uid or "", type_, reason, message
    )


@dataclass(slots=True)
class JobCycle:
    """The working state of one job's decisions in one cycle."""

    view: JobView
    tj: TrainingJob
    now: float
    out: Decisions
    status: dict[str, Any]
    restarts: int
    removed: set[str] = field(default_factory=set)
    created: dict[str, str] = field(default_factory=dict)
    #: The plan's new replicas wait (for capacity still held by leaving ones, or for the
    #: job's coordinator to answer); ``waiting_for`` says which, in the status message.
    deferred: bool = False
    waiting_for: str = "leaving replicas to go"

    def delete(self, pod: Obj) -> None:
        name = str(meta_of(pod)["name"])
        if name not in self.removed:
            self.removed.add(name)
            self.out.intents.append(DeletePod(self.tj.metadata.namespace, name))

    def emit(self, type_: EventType, reason: EventReason, message: str) -> None:
        self.out.intents.append(job_event(self.tj, type_, reason, message))
