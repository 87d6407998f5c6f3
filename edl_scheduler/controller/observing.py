"""Kubernetes objects -> the planner's Snapshot, as pure functions over the objects.

Input objects are the API's JSON (dicts, as kopf and the watch stream deliver them). What
must stay true:
- a node offers its ``status.allocatable``; every pod bound to it that is neither ours nor
  finished takes its requests from that (so GPUs used by other workloads are never handed
  out);
- our replica pods are recognised by their labels alone (``naming``), so a restarted
  controller sees exactly what the last one created;
- a replica pod that is terminating, or annotated draining, no longer counts toward its
  job's size, and the planner counts its capacity as free already (held by a reservation
  for the job it was taken for); it does still occupy its node, so the controller creates
  the pods that take its place only once it has really gone (``deciding.NodeStates.free``);
- a cordoned node (``spec.unschedulable``) or one whose Ready condition is not True gets no
  new replica; replicas on a node that no longer exists are left out, so the planner
  replaces them elsewhere;
- a TrainingJob that fails validation, names an unknown PriorityClass, is a
  parameter-server job without shared snapshot storage (``shaping.ps_snapshot_dir``), or
  names a checkpoint directory on unusable storage (``shaping.checkpoint_dir``), whose
  coordinator arguments the coordinator would refuse (``shaping.coordinator_args``), or
  whose pod template asks for what the admin did not allow (``vetting``), is left out
  of the snapshot and reported with the reason, never planned on; what its pods take is
  used by others, so nothing is placed on it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from edl_scheduler.api import TrainingJob, TrainingJobError, load_training_job
from edl_scheduler.api.quantity import Quantity, QuantityError
from edl_scheduler.controller.naming import (
    ANNOTATION_DRAINING,
    GPU_RESOURCE,
    LABEL_JOB,
    LABEL_ROLE,
)
from edl_scheduler.controller.shaping import (
    ShapingError,
    checkpoint_dir,
    coordinator_args,
    ps_snapshot_dir,
)
from edl_scheduler.controller.vetting import PodField, refused_field
from edl_scheduler.core import (
    Job,
    Node,
    Replica,
    Reservation,
    Resources,
    Role,
    Snapshot,
    Taint,
    TaintEffect,
)
from edl_scheduler.core.building import efficiency_from_status, job_from_training_job
from edl_scheduler.core.snapshot import Efficiency

Obj = Mapping[str, Any]
T = TypeVar("T")
_FINISHED = frozenset({"Succeeded", "Failed"})
LOG = logging.getLogger(__name__)


def _quantity(raw: object, field_name: str, *, milli: bool) -> int:
    try:
        q = Quantity.parse(raw, field_name)
    except QuantityError:
        return 0
    return q.milli if milli else q.units


def resources_of(values: Mapping[str, object] | None) -> Resources:
    """A ``requests`` or ``allocatable`` map as exact integers (missing keys are zero)."""
    values = values or {}
    return Resources(
        gpu=_quantity(values.get(GPU_RESOURCE, 0), GPU_RESOURCE, milli=False),
        cpu_milli=_quantity(values.get("cpu", 0), "cpu", milli=True),
        memory_bytes=_quantity(values.get("memory", 0), "memory", milli=False),
    )


def pod_requests(pod: Obj) -> Resources:
    """What a pod takes from its node: the sum over its containers, or the largest init
    container if that is more (Kubernetes' effective request), plus its overhead."""
    spec = pod.get("spec", {})

    def request(container: Obj) -> Resources:
        return resources_of(container.get("resources", {}).get("requests"))

    total = Resources()
    for c in spec.get("containers", ()):
        total = total + request(c)
    for c in spec.get("initContainers", ()):
        r = request(c)
        total = Resources(
            max(total.gpu, r.gpu),
            max(total.cpu_milli, r.cpu_milli),
            max(total.memory_bytes, r.memory_bytes),
        )
    return total + resources_of(spec.get("overhead"))


def is_ours(pod: Obj) -> bool:
    return LABEL_JOB in pod.get("metadata", {}).get("labels", {})


def _taints(node: Obj) -> tuple[Taint, ...]:
    out = []
    for t in node.get("spec", {}).get("taints", ()) or ():
        try:
            effect = TaintEffect(t.get("effect", ""))
        except ValueError:
            continue
        out.append(Taint(t.get("key", ""), effect, t.get("value", "") or ""))
    return tuple(out)


def _ready(node: Obj) -> bool:
    for cond in node.get("status", {}).get("conditions", ()) or ():
        if cond.get("type") == "Ready":
            return bool(cond.get("status") == "True")
    return False


def node_view(node: Obj, used_by_others: Resources) -> Node:
    meta, spec = node.get("metadata", {}), node.get("spec", {})
    return Node(
        name=meta["name"],
        allocatable=resources_of(node.get("status", {}).get("allocatable")),
        used_by_others=used_by_others,
        labels=tuple(sorted((meta.get("labels") or {}).items())),
        taints=_taints(node),
        schedulable=not spec.get("unschedulable", False) and _ready(node),
    )


def replica_of(pod: Obj) -> tuple[str, Replica] | None:
    """(job key, replica) for one of our running or pending replica pods, else None."""
    meta = pod.get("metadata", {})
    labels = meta.get("labels", {})
    try:
        role = Role(labels.get(LABEL_ROLE, ""))
    except ValueError:
        return None  # the coordinator, or not ours
    node = pod.get("spec", {}).get("nodeName")
    if not node or pod.get("status", {}).get("phase") in _FINISHED:
        return None
    draining = bool(meta.get("deletionTimestamp")) or (
        (meta.get("annotations") or {}).get(ANNOTATION_DRAINING) == "true"
    )
    key = f"{meta.get('namespace', 'default')}/{labels[LABEL_JOB]}"
    return key, Replica(meta["name"], role, node, draining)


@dataclass(frozen=True, slots=True)
class Observation:
    """What one look at the cluster found: the snapshot, the jobs left out and why, and
    the TrainingJob objects parsed (for the actuator and the status writer)."""

    snapshot: Snapshot
    rejected: Mapping[str, str] = field(default_factory=dict)
    jobs: Mapping[str, TrainingJob] = field(default_factory=dict)


def efficiency_of(tj: TrainingJob) -> Efficiency | None:
    """The job's statistical efficiency from the gradient statistics in its status (the
    runtime's last report), or None: none reported, or values the planner cannot use, which
    are dropped with a warning naming the field (the job is planned on raw throughput)."""
    efficiency, left_out = efficiency_from_status(tj.status)
    if left_out is not None:
        LOG.warning("%s: %s", tj.metadata.name, left_out)
    return efficiency


def resolve_priority(tj: TrainingJob, priority_classes: Mapping[str, int]) -> int:
    """spec.priority, else the value of spec.priorityClassName, else 0."""
    if tj.spec.priority is not None:
        return tj.spec.priority
    name = tj.spec.priority_class_name
    if name is None:
        return 0
    if name not in priority_classes:
        raise KeyError(name)
    return priority_classes[name]


class Memo:
    """What parsing an object gave, by the object's identity and version, so that a cycle
    re-reads only the objects that changed since the last one. A hit needs the same uid,
    resourceVersion and status object (a status the controller just wrote is laid over an
    object of the same version); bounded, cleared when full."""

    def __init__(self, limit: int = 200_000) -> None:
        self.limit = limit
        self._values: dict[tuple[str, str, str, int], object] = {}

    def get(self, kind: str, obj: Obj, compute: Callable[[Obj], T]) -> T:
        meta = obj.get("metadata", {})
        version = meta.get("resourceVersion")
        if not version:
            return compute(obj)
        key = (kind, str(meta.get("uid") or meta.get("name")), str(version), id(obj.get("status")))
        found = self._values.get(key, _MISSING)
        if found is _MISSING:
            if len(self._values) >= self.limit:
                self._values.clear()
            found = self._values[key] = compute(obj)
        return found  # type: ignore[return-value]


_MISSING = object()


def observe(
    nodes: Iterable[Obj],
    pods: Iterable[Obj],
    training_jobs: Iterable[Obj],
    priority_classes: Mapping[str, int],
    reservations: tuple[Reservation, ...] = (),
    memo: Memo | None = None,
    allowed: frozenset[PodField] = frozenset(),
) -> Observation:
    """Build the planner's snapshot from the cluster's objects. With ``memo``, objects that
    did not change since an earlier call are not parsed again."""

    def cached(kind: str, obj: Obj, compute: Callable[[Obj], T]) -> T:
        return memo.get(kind, obj, compute) if memo is not None else compute(obj)

    others: dict[str, Resources] = {}

    def used_by_others(pod: Obj) -> None:
        """What ``pod`` requests counts as taken on its node, as other workloads' pods do."""
        node = str(pod["spec"]["nodeName"])
        others[node] = others.get(node, Resources()) + cached("requests", pod, pod_requests)

    replicas: dict[str, list[tuple[str, Replica]]] = {}
    replica_pods: dict[str, list[Obj]] = {}
    for pod in pods:
        node = pod.get("spec", {}).get("nodeName")
        if not node or pod.get("status", {}).get("phase") in _FINISHED:
            continue
        if is_ours(pod):
            found = cached("replica", pod, replica_of)
            if found is not None:
                created = str(pod["metadata"].get("creationTimestamp", ""))
                replicas.setdefault(found[0], []).append((created, found[1]))
                replica_pods.setdefault(found[0], []).append(pod)
                continue
        used_by_others(pod)
    nodes = sorted(nodes, key=lambda n: str(n["metadata"]["name"]))
    known = {str(n["metadata"]["name"]) for n in nodes}
    jobs: list[Job] = []
    parsed: dict[str, TrainingJob] = {}
    rejected: dict[str, str] = {}
    for obj in training_jobs:
        meta = obj.get("metadata", {})
        key = f"{meta.get('namespace', 'default')}/{meta.get('name', '?')}"
        try:
            tj = cached("job", obj, lambda o: load_training_job(dict(o)))
            priority = resolve_priority(tj, priority_classes)
            ps_snapshot_dir(tj)
            checkpoint_dir(tj)
            coordinator_args(tj)
            refused = refused_field(
                obj.get("spec", {}).get("template", {}).get("spec", {}), allowed
            )
            if refused is not None:
                raise ShapingError(refused)
        except (TrainingJobError, ShapingError) as err:
            rejected[key] = str(err).replace("\n", " ")
            continue
        except KeyError as err:
            rejected[key] = (
                f"spec.priorityClassName: PriorityClass {err.args[0]!r} does not exist: "
                "create it or name an existing one"
            )
            continue
        if tj.status.phase.final:
            continue
        # Oldest first: the planner drains the newest replicas first and keeps rank 0.
        ordered = sorted(replicas.get(key, ()), key=lambda cr: (cr[0], cr[1].name))
        mine = tuple(r for _, r in ordered if r.node in known)
        last = tj.status.last_resize.time.timestamp() if tj.status.last_resize else None
        job = replace(job_from_training_job(tj, priority, mine, last), resizes=tj.status.resizes)
        if job.pserver is None:
            # Parameter servers of a spec that has none now: the planner sets the job aside
            # and cannot know what they take; their pods say it.
            servers = {r.name for r in mine if r.role is Role.PSERVER}
            for pod in replica_pods.get(key, ()):
                if pod["metadata"]["name"] in servers:
                    used_by_others(pod)
        efficiency = efficiency_of(tj)
        jobs.append(job if efficiency is None else replace(job, efficiency=efficiency))
        parsed[key] = tj
    # A rejected job is not planned, but its pods still run: what they take is used.
    for key in rejected:
        for pod in replica_pods.get(key, ()):
            used_by_others(pod)
    node_views = tuple(
        replace(
            cached("node", n, lambda o: node_view(o, Resources())),
            used_by_others=others.get(n["metadata"]["name"], Resources()),
        )
        for n in nodes
    )
    return Observation(Snapshot(node_views, tuple(jobs), reservations), rejected, parsed)
