"""The local backend through its endpoint (HTTP on the service's unix socket).

``LocalClient(home)`` talks to the service of that home directory; ``start_service`` and
``stop_service`` run it in the background. Every HTTP error becomes an ``EdlError`` with
the service's own message (which names the field and the fix).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, TypeVar

import httpx
from pydantic import BaseModel

from edl_scheduler.local.config import DEFAULT_HOME
from edl_scheduler.local.guarding import HomeError, prepare_home
from edl_scheduler.local.serving import SOCKET_NAME
from edl_scheduler.local.wire import (
    ClusterView,
    JobDetails,
    JobSummary,
    LogChunk,
    ScaleRequest,
    ShutdownRequest,
    SubmitRequest,
)
from edl_scheduler.sdk.base import split_name
from edl_scheduler.sdk.errors import Conflict, EdlError, InvalidRequest, NotFound, Unreachable

M = TypeVar("M", bound=BaseModel)

_ERRORS: dict[int, type[EdlError]] = {404: NotFound, 409: Conflict, 422: InvalidRequest}


class LocalClient:
    """The verbs of ``sdk.base.Client`` against the local service of ``home``."""

    backend = "local"

    def __init__(
        self, home: Path | None = None, timeout_s: float = 30.0, namespace: str = "default"
    ) -> None:
        self.namespace = namespace
        self.home = (home or DEFAULT_HOME).expanduser().resolve()
        self.socket = self.home / SOCKET_NAME
        self.http = httpx.Client(
            transport=httpx.HTTPTransport(uds=str(self.socket)),
            base_url="http://edl-local",
            timeout=timeout_s,
        )

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> LocalClient:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def _call(self, method: str, path: str, body: BaseModel | None = None, **params: Any) -> Any:
        try:
            response = self.http.request(
                method,
                path,
                json=body.model_dump() if body is not None else None,
                params={k: v for k, v in params.items() if v is not None},
            )
        except (httpx.ConnectError, httpx.RemoteProtocolError, FileNotFoundError) as error:
            raise Unreachable(
                f"the local service of {self.home} is not running ({error}): start it with "
                "`edlctl local start`"
            ) from None
        except httpx.TimeoutException:
            raise Unreachable(f"the local service of {self.home} did not answer in time") from None
        if response.status_code >= 400:
            try:
                detail = response.json().get("detail", response.text)
            except ValueError:
                detail = response.text
            if isinstance(detail, list):  # FastAPI's own validation errors
                detail = "; ".join(
                    f"{'.'.join(str(p) for p in d.get('loc', ()))}: {d.get('msg')}" for d in detail
                )
            raise _ERRORS.get(response.status_code, EdlError)(str(detail))
        return response.json()

    def _model(self, model: type[M], method: str, path: str, body: Any = None, **kw: Any) -> M:
        return model.model_validate(self._call(method, path, body, **kw))

    def _path(self, name: str) -> str:
        namespace, short = split_name(name, self.namespace)
        return f"/jobs/{namespace}/{short}"

    # -- verbs -----------------------------------------------------------------------------

    def health(self) -> dict[str, Any]:
        result: dict[str, Any] = self._call("GET", "/healthz")
        return result

    def submit(self, manifest: str, workdir: Path | None = None) -> JobSummary:
        request = SubmitRequest(manifest=manifest, workdir=str(workdir or Path.cwd()))
        return self._model(JobSummary, "POST", "/jobs", request)

    def list(self) -> list[JobSummary]:
        return [JobSummary.model_validate(j) for j in self._call("GET", "/jobs")]

    def describe(self, name: str) -> JobDetails:
        return self._model(JobDetails, "GET", self._path(name))

    def scale(
        self, name: str, min_replicas: int | None = None, max_replicas: int | None = None
    ) -> JobSummary:
        body = ScaleRequest(min_replicas=min_replicas, max_replicas=max_replicas)
        return self._model(JobSummary, "POST", self._path(name) + "/scale", body)

    def suspend(self, name: str) -> JobSummary:
        return self._model(JobSummary, "POST", self._path(name) + "/suspend")

    def resume(self, name: str) -> JobSummary:
        return self._model(JobSummary, "POST", self._path(name) + "/resume")

    def delete(self, name: str) -> None:
        self._call("DELETE", self._path(name))

    def logs(
        self, name: str, worker: str | None = None, tail: int = 0, offset: int | None = None
    ) -> LogChunk:
        return self._model(
            LogChunk, "GET", self._path(name) + "/logs", worker=worker, tail=tail, offset=offset
        )

    def top(self) -> ClusterView:
        return self._model(ClusterView, "GET", "/cluster")

    def shutdown(self, keep_running: bool = False) -> None:
        self._call("POST", "/shutdown", ShutdownRequest(keep_running=keep_running))


def service_running(home: Path | None = None) -> bool:
    with LocalClient(home, timeout_s=5.0) as client:
        try:
            client.health()
        except EdlError:
            return False
        return True


def start_service(
    home: Path | None = None,
    slots: int | None = None,
    policy: Path | None = None,
    period_s: float = 0.5,
    timeout_s: float = 60.0,
) -> LocalClient:
    """Start the local service in the background (if it is not running) and connect."""
    client = LocalClient(home)
    if service_running(client.home):
        return client
    try:
        prepare_home(client.home)
    except HomeError as error:
        raise EdlError(str(error)) from None
    argv = [sys.executable, "-m", "edl_scheduler.local", "--home", str(client.home)]
    argv += ["--period", str(period_s)]
    if slots is not None:
        argv += ["--slots", str(slots)]
    if policy is not None:
        argv += ["--policy", str(policy)]
    log = client.home / "service.log"
    with os.fdopen(os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600), "ab") as out:
        process = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            lines = log.read_text(errors="replace").strip().splitlines()
            raise EdlError(
                f"the local service exited at start: {lines[-1] if lines else 'no output'} "
                f"(log: {log})"
            )
        if service_running(client.home):
            return client
        time.sleep(0.1)
    raise Unreachable(f"the local service did not answer within {timeout_s:.0f} s (log: {log})")


def stop_service(
    home: Path | None = None, keep_running: bool = False, timeout_s: float = 60.0
) -> bool:
    """Ask the service to stop and wait until it has; False if it was not running."""
    with LocalClient(home) as client:
        try:
            client.shutdown(keep_running)
        except Unreachable:
            return False
        pid_file = client.home / "service.pid"
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and pid_file.exists():
            time.sleep(0.1)
        return True
