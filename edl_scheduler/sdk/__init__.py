"""The Python SDK: the verbs of edlctl for scripts, on either backend.

from edl_scheduler.sdk import connect
with open("job.yaml") as f:
    edl = connect("local")              # or connect("kube", context="prod")
    edl.submit(f.read())
    for job in edl.list():
        print(job.name, job.phase, job.replicas)
"""

from __future__ import annotations

from pathlib import Path

from edl_scheduler.sdk.base import (
    Client,
    ClusterView,
    EventView,
    JobDetails,
    JobSummary,
    LogChunk,
    ResizeView,
    WorkerView,
)
from edl_scheduler.sdk.errors import Conflict, EdlError, InvalidRequest, NotFound, Unreachable

__all__ = [
    "Client",
    "ClusterView",
    "Conflict",
    "EdlError",
    "EventView",
    "InvalidRequest",
    "JobDetails",
    "JobSummary",
    "LogChunk",
    "NotFound",
    "ResizeView",
    "Unreachable",
    "WorkerView",
    "connect",
]


def connect(
    backend: str = "local",
    *,
    home: Path | None = None,
    context: str | None = None,
    kubeconfig: Path | None = None,
    namespace: str = "default",
) -> Client:
    """A client of the local service (``home``) or of Kubernetes (kubeconfig ``context``)."""
    if backend == "local":
        from edl_scheduler.sdk.local import LocalClient

        return LocalClient(home, namespace=namespace)
    if backend == "kube":
        from edl_scheduler.sdk.kube import KubeClient

        kube: Client = KubeClient(context=context, kubeconfig=kubeconfig, namespace=namespace)
        return kube
    raise InvalidRequest(f"backend {backend!r} is not known: use 'local' or 'kube'")
