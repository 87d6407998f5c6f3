"""Which parts of a job's pod template the controller refuses to copy into the pods it
creates, unless the cluster admin allowed them.

Why: the controller creates each job's pods from the job's template with its own
permissions, so whoever may create a TrainingJob would otherwise get pods that are
``privileged``, mount the node's files (``hostPath``), share its network, process or IPC
namespaces, add kernel capabilities, or run as any service account of the namespace:
limited only by Pod Security Admission, which many clusters leave permissive. Each of
these is refused, naming the field and the fix, unless named in the controller's
``--allow-pod-field`` (``ControllerConfig.allowed_pod_fields``).

What must stay true: a job whose template asks for a field that is not allowed gets no pod
(observing rejects it: ``Valid=False`` and a Warning Event with this module's message).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from enum import StrEnum
from typing import Any


class PodField(StrEnum):
    """The template fields that widen what a job's pods may do on their node."""

    PRIVILEGED = "privileged"
    HOST_PATH = "hostPath"
    HOST_NETWORK = "hostNetwork"
    HOST_PID = "hostPID"
    HOST_IPC = "hostIPC"
    CAPABILITIES = "capabilities"
    SERVICE_ACCOUNT = "serviceAccountName"


def _containers(spec: Mapping[str, Any]) -> Iterator[tuple[str, Mapping[str, Any]]]:
    for kind in ("initContainers", "containers", "ephemeralContainers"):
        for index, container in enumerate(spec.get(kind) or ()):
            if isinstance(container, Mapping):
                yield f"{kind}[{index}]", container


def _asked(spec: Mapping[str, Any]) -> Iterator[tuple[PodField, str]]:
    """Every widening field ``spec`` (a pod spec) asks for, with its path under it."""
    for key, field in (
        ("hostNetwork", PodField.HOST_NETWORK),
        ("hostPID", PodField.HOST_PID),
        ("hostIPC", PodField.HOST_IPC),
    ):
        if spec.get(key) is True:
            yield field, key
    for key in ("serviceAccountName", "serviceAccount"):
        if spec.get(key) not in (None, "", "default"):
            yield PodField.SERVICE_ACCOUNT, key
    for index, volume in enumerate(spec.get("volumes") or ()):
        if isinstance(volume, Mapping) and volume.get("hostPath") is not None:
            yield PodField.HOST_PATH, f"volumes[{index}].hostPath"
    for where, container in _containers(spec):
        context = container.get("securityContext")
        if not isinstance(context, Mapping):
            continue
        if context.get("privileged") is True:
            yield PodField.PRIVILEGED, f"{where}.securityContext.privileged"
        capabilities = context.get("capabilities")
        if isinstance(capabilities, Mapping) and capabilities.get("add"):
            yield PodField.CAPABILITIES, f"{where}.securityContext.capabilities.add"


def refused_field(template_spec: Mapping[str, Any], allowed: frozenset[PodField]) -> str | None:
    """Why the controller refuses a template (its ``spec``), or None: the first field it
    asks for that ``allowed`` does not name, with the fix."""
    for field, path in _asked(template_spec):
        if field not in allowed:
            return (
                f"spec.template.spec.{path}: the controller does not create pods with "
                f"{field.value}: remove it, or ask the cluster admin to allow it "
                f"(edl-controller --allow-pod-field {field.value})"
            )
    return None
