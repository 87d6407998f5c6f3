"""What the local service's endpoint sends and receives, as pydantic models.

The SDK reads the same models from both backends (the Kubernetes backend builds them from
TrainingJob objects), so a script or ``edlctl`` sees one shape whatever runs the jobs.
"""

from __future__ import annotations

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


class WorkerView(BaseModel):
    name: str
    pid: int | None = None
    node: str = ""
    slots: list[int] = Field(default_factory=list)
    draining: bool = False
    started: float | None = None
    state: str = ""


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
