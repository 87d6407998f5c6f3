"""The verbs every backend offers, and the views they return.

One ``Client`` protocol for the local backend and for Kubernetes, so that ``edlctl`` and
scripts are written once. Views are the local endpoint's wire models
(``edl_scheduler.local.wire``); the Kubernetes client builds the same ones from TrainingJob
objects.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from edl_scheduler.local.wire import (
    ClusterView,
    EventView,
    JobDetails,
    JobSummary,
    LogChunk,
    ResizeView,
    WorkerView,
    batch_of,
    progress_of,
)

__all__ = [
    "Client",
    "ClusterView",
    "EventView",
    "JobDetails",
    "JobSummary",
    "LogChunk",
    "ResizeView",
    "WorkerView",
    "batch_of",
    "progress_of",
    "split_name",
]


def split_name(name: str, namespace: str) -> tuple[str, str]:
    """``ns/name`` or ``name`` (in ``namespace``) as (namespace, name)."""
    if "/" in name:
        ns, _, short = name.partition("/")
        return ns, short
    return namespace, name


class Client(Protocol):
    """What a backend does for ``edlctl`` and for scripts."""

    backend: str

    def submit(self, manifest: str, workdir: Path | None = None) -> JobSummary:
        """Submit one TrainingJob given as YAML."""
        ...

    def list(self) -> list[JobSummary]: ...

    def describe(self, name: str) -> JobDetails: ...

    def scale(
        self, name: str, min_replicas: int | None = None, max_replicas: int | None = None
    ) -> JobSummary: ...

    def suspend(self, name: str) -> JobSummary: ...

    def resume(self, name: str) -> JobSummary: ...

    def delete(self, name: str) -> None: ...

    def logs(
        self, name: str, worker: str | None = None, tail: int = 0, offset: int | None = None
    ) -> LogChunk: ...

    def top(self) -> ClusterView: ...
