"""A container's command line and environment as Kubernetes defines them, for the kubelet in
miniature (`kubelet.py`), which runs containers as local processes.

Kubernetes' order: service links first, then `envFrom`, then `env`; a later entry wins, and
`$(VAR)` in a value, a command or an argument refers to a variable defined before it. Values
come from the pod (the downward API), Secrets and ConfigMaps (read through the API), and the
container's own resources. The process environment starts from a minimal base, not from the
test process's: PATH (this test interpreter's directory first, so `python` is the project's),
HOME and TMPDIR (the pod's own directory), HOSTNAME, LANG, and PYTHONPATH when set.

What differs from a cluster: every pod's IP is 127.0.0.1, and service links point at
127.0.0.1 and the Service's numeric target port (there is no cluster IP to route through).

What must stay true: a container that cannot be configured raises `ContainerConfigError`
with the reason a kubelet would report (CreateContainerConfigError, CreateContainerError)
and a message that names what is missing; nothing here starts a process.
"""

from __future__ import annotations

import base64
import json
import math
import os
import re
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import kubernetes
from kubernetes.client import ApiException
from kubernetes.utils import parse_quantity

POD_IP = "127.0.0.1"

Obj = dict[str, Any]


class ContainerConfigError(Exception):
    """A container cannot be started as declared (a missing Secret key, no command, ...)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


class ContainerEnvironment:
    """Resolves containers' environments against the API (Secrets, ConfigMaps, Services)."""

    def __init__(self, core: kubernetes.client.CoreV1Api) -> None:
        self.core = core
        self._services: dict[str, list[Obj]] = {}

    def forget_services(self) -> None:
        """Drops the Services listed so far. The kubelet calls it at each sync: a Service
        created before a pod is then always in the pod's links (a list is a consistent
        read; a watch may lag), at one list per namespace and sync."""
        self._services.clear()

    def environment(self, directory: Path, obj: Obj, declared: Obj) -> dict[str, str]:
        """What a container runtime would give the container, in Kubernetes' order: service
        links, then envFrom, then env (later entries win; `$(VAR)` sees earlier ones)."""
        env = {
            "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]]),
            "HOME": str(directory),
            "TMPDIR": str(directory / "tmp"),
            "HOSTNAME": obj["metadata"]["name"],
            "LANG": "C.UTF-8",
        }
        if "PYTHONPATH" in os.environ:
            env["PYTHONPATH"] = os.environ["PYTHONPATH"]
        if obj["spec"].get("enableServiceLinks", True):
            env |= self._service_links(obj["metadata"]["namespace"])
        for source in declared.get("envFrom") or []:
            prefix = source.get("prefix", "")
            if "secretRef" in source:
                ref = source["secretRef"]
                values = self._secret(
                    obj["metadata"]["namespace"], ref["name"], ref.get("optional", False)
                )
            else:
                ref = source["configMapRef"]
                values = self._config_map(
                    obj["metadata"]["namespace"], ref["name"], ref.get("optional", False)
                )
            env |= {prefix + k: v for k, v in values.items()}
        for var in declared.get("env") or []:
            if "valueFrom" in var:
                value = self._value_from(obj, declared, var["name"], var["valueFrom"])
                if value is not None:
                    env[var["name"]] = value
            else:
                env[var["name"]] = _expand(var.get("value", ""), env)
        return env

    def _value_from(self, obj: Obj, declared: Obj, name: str, source: Obj) -> str | None:
        if "fieldRef" in source:
            return _field(obj, source["fieldRef"]["fieldPath"], name)
        if "secretKeyRef" in source:
            ref = source["secretKeyRef"]
            optional = ref.get("optional", False)
            values = self._secret(obj["metadata"]["namespace"], ref["name"], optional)
            return _key_of(values, ref, optional, "Secret", name)
        if "configMapKeyRef" in source:
            ref = source["configMapKeyRef"]
            optional = ref.get("optional", False)
            values = self._config_map(obj["metadata"]["namespace"], ref["name"], optional)
            return _key_of(values, ref, optional, "ConfigMap", name)
        if "resourceFieldRef" in source:
            return _resource(declared, source["resourceFieldRef"], name)
        raise ContainerConfigError(
            "CreateContainerConfigError", f"env {name}: unsupported valueFrom {sorted(source)}"
        )

    def _secret(self, namespace: str, name: str, optional: bool) -> dict[str, str]:
        try:
            secret = self.core.read_namespaced_secret(name, namespace)
        except ApiException as error:
            if error.status == 404 and optional:
                return {}
            if error.status == 404:
                raise ContainerConfigError(
                    "CreateContainerConfigError", f'secret "{name}" not found'
                ) from None
            raise
        values = {k: base64.b64decode(v).decode() for k, v in (secret.data or {}).items()}
        return values

    def _config_map(self, namespace: str, name: str, optional: bool) -> dict[str, str]:
        try:
            config_map = self.core.read_namespaced_config_map(name, namespace)
        except ApiException as error:
            if error.status == 404 and optional:
                return {}
            if error.status == 404:
                raise ContainerConfigError(
                    "CreateContainerConfigError", f'configmap "{name}" not found'
                ) from None
            raise
        return dict(config_map.data or {})

    def _service_links(self, namespace: str) -> dict[str, str]:
        """`<NAME>_SERVICE_HOST` and `<NAME>_SERVICE_PORT[_<PORT>]` for each Service of the
        namespace, pointing at 127.0.0.1 and the numeric target port (a named target port,
        which only the serving pod could resolve, falls back to the Service's port)."""
        if namespace not in self._services:
            answer = self.core.list_namespaced_service(namespace, _preload_content=False)
            self._services[namespace] = json.loads(answer.data)["items"]
        env = {}
        for service in self._services[namespace]:
            prefix = _env_name(service["metadata"]["name"])
            ports = service.get("spec", {}).get("ports") or []
            if not ports:
                continue
            env[f"{prefix}_SERVICE_HOST"] = POD_IP
            env[f"{prefix}_SERVICE_PORT"] = _target(ports[0])
            for port in ports:
                if port.get("name"):
                    env[f"{prefix}_SERVICE_PORT_{_env_name(port['name'])}"] = _target(port)
        return env


def _env_name(name: str) -> str:
    return name.upper().replace("-", "_")


def _target(port: Obj) -> str:
    target = port.get("targetPort", port["port"])
    return str(target if isinstance(target, int) or str(target).isdigit() else port["port"])


_REFERENCE = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


def _expand(text: str, env: Mapping[str, str]) -> str:
    """Kubernetes' `$(VAR)` expansion: a defined variable is replaced, an undefined reference
    is kept as written, and `$$` escapes a dollar."""

    def replace(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        return env.get(match.group(1), match.group(0))

    return _REFERENCE.sub(replace, text)


def container_argv(declared: Obj, env: Mapping[str, str]) -> list[str]:
    command = declared.get("command") or []
    if not command:
        raise ContainerConfigError(
            "CreateContainerError",
            f"container {declared['name']} has no command: the kubelet in miniature runs "
            "commands on this machine and has no images to take an entrypoint from",
        )
    return [_expand(a, env) for a in [*command, *(declared.get("args") or [])]]


_LABEL_PATH = re.compile(r"metadata\.(labels|annotations)\['([^']+)'\]")


def _field(obj: Obj, path: str, name: str) -> str:
    meta, spec = obj["metadata"], obj["spec"]
    simple = {
        "metadata.name": meta["name"],
        "metadata.namespace": meta["namespace"],
        "metadata.uid": meta["uid"],
        "spec.nodeName": spec["nodeName"],
        "spec.serviceAccountName": spec.get("serviceAccountName", ""),
        "status.podIP": POD_IP,
        "status.podIPs": POD_IP,
        "status.hostIP": POD_IP,
    }
    if path in simple:
        return str(simple[path])
    match = _LABEL_PATH.fullmatch(path)
    if match:
        return str((meta.get(match.group(1)) or {}).get(match.group(2), ""))
    raise ContainerConfigError(
        "CreateContainerConfigError", f"env {name}: unsupported fieldRef {path!r}"
    )


def _key_of(
    values: Mapping[str, str], ref: Obj, optional: bool, kind: str, name: str
) -> str | None:
    if ref["key"] in values:
        return values[ref["key"]]
    if optional:
        return None
    raise ContainerConfigError(
        "CreateContainerConfigError",
        f"env {name}: couldn't find key {ref['key']} in {kind} {ref['name']}",
    )


def _resource(declared: Obj, ref: Obj, name: str) -> str:
    """resourceFieldRef as Kubernetes computes it: the quantity divided by the divisor,
    rounded up; an unset limit is reported as the node's allocatable, here unbounded."""
    kind, _, resource = ref["resource"].partition(".")
    resources = declared.get("resources") or {}
    value = (resources.get(kind) or {}).get(resource)
    if value is None and kind == "requests":
        value = (resources.get("limits") or {}).get(resource)
    if value is None:
        raise ContainerConfigError(
            "CreateContainerConfigError",
            f"env {name}: {ref['resource']} is not set on the container (the kubelet in "
            "miniature has no node allocatable to fall back on)",
        )
    divisor = parse_quantity(ref.get("divisor", "1"))
    return str(math.ceil(parse_quantity(value) / divisor))
