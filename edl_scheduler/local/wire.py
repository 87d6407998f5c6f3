"""What the local service's endpoint sends and receives, as pydantic models.

The SDK reads the same models from both backends (the Kubernetes backend builds them from
TrainingJob objects), so a script or ``edlctl`` sees one shape whatever runs the jobs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel, Field


class SubmitRequest(BaseModel):
    manifest: str
    """The TrainingJob as YAML (one document)."""
    workdir: str
    """Where the worker command runs when its container names no workingDir."""


class ScaleRequest(BaseModel):
    min_replicas: int | None = None
    max_replicas: int | None = None


class ShutdownRequest(BaseModel):
    keep_running: bool = False
    """Leave the jobs' processes running, for the next service to adopt."""


class JobSummary(BaseModel):
    """One line of ``edlctl ls``."""

    name: str
    namespace: str
    queue: str
    priority: int
    min_replicas: int
    max_replicas: int
    replicas: int
    phase: str
    age_s: float
    message: str = ""
    restarts: int = 0
    done: float | None = None
    """The share of the job's samples (all epochs) committed, 0 to 1 (None: not reported)."""
    samples_per_second: float | None = None
    """The throughput last measured at its current size (None: not measured)."""
    global_batch: int | None = None
    """The global batch the job runs at, as its rank 0 reported it (None: not reported)."""
    accumulation: int | None = None
    """Its accumulation steps per optimizer step (None: not reported)."""
    goodput: float | None = None
    """The goodput its batch policy predicts there, samples per second at the initial
    batch's efficiency (None: not reported; 0: the policy predicts none)."""


def progress_of(
    progress: Mapping[str, Any], throughput: Sequence[Mapping[str, Any]], replicas: int
) -> tuple[float | None, float | None]:
    """(share done, samples per second at ``replicas`` workers) from a job's status: its
    ``progress`` block and ``throughput`` samples, as either backend writes them."""
    done = None
    total = int(progress.get("samplesPerEpoch") or 0) * int(progress.get("epochs") or 0)
    if total > 0:
        done = min(1.0, max(0.0, int(progress.get("samplesDone") or 0) / total))
    speed = None
    for sample in throughput:
        if int(sample.get("workers") or 0) == replicas:
            speed = float(sample.get("samplesPerSecond") or 0.0)
    return done, speed


def batch_of(batch: Mapping[str, Any] | None) -> dict[str, Any]:
    """``JobSummary``'s batch fields from a status's ``batch`` block (camelCase, as either
    backend writes it); none when the job has not reported one."""
    if not batch:
        return {}
    return {
        "global_batch": int(batch.get("globalBatch") or 0),
        "accumulation": int(batch.get("accumulation") or 1),
        "goodput": float(batch.get("goodput") or 0.0),
    }


class WorkerView(BaseModel):
    name: str
    pid: int | None = None
    node: str = ""
    slots: list[int] = Field(default_factory=list)
    draining: bool = False
    started: float | None = None
    state: str = ""
    role: str = "worker"


class EventView(BaseModel):
    time: float
    type: str
    reason: str
    message: str


class ResizeView(BaseModel):
    time: float
    from_replicas: int
    to_replicas: int
    reason: str


class JobDetails(BaseModel):
    """``edlctl describe``: the summary, the whole object, its processes and history."""

    summary: JobSummary
    manifest: dict[str, Any]
    workers: list[WorkerView] = Field(default_factory=list)
    events: list[EventView] = Field(default_factory=list)
    resizes: list[ResizeView] = Field(default_factory=list)
    progress: dict[str, Any] = Field(default_factory=dict)
    coordinator_pid: int | None = None
    logs: list[str] = Field(default_factory=list)
    """The logs kept of the job's processes, by the short names ``edlctl logs --worker``
    takes (they stay after a process, or the job, ended)."""


class ClusterView(BaseModel):
    """``edlctl top``: the slots and who holds them."""

    backend: str
    slots: int
    gpus: bool
    used: int
    jobs: list[JobSummary] = Field(default_factory=list)
    slot_owner: dict[int, str] = Field(default_factory=dict)
    policy: str = ""
    pid: int | None = None


class LogChunk(BaseModel):
    worker: str
    text: str
    offset: int
    """Where the next read starts (for following)."""


class ErrorBody(BaseModel):
    detail: str
