"""What a pod's JSON says about it: phase, terminating, draining, refused at admission, the
coordinator's port; and pods grouped by job.

Pure readers over the API's objects, shared by ``deciding`` and ``statusing``. Times in the
API are RFC 3339 strings; here they become epoch seconds and back (``iso_time``,
``timestamp_of``), at one-second resolution as Kubernetes keeps them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

from edl_scheduler.api import JobPhase
from edl_scheduler.controller.naming import (
    ANNOTATION_COORDINATOR_PORT,
    ANNOTATION_DRAIN_SINCE,
    ANNOTATION_DRAINING,
    LABEL_JOB,
    LABEL_ROLE,
    ROLE_COORDINATOR,
)

Obj = Mapping[str, Any]


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


def iso_time(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def timestamp_of(raw: object) -> float | None:
    if not raw:
        return None
    return datetime.fromisoformat(str(raw).replace("Z", "+00:00")).timestamp()


def meta_of(obj: Obj) -> Obj:
    meta: Obj = obj.get("metadata", {})
    return meta


def key_of(obj: Obj) -> str:
    """``namespace/name``: how a job is named everywhere in the controller."""
    meta = meta_of(obj)
    return f"{meta.get('namespace', 'default')}/{meta.get('name')}"


def phase_of(pod: Obj) -> str:
    return str(pod.get("status", {}).get("phase", "Pending"))


def terminating(pod: Obj) -> bool:
    return bool(meta_of(pod).get("deletionTimestamp"))


def draining_since(pod: Obj) -> float | None:
    ann = meta_of(pod).get("annotations") or {}
    if ann.get(ANNOTATION_DRAINING) != "true":
        return None
    try:
        return float(ann.get(ANNOTATION_DRAIN_SINCE, "0"))
    except ValueError:
        return 0.0


def left_for_good(pod: Obj, deleted: bool) -> bool:
    """A draining replica that has gone (its pod deleted) or whose process ended: the room it
    held is free now, and a job placed on that room may be waiting for exactly this."""
    if draining_since(pod) is None:
        return False
    return deleted or phase_of(pod) in ("Succeeded", "Failed")


def refused_at_admission(pod: Obj) -> bool:
    reason = str(pod.get("status", {}).get("reason", ""))
    return reason in ADMISSION_REASONS or reason.startswith("OutOf")


def exit_of(pod: Obj) -> str:
    """How a pod's container ended, as an Event says it: "exit code 1: Error", or the pod's
    own reason (Evicted, ...) where no container says."""
    for container in pod.get("status", {}).get("containerStatuses") or ():
        ended = (container.get("state") or {}).get("terminated")
        if ended:
            reason = f": {ended['reason']}" if ended.get("reason") else ""
            return f"exit code {ended.get('exitCode')}{reason}"
    return str(pod.get("status", {}).get("reason") or "no exit code reported")


def step_toward(current: JobPhase, desired: JobPhase) -> JobPhase:
    """``desired`` if the diagram allows it from ``current``, else the phase one step on the
    way (a job goes Suspended -> Pending -> Running over two cycles)."""
    return current.step_toward(desired)


def coordinator_port_of(pod: Obj | None) -> int | None:
    if pod is None:
        return None
    raw = (meta_of(pod).get("annotations") or {}).get(ANNOTATION_COORDINATOR_PORT)
    try:
        return int(raw) if raw else None
    except ValueError:
        return None


def group_pods(pods: Iterable[Obj]) -> dict[str, tuple[list[Obj], Obj | None]]:
    """Our pods by job key: (replicas, the live coordinator or the newest one)."""
    out: dict[str, tuple[list[Obj], Obj | None]] = {}
    for pod in pods:
        meta = meta_of(pod)
        labels = meta.get("labels") or {}
        job = labels.get(LABEL_JOB)
        if job is None:
            continue
        key = f"{meta.get('namespace', 'default')}/{job}"
        replicas, coordinator = out.get(key, ([], None))
        if labels.get(LABEL_ROLE) == ROLE_COORDINATOR:
            if coordinator is None or (terminating(coordinator) and not terminating(pod)):
                coordinator = pod
        else:
            replicas.append(pod)
        out[key] = (replicas, coordinator)
    return out
