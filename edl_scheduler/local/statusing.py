"""A local job's status as its processes show it: phase, replicas, progress, resizes.

Pure functions over what the cycle observed (the store's worker rows, the coordinator's
progress, the planner's decision); the cycle writes their result to the store.

What must stay true:
- The phase moves only along ``JobPhase``'s diagram, one step per cycle at most.
- Attained GPU-seconds only grow: a cycle adds its elapsed time times the live workers' slots.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Any

from edl_scheduler.api import (
    BatchInUse,
    GradientStatistics,
    JobPhase,
    LastResize,
    ThroughputSample,
    TrainingJobStatus,
)
from edl_scheduler.core import Action
from edl_scheduler.core.building import efficiency_from_status
from edl_scheduler.core.snapshot import Efficiency
from edl_scheduler.local.launching import LOCAL_NODE
from edl_scheduler.local.storing import WorkerRow

LOG = logging.getLogger("edl.local")
RESIZE_EVENTS = {
    Action.START: "Started",
    Action.GROW: "Grew",
    Action.SHRINK: "Shrunk",
    Action.SUSPEND: "Preempted",
}
"""The Event reason a resize is recorded under, by the planner's action."""


def at(now: float) -> datetime:
    return datetime.fromtimestamp(now, UTC)


def next_phase(
    current: JobPhase,
    suspend: bool,
    workers: list[WorkerRow],
    live: int,
    members: int,
    resized: bool = True,
) -> JobPhase:
    """The phase the job's processes show, reached only along ``JobPhase``'s diagram.

    Resizing: a victim is still draining, or (after a grow or shrink, ``resized``) the
    group does not hold every live worker yet. Workers joining the job's first group are
    not a resize: the job is Running from the moment its gang is placed.
    """
    if not live:
        wanted = JobPhase.SUSPENDED if suspend and not workers else JobPhase.PENDING
    elif current in (JobPhase.PENDING, JobPhase.SUSPENDED):
        wanted = JobPhase.RUNNING
    elif any(w.draining for w in workers) or (resized and members != live):
        wanted = JobPhase.RESIZING
    else:
        wanted = JobPhase.RUNNING
    return current.step_toward(wanted)


def observed_status(
    status: TrainingJobStatus,
    *,
    suspend: bool,
    workers: list[WorkerRow],
    progress: Any,
    message: str,
    finishing: bool,
    elapsed: float,
    servers: int = 0,
) -> TrainingJobStatus:
    """The status after one cycle: ``progress`` is the coordinator's answer, or None;
    ``servers`` the live parameter servers of a ``ps`` job."""
    live = [w for w in workers if not w.draining]
    members = len(progress.members) if progress is not None else 0
    resized = status.last_resize is not None and status.last_resize.from_replicas > 0
    if finishing:
        phase = status.phase
        message = "finishing: the last epoch is committed, workers are leaving"
    else:
        phase = next_phase(status.phase, suspend, workers, len(live), members, resized)
    update: dict[str, Any] = {
        "phase": phase,
        "message": message,
        "replicas": len(live),
        "ready_replicas": members,
        "pserver_replicas": servers,
        "allocation": {w.name: LOCAL_NODE for w in live},
        "attained_gpu_seconds": status.attained_gpu_seconds
        + elapsed * sum(len(w.slots) for w in live),
    }
    if progress is not None:
        update.update(progress_fields(progress))
    return status.model_copy(update=update)


def progress_fields(progress: Any) -> dict[str, Any]:
    """The coordinator's progress and measured throughput, as status fields."""
    return {
        "generation": int(progress.generation),
        "progress": {
            "epoch": int(progress.epoch),
            "epochs": int(progress.epochs),
            "committedStep": int(progress.committed_step),
            "samplesDone": int(progress.samples_done),
            "samplesPerEpoch": int(progress.samples_per_epoch),
            "finished": bool(progress.finished),
        },
        **efficiency_fields(progress),
        **batch_fields(progress),
        "throughput": [
            ThroughputSample(
                nodes=max(1, int(t.nodes)),
                workers=max(1, int(t.workers)),
                samples_per_second=max(0.0, float(t.samples_per_s)),
                step_seconds=float(t.step_time_s) if t.step_time_s > 0 else None,
                batch=max(0, int(t.batch)),
            )
            for t in progress.throughput
            if t.workers > 0
        ],
    }


def efficiency_fields(progress: Any) -> dict[str, Any]:
    """The gradient statistics the coordinator holds, when it holds usable ones (an unusable
    report is dropped with a warning; the status keeps the last good one)."""
    if not progress.HasField("noise"):
        return {}
    stats = GradientStatistics(
        init_batch=int(progress.noise.init_batch),
        grad_sqr=float(progress.noise.grad_sqr),
        grad_var=float(progress.noise.grad_var),
        steps=int(progress.noise.steps),
    )
    problem = stats.problem()
    if problem is not None:
        LOG.warning("the coordinator's gradient statistics dropped: %s", problem)
        return {}
    return {"efficiency": stats}


def batch_fields(progress: Any) -> dict[str, Any]:
    """What rank 0 reported it runs at, when it did (the status keeps the last report)."""
    if not progress.HasField("batch"):
        return {}
    return {"batch": BatchInUse.reported(progress.batch)}


def planned_efficiency(status: TrainingJobStatus) -> Efficiency | None:
    """The statistical efficiency the planner weighs the job's throughput by, from the
    status's gradient statistics; None when none are usable (dropped with a warning)."""
    efficiency, left_out = efficiency_from_status(status)
    if left_out is not None:
        LOG.warning("%s", left_out)
    return efficiency


def resized_status(
    status: TrainingJobStatus, now: float, before: int, after: int, reason: str
) -> TrainingJobStatus:
    """The status with a resize recorded; the job's start time is its first resize."""
    return status.model_copy(
        update={
            "last_resize": LastResize.model_validate(
                {"time": at(now), "from": before, "to": after, "reason": reason}
            ),
            "start_time": status.start_time or at(now),
        }
    )


def final_status(
    status: TrainingJobStatus, phase: JobPhase, message: str, now: float
) -> TrainingJobStatus:
    """The status of a job that has ended: no replicas, the reason, the time."""
    return status.model_copy(
        update={
            "phase": phase,
            "message": message,
            "completion_time": at(now),
            "replicas": 0,
            "ready_replicas": 0,
        }
    )
