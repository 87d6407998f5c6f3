"""A job's status and the Events of its plan decision, from one cycle's working state.

Pure. The status says what the job has now (replicas, allocation, phase along ``JobPhase``'s
diagram, conditions, the planner's reason, the coordinator's progress and throughput); it is
written only when it differs from what the API holds, so a quiet cluster costs no writes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from edl_scheduler.api import JobPhase
from edl_scheduler.controller.intents import (
    EventReason,
    EventType,
    JobCycle,
    PatchStatus,
)
from edl_scheduler.controller.naming import LABEL_ROLE
from edl_scheduler.controller.podstate import (
    draining_since,
    iso_time,
    meta_of,
    phase_of,
    step_toward,
    terminating,
    timestamp_of,
)
from edl_scheduler.core import Action, JobDecision, Reason, Role


def decision_events(cycle: JobCycle, decision: JobDecision) -> None:
    if cycle.deferred and decision.action in (Action.START, Action.GROW):
        return  # told when the pods are created
    w = decision.workers
    size = f"{w.current} -> {w.target} workers"
    servers = decision.pservers.remove if decision.pservers is not None else ()
    victims = ", ".join((*w.remove, *servers)) or "none"  # a PS job's servers leave too
    counts = cycle.out.counts
    if decision.action is Action.START:
        cycle.emit(
            EventType.NORMAL,
            EventReason.ADMITTED,
            f"{size} on {', '.join(sorted(set(w.add_nodes)))}: {decision.message}",
        )
        submitted = timestamp_of(cycle.status.get("submitTime"))
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


def compute_status(
    cycle: JobCycle, decision: JobDecision | None, attained_due: Callable[[str], float]
) -> None:
    view, tj, status, now = cycle.view, cycle.tj, cycle.status, cycle.now
    allocation: dict[str, str] = {}
    draining = 0
    pservers = 0
    for pod in view.replicas:
        name = str(meta_of(pod)["name"])
        if name in cycle.removed or terminating(pod) or phase_of(pod) in ("Succeeded", "Failed"):
            continue
        if draining_since(pod) is not None:
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
    held = _suspension(status)
    if (tj.spec.suspend and workers == 0) or (
        decision is not None and decision.action is Action.SUSPEND
    ):
        desired = JobPhase.SUSPENDED
    elif (
        old_phase is JobPhase.SUSPENDED
        and held is not None
        and held.get("reason") == PREEMPTED
        and workers < tj.spec.min_replicas
    ):
        desired = JobPhase.SUSPENDED  # preempted whole: held until the planner admits it again
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
        if held is not None and held.get("reason") == PREEMPTED:
            why = f"admitted again after it was {held.get('message') or 'preempted whole'}"
        else:
            why = "spec.suspend cleared: resuming"
        cycle.emit(EventType.NORMAL, EventReason.RESUMED, why)
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
            status["message"] = f"{decision.message}; waiting for {cycle.waiting_for}"
    if phase.active and not status.get("startTime"):
        status["startTime"] = iso_time(now)
    if (
        decision is not None
        and decision.workers.target != decision.workers.current
        and not cycle.deferred
    ):
        status["lastResize"] = {
            "time": iso_time(now),
            "from": decision.workers.current,
            "to": decision.workers.target,
            "reason": decision.reason.value,
        }
        if decision.workers.current > 0:  # a start from 0 is not a resize (as simulated)
            status["resizes"] = int(status.get("resizes", 0)) + 1
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
                **({"batch": t.batch} if t.batch > 0 else {}),
            }
            for t in progress.throughput
            if t.workers > 0
        ]
        if progress.efficiency is not None and progress.efficiency.problem() is None:
            status["efficiency"] = progress.efficiency.model_dump(mode="json", by_alias=True)
        if progress.batch is not None:
            status["batch"] = progress.batch.model_dump(
                mode="json", by_alias=True, exclude_none=True
            )
    elapsed = attained_due(tj.key) if phase.active else 0.0
    if elapsed > 0:
        last = float(status.get("attainedGpuSeconds", 0.0))
        gpus = workers * tj.spec.resources.gpu
        status["attainedGpuSeconds"] = round(last + gpus * elapsed, 3)
        cycle.out.attained_written.add(tj.key)
    conditions = [
        c
        for c in status.get("conditions", [])
        if c.get("type") not in ("Valid", "Admitted", SUSPENDED_CONDITION, SET_ASIDE_CONDITION)
    ]
    suspension = _suspension_condition(cycle, decision, held, phase)
    if suspension is not None:
        conditions.append(suspension)
    aside = _set_aside_condition(cycle, decision)
    if aside is not None:
        conditions.append(aside)
    conditions.append(
        {
            "type": "Valid",
            "status": "True",
            "reason": "SpecAccepted",
            "message": "",
            "lastTransitionTime": condition_time(status, "Valid", "True", now),
        }
    )
    admitted = "True" if status.get("startTime") else "False"
    conditions.append(
        {
            "type": "Admitted",
            "status": admitted,
            "reason": "Started" if admitted == "True" else "Waiting",
            "message": "" if admitted == "True" else str(status.get("message") or ""),
            "lastTransitionTime": condition_time(status, "Admitted", admitted, now),
        }
    )
    for c in conditions:
        if not c.get("message"):
            c.pop("message", None)  # an empty string reads back as null on Kubernetes 1.20
    status["conditions"] = conditions


#: The condition that says why a job holds no workers: ``True`` with reason ``Preempted``
#: (taken whole for a higher-ranked job; the message names it) or ``UserSuspended``
#: (``spec.suspend``); ``False`` with reason ``Resumed`` once it runs again. Absent on a
#: job that was never suspended.
SUSPENDED_CONDITION = "Suspended"
PREEMPTED = "Preempted"
USER_SUSPENDED = "UserSuspended"
RESUMED = "Resumed"


#: The condition that says the planner set the job aside (``True``, reason ``SetAside``, the
#: message naming the problem and the fix: the job keeps what it has and is not planned)
#: and, once planned again, ``False`` with reason ``Planned``. Absent on a job never set
#: aside.
SET_ASIDE_CONDITION = "SetAside"
PLANNED = "Planned"


def _set_aside_condition(cycle: JobCycle, decision: JobDecision | None) -> dict[str, Any] | None:
    """The ``SetAside`` condition after this cycle; a Warning Event when the job is set
    aside anew or for another problem (not at every cycle it stays so)."""
    status, now = cycle.status, cycle.now
    old = next(
        (c for c in status.get("conditions", []) if c.get("type") == SET_ASIDE_CONDITION), None
    )
    if decision is not None and decision.reason is Reason.SET_ASIDE:
        if old is None or old.get("status") != "True" or old.get("message") != decision.message:
            cycle.emit(EventType.WARNING, EventReason.SET_ASIDE, decision.message)
        value, reason, message = "True", SET_ASIDE_CONDITION, decision.message
    elif old is not None and decision is not None:
        value, reason, message = "False", PLANNED, ""
    elif old is not None:
        return dict(old)
    else:
        return None
    return {
        "type": SET_ASIDE_CONDITION,
        "status": value,
        "reason": reason,
        "message": message,
        "lastTransitionTime": condition_time(status, SET_ASIDE_CONDITION, value, now),
    }


def _suspension(status: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The job's ``Suspended`` condition while it holds (``True``), else None."""
    for c in status.get("conditions", []):
        if c.get("type") == SUSPENDED_CONDITION and c.get("status") == "True":
            found: Mapping[str, Any] = c
            return found
    return None


def _suspension_condition(
    cycle: JobCycle,
    decision: JobDecision | None,
    held: Mapping[str, Any] | None,
    phase: JobPhase,
) -> dict[str, Any] | None:
    """The ``Suspended`` condition after this cycle (None: the job never was)."""
    status, now = cycle.status, cycle.now
    if phase is JobPhase.SUSPENDED:
        if cycle.tj.spec.suspend:
            reason, message = USER_SUSPENDED, "spec.suspend is true"
        elif decision is not None and decision.action is Action.SUSPEND:
            reason = PREEMPTED
            message = (
                f"preempted whole for {decision.for_job}" if decision.for_job else "preempted whole"
            )
        elif held is not None:
            reason, message = str(held.get("reason")), str(held.get("message") or "")
        else:
            return None
        value = "True"
    elif held is not None or any(
        c.get("type") == SUSPENDED_CONDITION for c in status.get("conditions", [])
    ):
        value, reason, message = "False", RESUMED, ""
    else:
        return None
    return {
        "type": SUSPENDED_CONDITION,
        "status": value,
        "reason": reason,
        "message": message,
        "lastTransitionTime": condition_time(status, SUSPENDED_CONDITION, value, now),
    }


def condition_time(status: Mapping[str, Any], type_: str, value: str, now: float) -> str:
    for c in status.get("conditions", []):
        if c.get("type") == type_ and c.get("status") == value:
            return str(c.get("lastTransitionTime", iso_time(now)))
    return iso_time(now)


def write_status(cycle: JobCycle, old: Mapping[str, Any]) -> None:
    if cycle.status != old:
        cycle.out.intents.append(
            PatchStatus(cycle.tj.metadata.namespace, cycle.tj.metadata.name, cycle.status)
        )
