"""The Kubernetes backend: TrainingJob custom objects through the kubeconfig's context.

Every verb is a plain API call on the TrainingJob object (create, list, get, merge-patch
``spec``, delete) or a read of what the operator writes (status, Events, worker pods and
their logs), so the verbs work against an API server before any operator runs: the
operator acts on what they write. Errors of the API server become the SDK's errors, with the
server's own message and a fix.
"""

from __future__ import annotations

import time
from datetime import datetime
from pathlib import Path
from typing import Any

from edl_scheduler.api import (
    GROUP,
    PLURAL,
    VERSION,
    TrainingJob,
    TrainingJobError,
    load_training_job,
)
from edl_scheduler.sdk.base import (
    ClusterView,
    EventView,
    JobDetails,
    JobSummary,
    LogChunk,
    ResizeView,
    WorkerView,
    batch_of,
    progress_of,
    split_name,
)
from edl_scheduler.sdk.errors import Conflict, EdlError, InvalidRequest, NotFound, Unreachable

LABEL_JOB = "edl.dev/job"
LABEL_ROLE = "edl.dev/role"
GPU = "nvidia.com/gpu"


def _timestamp(value: object) -> float | None:
    if isinstance(value, datetime):
        return value.timestamp()
    if isinstance(value, str) and value:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    return None


def summary_of(obj: dict[str, Any], now: float) -> JobSummary:
    meta, spec, status = obj.get("metadata", {}), obj.get("spec", {}), obj.get("status") or {}
    created = _timestamp(meta.get("creationTimestamp")) or now
    replicas = int(status.get("replicas", 0))
    done, speed = progress_of(
        status.get("progress") or {}, status.get("throughput") or [], replicas
    )
    return JobSummary(
        name=meta.get("name", "?"),
        namespace=meta.get("namespace", "default"),
        queue=meta.get("namespace", "default"),
        priority=int(spec.get("priority", status.get("priority", 0)) or 0),
        min_replicas=int(spec.get("minReplicas", 0)),
        max_replicas=int(spec.get("maxReplicas", 0)),
        replicas=replicas,
        phase=str(status.get("phase", "Pending")),
        age_s=max(0.0, now - created),
        message=str(status.get("message", "")),
        restarts=int(status.get("restarts", 0)),
        done=done,
        samples_per_second=speed,
        **batch_of(status.get("batch")),
    )


class KubeClient:
    """The verbs of ``sdk.base.Client`` against a Kubernetes API server."""

    backend = "kube"

    def __init__(
        self,
        context: str | None = None,
        kubeconfig: Path | None = None,
        namespace: str = "default",
        api_client: Any = None,
    ) -> None:
        try:
            from kubernetes import client, config
        except ImportError:
            raise EdlError(
                "the Kubernetes backend needs the kubernetes client: pip install 'edl[k8s]'"
            ) from None

        self.namespace = namespace
        if api_client is None:
            try:
                api_client = config.new_client_from_config(  # type: ignore[no-untyped-call]
                    config_file=str(kubeconfig) if kubeconfig else None, context=context
                )
            except (config.ConfigException, OSError, TypeError) as error:
                raise Unreachable(
                    f"cannot load the kubeconfig ({error}): set KUBECONFIG or pass "
                    "--kubeconfig/--context"
                ) from None
        self.api_client = api_client
        self.custom = client.CustomObjectsApi(api_client)
        self.core = client.CoreV1Api(api_client)

    def close(self) -> None:
        self.api_client.close()

    def __enter__(self) -> KubeClient:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def _call(self, what: str, function: Any, *args: Any, **kwargs: Any) -> Any:
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        try:
            return function(*args, **kwargs)
        except ApiException as error:
            raise _translate(what, error) from None
        except HTTPError as error:
            raise Unreachable(
                f"the Kubernetes API server did not answer ({error}): check the context"
            ) from None

    def _names(self, name: str) -> tuple[str, str]:
        return split_name(name, self.namespace)

    def _get(self, name: str) -> dict[str, Any]:
        namespace, short = self._names(name)
        obj: dict[str, Any] = self._call(
            f"job {namespace}/{short}",
            self.custom.get_namespaced_custom_object,
            GROUP,
            VERSION,
            namespace,
            PLURAL,
            short,
        )
        return obj

    # -- verbs -----------------------------------------------------------------------------

    def submit(self, manifest: str, workdir: Path | None = None) -> JobSummary:
        try:
            job: TrainingJob = load_training_job(manifest)
        except TrainingJobError as error:
            raise InvalidRequest(str(error)) from None
        body = job.to_dict(as_written=True)
        body.pop("status", None)
        metadata = body.setdefault("metadata", {})
        namespace = metadata.setdefault("namespace", self.namespace)
        created = self._call(
            f"job {namespace}/{job.metadata.name}",
            self.custom.create_namespaced_custom_object,
            GROUP,
            VERSION,
            namespace,
            PLURAL,
            body,
        )
        return summary_of(created, time.time())

    def list(self) -> list[JobSummary]:
        found = self._call(
            f"jobs in {self.namespace}",
            self.custom.list_namespaced_custom_object,
            GROUP,
            VERSION,
            self.namespace,
            PLURAL,
        )
        now = time.time()
        return [summary_of(o, now) for o in found.get("items", [])]

    def describe(self, name: str) -> JobDetails:
        obj = self._get(name)
        namespace, short = self._names(name)
        events = self._call(
            f"events of {namespace}/{short}",
            self.core.list_namespaced_event,
            namespace,
            field_selector=f"involvedObject.name={short},involvedObject.kind=TrainingJob",
        )
        pods = self._call(
            f"pods of {namespace}/{short}",
            self.core.list_namespaced_pod,
            namespace,
            label_selector=f"{LABEL_JOB}={short},{LABEL_ROLE}=worker",
        )
        status = obj.get("status") or {}
        last = status.get("lastResize")
        resizes = []
        if last:
            resizes.append(
                ResizeView(
                    time=_timestamp(last.get("time")) or 0.0,
                    from_replicas=int(last.get("from", 0)),
                    to_replicas=int(last.get("to", 0)),
                    reason=str(last.get("reason", "")),
                )
            )
        return JobDetails(
            summary=summary_of(obj, time.time()),
            manifest=obj,
            workers=[
                WorkerView(
                    name=p.metadata.name,
                    node=p.spec.node_name or "",
                    draining=(p.metadata.annotations or {}).get("edl.dev/draining") == "true",
                    started=_timestamp(p.metadata.creation_timestamp),
                    state=(p.status.phase if p.status else "") or "",
                )
                for p in pods.items
            ],
            events=sorted(
                (
                    EventView(
                        time=_timestamp(e.last_timestamp or e.event_time or e.first_timestamp)
                        or _timestamp(e.metadata.creation_timestamp)
                        or 0.0,
                        type=e.type or "Normal",
                        reason=e.reason or "",
                        message=e.message or "",
                    )
                    for e in events.items
                ),
                key=lambda e: e.time,
            ),
            resizes=resizes,
            progress=dict(status.get("progress") or {}),
        )

    def _patch_spec(self, name: str, spec: dict[str, Any]) -> JobSummary:
        namespace, short = self._names(name)
        patched = self._call(
            f"job {namespace}/{short}",
            self.custom.patch_namespaced_custom_object,
            GROUP,
            VERSION,
            namespace,
            PLURAL,
            short,
            {"spec": spec},
        )
        return summary_of(patched, time.time())

    def scale(
        self, name: str, min_replicas: int | None = None, max_replicas: int | None = None
    ) -> JobSummary:
        current = self._get(name).get("spec", {})
        lo = int(current.get("minReplicas", 1)) if min_replicas is None else min_replicas
        hi = int(current.get("maxReplicas", lo)) if max_replicas is None else max_replicas
        if lo < 1:
            raise InvalidRequest(f"min: {lo} is below 1: give at least 1")
        if hi < lo:
            raise InvalidRequest(f"max: {hi} is below min ({lo}): raise max or lower min")
        return self._patch_spec(name, {"minReplicas": lo, "maxReplicas": hi})

    def suspend(self, name: str) -> JobSummary:
        return self._patch_spec(name, {"suspend": True})

    def resume(self, name: str) -> JobSummary:
        return self._patch_spec(name, {"suspend": False})

    def delete(self, name: str) -> None:
        namespace, short = self._names(name)
        self._call(
            f"job {namespace}/{short}",
            self.custom.delete_namespaced_custom_object,
            GROUP,
            VERSION,
            namespace,
            PLURAL,
            short,
        )

    def logs(
        self, name: str, worker: str | None = None, tail: int = 0, offset: int | None = None
    ) -> LogChunk:
        namespace, short = self._names(name)
        if worker is None:
            details = self.describe(name)
            if not details.workers:
                raise NotFound(f"job {namespace}/{short} has no worker pods yet")
            worker = details.workers[0].name
        elif worker == "coordinator":
            worker = f"{short}-coordinator"
        text: str = self._call(
            f"pod {namespace}/{worker}",
            self.core.read_namespaced_pod_log,
            worker,
            namespace,
            tail_lines=tail or None,
        )
        data = text.encode()
        start = min(offset or 0, len(data))
        return LogChunk(worker=worker, text=data[start:].decode(errors="replace"), offset=len(data))

    def top(self) -> ClusterView:
        nodes = self._call("nodes", self.core.list_node)
        slots = 0
        for n in nodes.items:
            allocatable = (n.status.allocatable or {}) if n.status else {}
            slots += int(allocatable.get(GPU, 0) or 0)
        pods = self._call(
            "worker pods", self.core.list_pod_for_all_namespaces, label_selector=LABEL_JOB
        )
        used = 0
        for p in pods.items:
            if p.status and p.status.phase in ("Succeeded", "Failed"):
                continue
            for c in p.spec.containers or ():
                requests = (c.resources.requests or {}) if c.resources else {}
                used += int(requests.get(GPU, 0) or 0)
        return ClusterView(backend="kube", slots=slots, gpus=True, used=used, jobs=self.list())


def _translate(what: str, error: Any) -> EdlError:
    import json

    try:
        message = json.loads(error.body).get("message", error.reason)
    except (TypeError, ValueError, AttributeError):
        message = error.reason
    status = error.status
    if status == 404:
        if "the server could not find the requested resource" in str(message):
            return NotFound(
                "the TrainingJob resource is not installed on this cluster: apply the CRD "
                "(kubectl apply -f manifests/crd/)"
            )
        return NotFound(f"{what} does not exist: check the name with `edlctl ls`")
    if status == 409:
        return Conflict(f"{what} already exists: delete it first, or use another name")
    if status in (400, 422):
        return InvalidRequest(f"{what}: the API server refused it: {message}")
    if status in (401, 403):
        return EdlError(f"{what}: not allowed ({message}): check your RBAC permissions")
    return EdlError(f"{what}: the API server answered {status}: {message}")
