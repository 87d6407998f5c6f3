"""What the kubelet in miniature runs for a pod, and how it reports it: the pod's phase and
its containers' states, as the status subresource holds them.

Pure functions over `PodRun` (no API calls, no processes): the kubelet owns the runs and
writes what `pod_status` returns.

What must stay true:
- the phase follows the pod's restartPolicy as a kubelet's does: Never ends Succeeded when
  every container exited 0 and Failed otherwise; OnFailure ends Succeeded only once every
  container exited 0 (failed ones are restarted); Always never ends;
- a container that a signal ended reports exit code 128 + the signal, as container runtimes do;
- a status carries only values that a new sync would compute again (no clock readings of
  its own), so an unchanged pod is never written twice.
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from edl_scheduler.local.processes import ProcessState, ProcessStatus

from .pod_environment import POD_IP

Obj = dict[str, Any]


class PodPhase(enum.Enum):
    """A pod's phase as this kubelet reports it.

    PENDING --all containers started--> RUNNING --all exited, policy done--> SUCCEEDED | FAILED
    PENDING (a container cannot be configured, retried each sync) ------> RUNNING once it can
    """

    PENDING = "Pending"
    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"

    @property
    def terminal(self) -> bool:
        return self in (PodPhase.SUCCEEDED, PodPhase.FAILED)


@dataclass(slots=True)
class ContainerRun:
    """One container of a pod: its current run (a supervised process) and its history."""

    name: str
    process: str | None = None
    restarts: int = 0
    started_at: str | None = None
    status: ProcessStatus | None = None
    """The run's final status once finished; None while running or not started."""
    last_terminated: Obj | None = None
    waiting: tuple[str, str] | None = None
    """(reason, message) while the container cannot start."""
    retry_at: float = 0.0


@dataclass(slots=True)
class PodRun:
    """One pod that this kubelet runs: its containers' runs and what it last reported."""

    uid: str
    namespace: str
    name: str
    node: str
    directory: Path
    containers: dict[str, ContainerRun]
    started_at: str
    phase: PodPhase = PodPhase.PENDING
    refused: tuple[str, str] | None = None
    """(reason, message) when the pod as a whole cannot run here."""
    terminating: bool = False
    reported: Obj | None = None
    lost: bool = False
    """Its node failed (`fail_node`): nothing more is run or reported for it."""
    synced: str | None = None
    """The resourceVersion of the pod object last synced."""
    pending: bool = True
    """Something is left to do: a container to start or restart, or a status to write."""


def pod_status(pod: PodRun, obj: Obj) -> Obj:
    """The pod's `status` as a kubelet writes it (for a JSON merge patch: lists whole)."""
    ready = pod.phase is PodPhase.RUNNING and all(
        c.process is not None and c.status is None for c in pod.containers.values()
    )
    conditions = [
        condition("PodScheduled", True),
        condition("Initialized", True),
        condition("ContainersReady", ready),
        condition("Ready", ready),
    ]
    status: Obj = {
        "phase": pod.phase.value,
        "hostIP": POD_IP,
        "podIP": POD_IP,
        "podIPs": [{"ip": POD_IP}],
        "startTime": pod.started_at,
        "conditions": conditions,
        "containerStatuses": [container_status(obj, c) for c in pod.containers.values()],
    }
    if pod.refused is not None:
        status["reason"], status["message"] = pod.refused
    return status


def container_status(obj: Obj, container: ContainerRun) -> Obj:
    """One entry of `containerStatuses`; exactly one of the three states is set."""
    declared = next(c for c in obj["spec"]["containers"] if c["name"] == container.name)
    state: Obj = {"waiting": None, "running": None, "terminated": None}
    running = container.process is not None and container.status is None
    if container.status is not None:
        state["terminated"] = terminated(container)
    elif running:
        state["running"] = {"startedAt": container.started_at}
    elif container.waiting is not None:
        reason, message = container.waiting
        state["waiting"] = {"reason": reason, "message": message}
    elif container.last_terminated is not None:
        state["waiting"] = {"reason": "CrashLoopBackOff", "message": "restarting"}
    else:
        state["waiting"] = {"reason": "ContainerCreating"}
    result: Obj = {
        "name": container.name,
        "image": declared.get("image", ""),
        "imageID": "",
        "ready": running,
        "started": running,
        "restartCount": container.restarts,
        "state": state,
        "lastState": {"terminated": container.last_terminated} if container.last_terminated else {},
    }
    if container.process is not None:
        result["containerID"] = f"local://{container.process}"
    return result


def now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def condition(kind: str, status: bool) -> Obj:
    return {"type": kind, "status": "True" if status else "False", "lastTransitionTime": None}


def should_restart(policy: str, status: ProcessStatus) -> bool:
    return policy == "Always" or (policy == "OnFailure" and status.exit_code != 0)


def phase(policy: str, pod: PodRun) -> PodPhase:
    containers = list(pod.containers.values())
    if any(c.process is None and c.last_terminated is None for c in containers):
        return PodPhase.PENDING
    finished = [c.status for c in containers if c.status is not None]
    if len(finished) < len(containers) or policy == "Always":
        return PodPhase.RUNNING
    if all(s.exit_code == 0 for s in finished):
        return PodPhase.SUCCEEDED
    return PodPhase.FAILED if policy == "Never" else PodPhase.RUNNING


def exit_code_of(status: ProcessStatus) -> int:
    """A container runtime's exit code: 128 + the signal for a process a signal ended."""
    code = status.exit_code if status.exit_code is not None else 255
    return 128 - code if code < 0 else code


def terminated(container: ContainerRun) -> Obj:
    status = container.status
    assert status is not None
    code = exit_code_of(status)
    finished = datetime.fromtimestamp(status.finished_at or time.time(), UTC)
    result = {
        "exitCode": code,
        "reason": "Completed" if code == 0 else "Error",
        "startedAt": container.started_at,
        "finishedAt": finished.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "containerID": f"local://{container.process}",
    }
    if status.message:
        result["message"] = status.message
    if status.state is ProcessState.FAILED and status.pid is None:
        result["reason"] = "ContainerCannotRun"
    return result
