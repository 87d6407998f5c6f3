"""What to do about each job this cycle: the planner's Plan and the job's pods -> intents.

Pure, like the planner: it reads what observing saw, the plan, the coordinators' progress and
the clock, and returns intents (create this pod, drain that worker, write this status, post
this Event) for ``actuating`` to carry out. Nothing here talks to Kubernetes, so every rule
below is tested without an API server.

The rules, per job, in order:
1. A job whose spec is invalid (or names an unknown PriorityClass) stays Pending with the
   condition ``Valid=False`` and a Warning Event saying why; it gets no pods.
2. A job in a final phase keeps no pods.
3. Its coordinator reports the last epoch committed: Succeeded, pods removed.
4. Finished replica pods are removed. A failed one that was not leaving counts against
   ``failurePolicy.maxRestarts`` unless the kubelet refused it at admission (then the cluster
   changed under the plan: plan again, the job is not charged). Past the budget: Failed.
5. A replica on a deleted node is deleted, one on a cordoned (or not Ready) node drains;
   the planner places their replacements elsewhere. A draining replica still there at its
   drain deadline is deleted.
6. The plan's moves: new replicas on the planned nodes (the coordinator, its Service and the
   token Secret first, if missing), named victims drained through the coordinator (a victim
   that never started is deleted at once), the new target sent to the coordinator.
7. The status: phase along ``JobPhase``'s diagram, size, allocation, conditions, reason,
   progress and throughput; written only when it changed.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from edl_scheduler.api import JobPhase, TrainingJob
from edl_scheduler.controller.config import ControllerConfig
from edl_scheduler.controller.coordinating import Progress
from edl_scheduler.controller.naming import (
    ANNOTATION_COORDINATOR_PORT,
    ANNOTATION_DRAIN_SINCE,
    ANNOTATION_DRAINING,
    LABEL_JOB,
    LABEL_ROLE,
    ROLE_COORDINATOR,
)
from edl_scheduler.controller.shaping import (
    Manifest,
    ShapingError,
    coordinator_address,
    coordinator_pod,
    coordinator_service,
    free_port,
    replica_pod,
    token_secret,
)
from edl_scheduler.core import Action, JobDecision, Plan, Resources, Role

Obj = Mapping[str, Any]
log = logging.getLogger("edl.controller.deciding")

#: Pod ``status.reason`` values with which a kubelet refuses a pod at admission.
ADMISSION_REASONS = frozenset(
    {
        "OutOfcpu",
        "OutOfmemory",
        "OutOfpods",
        "NodeAffinity",
        "NodeSelectorMismatching",
        "UnexpectedAdmissionError",
        "Unschedulable",
        "Taint",
        "OutOfnvidia.com/gpu",
    }
)


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
    REPLICA_FAILED = "ReplicaFailed"
    REFUSED_AT_ADMISSION = "RefusedAtAdmission"


@dataclass(frozen=True, slots=True)
class CreatePod:
    manifest: Manifest


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
    """The Secret and the Service of a job (created once; 'already exists' is success)."""

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


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _ts(raw: object) -> float | None:
    if not raw:
        return None
    return datetime.fromisoformat(str(raw).replace("Z", "+00:00")).timestamp()


def _meta(obj: Obj) -> Obj:
    meta: Obj = obj.get("metadata", {})
    return meta


def _phase(pod: Obj) -> str:
    return str(pod.get("status", {}).get("phase", "Pending"))


def _terminating(pod: Obj) -> bool:
    return bool(_meta(pod).get("deletionTimestamp"))


def _draining_since(pod: Obj) -> float | None:
    ann = _meta(pod).get("annotations") or {}
    if ann.get(ANNOTATION_DRAINING) != "true":
        return None
    try:
        return float(ann.get(ANNOTATION_DRAIN_SINCE, "0"))
    except ValueError:
        return 0.0


def refused_at_admission(pod: Obj) -> bool:
    reason = str(pod.get("status", {}).get("reason", ""))
    return reason in ADMISSION_REASONS or reason.startswith("OutOf")


def step_toward(current: JobPhase, desired: JobPhase) -> JobPhase:
    """``desired`` if the diagram allows it from ``current``, else the phase one step on the
    way (a job goes Suspended -> Pending -> Running over two cycles)."""
    if current.can_become(desired):
        return desired
    for middle in (JobPhase.RUNNING, JobPhase.PENDING):
        if current.can_become(middle) and middle.can_become(desired):
            return middle
    return current


def coordinator_port_of(pod: Obj | None) -> int | None:
    if pod is None:
        return None
    raw = (_meta(pod).get("annotations") or {}).get(ANNOTATION_COORDINATOR_PORT)
    try:
        return int(raw) if raw else None
    except ValueError:
        return None


def group_pods(pods: Iterable[Obj]) -> dict[str, tuple[list[Obj], Obj | None]]:
    """Our pods by job key: (replicas, the live coordinator or the newest one)."""
    out: dict[str, tuple[list[Obj], Obj | None]] = {}
    for pod in pods:
        meta = _meta(pod)
        labels = meta.get("labels") or {}
        job = labels.get(LABEL_JOB)
        if job is None:
            continue
        key = f"{meta.get('namespace', 'default')}/{job}"
        replicas, coordinator = out.get(key, ([], None))
        if labels.get(LABEL_ROLE) == ROLE_COORDINATOR:
            if coordinator is None or (_terminating(coordinator) and not _terminating(pod)):
                coordinator = pod
        else:
            replicas.append(pod)
        out[key] = (replicas, coordinator)
    return out


def _event(tj: TrainingJob, type_: EventType, reason: EventReason, message: str) -> Emit:
    return Emit(
        tj.metadata.namespace, tj.metadata.name, tj.metadata.uid or "", type_, reason, message
    )


@dataclass(slots=True)
class _JobCycle:
    """The working state of one job's decisions in one cycle."""

    view: JobView
    tj: TrainingJob
    now: float
    out: Decisions
    status: dict[str, Any]
    restarts: int
    removed: set[str] = field(default_factory=set)
    created: dict[str, str] = field(default_factory=dict)
    #: The plan's new replicas wait for capacity still held by leaving ones.
    deferred: bool = False

    def delete(self, pod: Obj) -> None:
        name = str(_meta(pod)["name"])
        if name not in self.removed:
            self.removed.add(name)
            self.out.intents.append(DeletePod(self.tj.metadata.namespace, name))

    def emit(self, type_: EventType, reason: EventReason, message: str) -> None:
        self.out.intents.append(_event(self.tj, type_, reason, message))


def _finish(cycle: _JobCycle, phase: JobPhase, reason: EventReason, message: str) -> None:
    view, tj = cycle.view, cycle.tj
    for pod in view.replicas:
        cycle.delete(pod)
    if view.coordinator is not None:
        cycle.delete(view.coordinator)
    current = JobPhase(cycle.status.get("phase", JobPhase.PENDING))
    cycle.status["phase"] = step_toward(current, phase).value
    if JobPhase(cycle.status["phase"]).final:
        cycle.status["completionTime"] = _iso(cycle.now)
        cycle.status["replicas"] = 0
        cycle.status["allocation"] = {}
        submitted = _ts(cycle.status.get("submitTime")) or _ts(
            _meta(view.body).get("creationTimestamp")
        )
        if submitted is not None:
            cycle.out.counts.completed_s.append(max(0.0, cycle.now - submitted))
        cycle.emit(
            EventType.NORMAL if phase is JobPhase.SUCCEEDED else EventType.WARNING,
            reason,
            message,
        )
    cycle.status["message"] = message
    _ = tj


def decide(
    views: Mapping[str, JobView],
    plan: Plan | None,
    config: ControllerConfig,
    now: float,
    namer: Callable[[str, str], str],
    attained_due: Callable[[str], float] = lambda _key: 0.0,
    nodes: NodeStates | None = None,
) -> Decisions:
    """The intents of one cycle. ``namer(job, role)`` names a new replica pod;
    ``attained_due(key)`` is the time since the job's attained GPU-time was last written, when
    it is due to be written again (else 0)."""
    out = Decisions()
    used_ports = [
        p for v in views.values() if (p := coordinator_port_of(v.coordinator)) is not None
    ]
    decisions = {d.job: d for d in plan.decisions} if plan is not None else {}
    for key, view in sorted(views.items()):
        if view.tj is None:
            _invalid(view, now, out)
            continue
        decision = decisions.get(key)
        _decide_job(
            view,
            view.tj,
            decision,
            config,
            now,
            namer,
            used_ports,
            out,
            attained_due,
            nodes or NodeStates(),
        )
    return out


def _invalid(view: JobView, now: float, out: Decisions) -> None:
    meta = _meta(view.body)
    status = dict(view.body.get("status") or {})
    reason = view.rejected or "invalid"
    conditions = [c for c in status.get("conditions", []) if c.get("type") != "Valid"]
    old = next((c for c in status.get("conditions", []) if c.get("type") == "Valid"), None)
    if old is not None and old.get("message") == reason and status.get("message") == reason:
        return
    conditions.append(
        {
            "type": "Valid",
            "status": "False",
            "reason": "InvalidSpec",
            "message": reason,
            "lastTransitionTime": _iso(now),
        }
    )
    phase = status.get("phase", "Pending")
    new = {"phase": phase, "message": reason, "conditions": conditions}
    namespace, name = str(meta.get("namespace", "default")), str(meta.get("name"))
    out.intents.append(PatchStatus(namespace, name, new))
    out.intents.append(
        Emit(
            namespace,
            name,
            str(meta.get("uid", "")),
            EventType.WARNING,
            EventReason.INVALID,
            reason,
        )
    )


def _decide_job(
    view: JobView,
    tj: TrainingJob,
    decision: JobDecision | None,
    config: ControllerConfig,
    now: float,
    namer: Callable[[str, str], str],
    used_ports: list[int],
    out: Decisions,
    attained_due: Callable[[str], float],
    nodes: NodeStates,
) -> None:
    old_status: dict[str, Any] = dict(view.body.get("status") or {})
    status = dict(old_status)
    cycle = _JobCycle(view, tj, now, out, status, int(old_status.get("restarts", 0)))
    phase = JobPhase(old_status.get("phase", JobPhase.PENDING.value))
    if phase.final:  # 2
        for pod in view.replicas:
            if not _terminating(pod):
                cycle.delete(pod)
        if view.coordinator is not None and not _terminating(view.coordinator):
            cycle.delete(view.coordinator)
        return
    status.setdefault("submitTime", _iso(_ts(_meta(view.body).get("creationTimestamp")) or now))
    if view.progress is not None and view.progress.finished:  # 3
        _finish(
            cycle,
            JobPhase.SUCCEEDED,
            EventReason.SUCCEEDED,
            f"the coordinator committed the last epoch ({view.progress.epochs})",
        )
        _write_status(cycle, old_status)
        return
    _replace_finished(cycle)  # 4
    if cycle.restarts > tj.spec.failure_policy.max_restarts:
        status["restarts"] = cycle.restarts
        _finish(
            cycle,
            JobPhase.FAILED,
            EventReason.FAILED,
            f"{cycle.restarts} replica failures exceed failurePolicy.maxRestarts "
            f"({tj.spec.failure_policy.max_restarts})",
        )
        _write_status(cycle, old_status)
        return
    _leave_lost_nodes(cycle, nodes)  # 5
    for pod in view.replicas:
        since = _draining_since(pod)
        if (
            since is not None
            and not _terminating(pod)
            and now >= since + tj.spec.timeouts.drain_seconds
        ):
            cycle.delete(pod)
    if tj.spec.suspend:  # 6
        _suspend(cycle)
    elif decision is not None:
        _act(cycle, decision, config, namer, used_ports, nodes)
    _status(cycle, decision, attained_due)  # 7
    _write_status(cycle, old_status)


@dataclass(frozen=True, slots=True)
class NodeStates:
    """Which nodes exist and which take no new replicas (cordoned or not Ready); None:
    unknown, nothing is moved."""

    known: frozenset[str] | None = None
    unschedulable: frozenset[str] = frozenset()
    #: What each node has free now, counting every replica still on it (draining and
    #: terminating ones too). The planner counts a draining victim's capacity as already
    #: free (held by a reservation for the job it was taken for); new pods wait until it
    #: really is, so a node is never over-committed. None: not checked.
    free: dict[str, Resources] | None = None


def _leave_lost_nodes(cycle: _JobCycle, nodes: NodeStates) -> None:
    """Replicas on a deleted node are deleted; those on a cordoned or failing node leave
    gracefully. Either way the planner no longer counts them and places replacements on
    other nodes."""
    for pod in cycle.view.replicas:
        name = str(_meta(pod)["name"])
        node = str(pod.get("spec", {}).get("nodeName", ""))
        if name in cycle.removed or _terminating(pod) or _phase(pod) in ("Succeeded", "Failed"):
            continue
        if nodes.known is not None and node not in nodes.known:
            cycle.delete(pod)
        elif node in nodes.unschedulable and _draining_since(pod) is None:
            if _phase(pod) != "Running":
                cycle.delete(pod)
                continue
            ns = cycle.tj.metadata.namespace
            cycle.out.intents.append(MarkDraining(ns, name, cycle.now))
            cycle.out.intents.append(Drain(cycle.tj.key, name))
            cycle.emit(
                EventType.NORMAL,
                EventReason.SCALED_DOWN,
                f"{name} leaves node {node}, which takes no new work; it is replaced elsewhere",
            )


def _suspend(cycle: _JobCycle) -> None:
    """``spec.suspend``: every replica leaves (running ones drain, the others are deleted);
    the coordinator and its saved state stay, so the job resumes where it stopped."""
    victims: list[str] = []
    for pod in cycle.view.replicas:
        name = str(_meta(pod)["name"])
        if name in cycle.removed or _terminating(pod) or _draining_since(pod) is not None:
            continue
        if _phase(pod) in ("Succeeded", "Failed"):
            continue
        victims.append(name)
        if _phase(pod) == "Running":
            cycle.out.intents.append(MarkDraining(cycle.tj.metadata.namespace, name, cycle.now))
            cycle.out.intents.append(Drain(cycle.tj.key, name))
        else:
            cycle.delete(pod)
    if victims:
        cycle.emit(EventType.NORMAL, EventReason.SUSPENDED,
                   f"suspended by its spec; victims: {', '.join(victims)}")  # fmt: skip
        cycle.status["lastResize"] = {
            "time": _iso(cycle.now),
            "from": len(victims),
            "to": 0,
            "reason": "UserSuspended",
        }


def _replace_finished(cycle: _JobCycle) -> None:
    for pod in cycle.view.replicas:
        if _terminating(pod) or _phase(pod) not in ("Succeeded", "Failed"):
            continue
        name = str(_meta(pod)["name"])
        leaving = _draining_since(pod) is not None
        if _phase(pod) == "Succeeded" and not leaving:
            # A worker exits 0 unasked when its coordinator has committed the last epoch:
            # replacing it would only start a worker with nothing to do.
            cycle.deferred = True
        if _phase(pod) == "Failed" and not leaving:
            if refused_at_admission(pod):
                cycle.emit(
                    EventType.WARNING,
                    EventReason.REFUSED_AT_ADMISSION,
                    f"{name} was refused by node {pod.get('spec', {}).get('nodeName')} "
                    f"({pod.get('status', {}).get('reason')}): planning again",
                )
            else:
                cycle.restarts += 1
                cycle.emit(
                    EventType.WARNING,
                    EventReason.REPLICA_FAILED,
                    f"{name} failed ({cycle.restarts} of "
                    f"{cycle.tj.spec.failure_policy.max_restarts} restarts used)",
                )
        cycle.delete(pod)
    coordinator = cycle.view.coordinator
    if (
        coordinator is not None
        and not _terminating(coordinator)
        and _phase(coordinator) in ("Succeeded", "Failed")
    ):
        cycle.delete(coordinator)  # replaced below, from its saved state


def _coordinator_alive(view: JobView, removed: set[str]) -> bool:
    pod = view.coordinator
    return (
        pod is not None
        and not _terminating(pod)
        and _phase(pod) not in ("Succeeded", "Failed")
        and str(_meta(pod)["name"]) not in removed
    )


def _act(
    cycle: _JobCycle,
    decision: JobDecision,
    config: ControllerConfig,
    namer: Callable[[str, str], str],
    used_ports: list[int],
    nodes: NodeStates,
) -> None:
    view, tj = cycle.view, cycle.tj
    adds = [(Role.WORKER, n) for n in decision.workers.add_nodes]
    removes = list(decision.workers.remove)
    if decision.pservers is not None:
        adds += [(Role.PSERVER, n) for n in decision.pservers.add_nodes]
        removes += list(decision.pservers.remove)
    if cycle.deferred or (adds and not _reserve(tj, adds, nodes)):
        cycle.deferred = True
        log.info(
            "%s: %d new replicas wait for room on %s",
            tj.key,
            len(adds),
            ", ".join(sorted({n for _, n in adds})),
        )
        adds = []
    port = coordinator_port_of(view.coordinator)
    live_replicas = [
        p
        for p in view.replicas
        if not _terminating(p) and str(_meta(p)["name"]) not in cycle.removed
    ]
    needs_coordinator = bool(adds) or bool(live_replicas)
    if needs_coordinator and not _coordinator_alive(view, cycle.removed):
        if port is None:
            port = free_port(used_ports, config)
            used_ports.append(port)
        node = (adds[0][1] if adds else None) or str(live_replicas[0]["spec"]["nodeName"])
        try:
            token = config.token_for(tj.metadata.uid or "")
            cycle.out.intents.append(
                EnsureObjects(tj.key, (token_secret(tj, token), coordinator_service(tj, port)))
            )
            coordinator_pod(tj, node, port, config, None)  # fails early on a bad job
            cycle.out.intents.append(CreateCoordinator(tj, node, port))
        except ShapingError as error:
            cycle.status["message"] = str(error)
            cycle.status.setdefault("conditions", [])
            return
    if port is None:
        return
    address = coordinator_address(tj, port, config)
    for role, node in adds:
        name = namer(tj.metadata.name, role.value)
        cycle.created[name] = node
        cycle.out.intents.append(CreatePod(replica_pod(tj, name, node, role, address)))
    by_name = {str(_meta(p)["name"]): p for p in view.replicas}
    for name in removes:
        pod = by_name.get(name)
        if pod is None or name in cycle.removed:
            continue
        started = _phase(pod) == "Running"
        if not started:
            cycle.delete(pod)
            continue
        cycle.out.intents.append(MarkDraining(tj.metadata.namespace, name, cycle.now))
        cycle.out.intents.append(Drain(tj.key, name))
    if decision.workers.target != decision.workers.current:
        cycle.out.intents.append(SetTarget(tj.key, decision.workers.target))
    _decision_events(cycle, decision)


def _reserve(tj: TrainingJob, adds: list[tuple[Role, str]], nodes: NodeStates) -> bool:
    """Takes room for all of ``adds`` from ``nodes.free``, or nothing when one does not fit
    (a gang starts whole; a growth waits for its room)."""
    if nodes.free is None:
        return True
    free = dict(nodes.free)
    for role, node in adds:
        res = tj.spec.resources
        if role is Role.PSERVER and tj.spec.pserver is not None:
            res = tj.spec.pserver.resources
        need = Resources(res.gpu, res.cpu_milli, res.memory_bytes)
        have = free.get(node, Resources())
        if not need.fits_in(have):
            return False
        free[node] = have - need
    nodes.free.update(free)
    return True


def _decision_events(cycle: _JobCycle, decision: JobDecision) -> None:
    if cycle.deferred and decision.action in (Action.START, Action.GROW):
        return  # told when the pods are created
    w = decision.workers
    size = f"{w.current} -> {w.target} workers"
    victims = ", ".join(w.remove) or "none"
    counts = cycle.out.counts
    if decision.action is Action.START:
        cycle.emit(
            EventType.NORMAL,
            EventReason.ADMITTED,
            f"{size} on {', '.join(sorted(set(w.add_nodes)))}: {decision.message}",
        )
        submitted = _ts(cycle.status.get("submitTime"))
        if submitted is not None and not cycle.status.get("startTime"):
            counts.waited_s.append(max(0.0, cycle.now - submitted))
    elif decision.action is Action.GROW:
        cycle.emit(EventType.NORMAL, EventReason.SCALED_UP, f"{size}: {decision.message}")
    elif decision.action in (Action.SHRINK, Action.SUSPEND):
        if decision.for_job is not None:
            counts.preemptions += 1
            cycle.emit(
                EventType.NORMAL,
                EventReason.PREEMPTED,
                f"{size} for {decision.for_job}; victims: {victims}: {decision.message}",
            )
        if decision.action is Action.SUSPEND:
            cycle.emit(
                EventType.NORMAL,
                EventReason.SUSPENDED,
                f"{size}; victims: {victims}: {decision.message}",
            )
        else:
            cycle.emit(
                EventType.NORMAL,
                EventReason.SCALED_DOWN,
                f"{size}; victims: {victims}: {decision.message}",
            )
    if w.target != w.current:
        direction = "up" if w.target > w.current else "down"
        key = (direction, decision.reason.value)
        counts.resizes[key] = counts.resizes.get(key, 0) + 1


def _status(
    cycle: _JobCycle, decision: JobDecision | None, attained_due: Callable[[str], float]
) -> None:
    view, tj, status, now = cycle.view, cycle.tj, cycle.status, cycle.now
    allocation: dict[str, str] = {}
    draining = 0
    pservers = 0
    for pod in view.replicas:
        name = str(_meta(pod)["name"])
        if name in cycle.removed or _terminating(pod) or _phase(pod) in ("Succeeded", "Failed"):
            continue
        if _draining_since(pod) is not None:
            draining += 1
            continue
        if decision is not None and name in decision.workers.remove:
            draining += 1
            continue
        if (pod.get("metadata", {}).get("labels") or {}).get(LABEL_ROLE) == Role.PSERVER.value:
            pservers += 1
            if decision is not None and decision.pservers and name in decision.pservers.remove:
                continue
        allocation[name] = str(pod.get("spec", {}).get("nodeName"))
    allocation.update(cycle.created)
    workers = sum(
        1 for n in allocation if not n.startswith(f"{tj.metadata.name}-{Role.PSERVER.value}-")
    )
    old_phase = JobPhase(status.get("phase", JobPhase.PENDING.value))
    changed = decision is not None and decision.changed
    if (tj.spec.suspend and workers == 0) or (
        decision is not None and decision.action is Action.SUSPEND
    ):
        desired = JobPhase.SUSPENDED
    elif workers >= tj.spec.min_replicas:
        members = len(view.progress.members) if view.progress is not None else workers
        resizing = (
            changed
            or draining > 0
            or (old_phase.active and members != workers and view.progress is not None)
        )
        desired = JobPhase.RESIZING if resizing and old_phase.active else JobPhase.RUNNING
    else:
        desired = JobPhase.PENDING
    phase = step_toward(old_phase, desired)
    if old_phase is JobPhase.SUSPENDED and phase is not JobPhase.SUSPENDED:
        cycle.emit(EventType.NORMAL, EventReason.RESUMED, "spec.suspend cleared: resuming")
    status["phase"] = phase.value
    status["replicas"] = workers
    status["pserverReplicas"] = pservers
    status["allocation"] = allocation
    status["selector"] = f"edl.dev/job={tj.metadata.name},edl.dev/role=worker"
    if tj.metadata.generation is not None:
        status["observedGeneration"] = tj.metadata.generation
    if tj.spec.suspend:
        status["message"] = "suspended by its spec: set spec.suspend to false to resume"
    elif decision is not None:
        status["message"] = decision.message
        if cycle.deferred:
            status["message"] = f"{decision.message}; waiting for leaving replicas to go"
    if phase.active and not status.get("startTime"):
        status["startTime"] = _iso(now)
    if (
        decision is not None
        and decision.workers.target != decision.workers.current
        and not cycle.deferred
    ):
        status["lastResize"] = {
            "time": _iso(now),
            "from": decision.workers.current,
            "to": decision.workers.target,
            "reason": decision.reason.value,
        }
    status["restarts"] = cycle.restarts
    if view.priority is not None:
        status["priority"] = view.priority
    progress = view.progress
    if progress is not None:
        status["progress"] = progress.as_status()
        status["generation"] = progress.generation
        status["readyReplicas"] = len(progress.members)
        status["throughput"] = [
            {
                "nodes": max(1, t.nodes),
                "workers": max(1, t.workers),
                "samplesPerSecond": t.samples_per_second,
                **({"stepSeconds": t.step_seconds} if t.step_seconds > 0 else {}),
            }
            for t in progress.throughput
            if t.workers > 0
        ]
    elapsed = attained_due(tj.key) if phase.active else 0.0
    if elapsed > 0:
        last = float(status.get("attainedGpuSeconds", 0.0))
        gpus = workers * tj.spec.resources.gpu
        status["attainedGpuSeconds"] = round(last + gpus * elapsed, 3)
        cycle.out.attained_written.add(tj.key)
    conditions = [
        c for c in status.get("conditions", []) if c.get("type") not in ("Valid", "Admitted")
    ]
    conditions.append(
        {
            "type": "Valid",
            "status": "True",
            "reason": "SpecAccepted",
            "message": "",
            "lastTransitionTime": _condition_time(status, "Valid", "True", now),
        }
    )
    admitted = "True" if status.get("startTime") else "False"
    conditions.append(
        {
            "type": "Admitted",
            "status": admitted,
            "reason": "Started" if admitted == "True" else "Waiting",
            "message": "" if admitted == "True" else str(status.get("message") or ""),
            "lastTransitionTime": _condition_time(status, "Admitted", admitted, now),
        }
    )
    for c in conditions:
        if not c.get("message"):
            c.pop("message", None)  # an empty string reads back as null on Kubernetes 1.20
    status["conditions"] = conditions


def _condition_time(status: Mapping[str, Any], type_: str, value: str, now: float) -> str:
    for c in status.get("conditions", []):
        if c.get("type") == type_ and c.get("status") == value:
            return str(c.get("lastTransitionTime", _iso(now)))
    return _iso(now)


def _write_status(cycle: _JobCycle, old: Mapping[str, Any]) -> None:
    if cycle.status != old:
        cycle.out.intents.append(
            PatchStatus(cycle.tj.metadata.namespace, cycle.tj.metadata.name, cycle.status)
        )
