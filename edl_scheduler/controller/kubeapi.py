"""A thin JSON client of the Kubernetes API: paths, dicts and status codes.

Why this exists: the controller writes a handful of object kinds as plain manifests (dicts),
and needs the HTTP status of each answer (409 already exists, 404 gone, 429 and 5xx try
later). The kubernetes package's typed methods convert every body to and from its models,
which costs time on the hot path and hides the status. This module reuses the package's
configuration and connection pool (kubeconfig or in-cluster credentials) and sends JSON as is.

What must stay true: only ``actuating`` (objects of jobs), ``leading`` (the Lease) and
``reserving`` (the planner's reservations' ConfigMap) use this; every request has a
timeout; a failed request raises ``KubeError`` carrying the status.
"""

from __future__ import annotations

import json
import random
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote, urlencode

import kubernetes

MERGE_PATCH = "application/merge-patch+json"
JSON = "application/json"


class KubeError(RuntimeError):
    """The API server refused a request, or did not answer."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status

    @property
    def transient(self) -> bool:
        """Worth retrying later: conflict, throttled, server error or no answer."""
        return self.status in (0, 409, 429) or self.status >= 500


class Kube:
    """Requests to one API server, as the given ``ApiClient`` is configured."""

    def __init__(self, api_client: kubernetes.client.ApiClient, timeout_s: float = 10.0) -> None:
        self.api_client = api_client
        self.timeout_s = timeout_s

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        query: dict[str, str] | None = None,
        content_type: str = JSON,
    ) -> Any:
        """One request; the decoded JSON answer (None when empty)."""
        if query:
            path = f"{path}?{urlencode(query)}"
        headers = {"Accept": JSON}
        if body is not None:
            headers["Content-Type"] = content_type
        serialized = self.api_client.param_serialize(
            method, path, header_params=headers, body=body, auth_settings=["BearerToken"]
        )
        try:
            response = self.api_client.call_api(*serialized, _request_timeout=self.timeout_s)
            data: bytes = response.read()  # type: ignore[no-untyped-call]
        except kubernetes.client.ApiException as error:
            raise KubeError(int(error.status or 0), str(error.reason)) from None
        except Exception as error:
            raise KubeError(0, f"{type(error).__name__}: {error}") from None
        if response.status >= 300:
            try:
                message = json.loads(data).get("message", "")
            except ValueError:
                message = data[:200].decode(errors="replace")
            raise KubeError(response.status, f"{method} {path}: {message}")
        return json.loads(data) if data else None


def namespaced(ns: str, plural: str, name: str | None = None, *, group: str = "") -> str:
    """The path of a namespaced collection or object; group '' is the core API."""
    base = f"/apis/{group}" if group else "/api/v1"
    path = f"{base}/namespaces/{quote(ns)}/{plural}"
    return f"{path}/{quote(name)}" if name else path


#: The group/version ("" for the core API) and plural of each kind of object the controller
#: creates from a manifest besides pods.
_COLLECTIONS = {
    "Secret": ("", "secrets"),
    "Service": ("", "services"),
    "ConfigMap": ("", "configmaps"),
    "NetworkPolicy": ("networking.k8s.io/v1", "networkpolicies"),
}


def collection_of(manifest: Mapping[str, Any]) -> str:
    """The path of the collection a manifest of ``_COLLECTIONS``' kinds is created in."""
    group, plural = _COLLECTIONS[manifest["kind"]]
    return namespaced(manifest["metadata"]["namespace"], plural, group=group)


class FaultyKube(Kube):
    """Chaos testing: a share of requests fails the way a busy API server fails them.

    Each request, with probability ``rate``, gets a 409 conflict, a 429 throttle or a 5xx
    (before reaching the server), or is sent and then answered with a 5xx (the write happened,
    the answer was lost: the case that tests idempotence). Seeded, so a run can be repeated.
    """

    def __init__(self, api_client: kubernetes.client.ApiClient, rate: float, seed: int = 0) -> None:
        super().__init__(api_client)
        self.rate = rate
        self.random = random.Random(seed)
        self.injected = 0

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        query: dict[str, str] | None = None,
        content_type: str = JSON,
    ) -> Any:
        roll = self.random.random()
        if roll >= self.rate:
            return super().request(method, path, body, query=query, content_type=content_type)
        self.injected += 1
        kind = self.random.choice(("conflict", "throttled", "unavailable", "lost-answer"))
        if kind == "lost-answer":
            super().request(method, path, body, query=query, content_type=content_type)
            raise KubeError(504, f"{method} {path}: injected: answer lost")
        status = {"conflict": 409, "throttled": 429, "unavailable": 503}[kind]
        raise KubeError(status, f"{method} {path}: injected {kind}")
