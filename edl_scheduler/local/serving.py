"""The local service: the control loop in a thread, and an HTTP endpoint on a unix socket.

Why HTTP (FastAPI on uvicorn) on a unix socket: the verbs are plain request/response on
small JSON documents, the socket's mode and its peer's credentials keep other users of
the machine out without a token (``guarding``), no TCP port can collide, and FastAPI
validates requests with the same pydantic models the SDK reads. gRPC would need generated
stubs for no gain here.

What must stay true:
- Bad input gets a 4xx answer naming the problem and the fix; the service and every other
  job carry on (no request handler can raise past FastAPI).
- One service per home directory (an exclusive lock on ``service.lock``).
- Only processes of the service's own uid are answered; its home, socket and files are
  its owner's only (``guarding``).
- Stopping the service either stops every job's processes (the jobs stay in the database
  and are started again next time) or, with ``keep_running``, leaves them for the next
  service to adopt; a crash is the second case.
"""

from __future__ import annotations

import fcntl
import logging
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import uvicorn
from fastapi import FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from uvicorn.protocols.http.auto import AutoHTTPProtocol

from edl_scheduler.api import TrainingJobError, load_training_job
from edl_scheduler.local.config import LocalConfig
from edl_scheduler.local.controlling import LocalCluster, LocalError
from edl_scheduler.local.guarding import bind_socket, owner_only, prepare_home
from edl_scheduler.local.processes import ProcessSupervisor, UnknownProcess
from edl_scheduler.local.storing import JobRow, Store
from edl_scheduler.local.wire import (
    ClusterView,
    EventView,
    JobDetails,
    JobSummary,
    LogChunk,
    ResizeView,
    ScaleRequest,
    ShutdownRequest,
    SubmitRequest,
    WorkerView,
    batch_of,
    progress_of,
)

LOG = logging.getLogger("edl.local")
SOCKET_NAME = "edl.sock"
LOG_CHUNK_MAX = 256 * 1024


def summary_of(row: JobRow, now: float) -> JobSummary:
    job = row.job
    throughput = [t.model_dump(by_alias=True) for t in job.status.throughput]
    done, speed = progress_of(job.status.progress, throughput, job.status.replicas)
    return JobSummary(
        name=job.metadata.name,
        namespace=job.metadata.namespace,
        queue=job.metadata.namespace,
        priority=job.spec.priority or 0,
        min_replicas=job.spec.min_replicas,
        max_replicas=job.spec.max_replicas,
        replicas=job.status.replicas,
        phase=job.status.phase.value,
        age_s=max(0.0, now - row.created),
        message=job.status.message,
        restarts=job.status.restarts,
        done=done,
        samples_per_second=speed,
        **batch_of(
            None if job.status.batch is None else job.status.batch.model_dump(by_alias=True)
        ),
    )


class LocalService:
    """The endpoint and the loop around one ``LocalCluster``."""

    def __init__(self, config: LocalConfig) -> None:
        self.config = config
        # Before anything is written: every file is this user's only (``guarding``).
        os.umask(0o077)
        prepare_home(config.home)
        self.store = Store(config.home / "state.db")
        self.supervisor = ProcessSupervisor()
        self.cluster = LocalCluster(config, self.store, self.supervisor)
        self.stopping = threading.Event()
        self.keep_running = False
        self.server: uvicorn.Server | None = None
        self.loop_thread = threading.Thread(target=self.looping, name="edl-loop", daemon=True)
        self.app = self.routes()

    # -- the loop --------------------------------------------------------------------------

    def looping(self) -> None:
        while not self.stopping.is_set():
            began = time.monotonic()
            try:
                self.cluster.cycle()
            except Exception:  # a bug in one cycle must not end the service
                LOG.exception(
                    "PLANNING STOPPED for every job by this error; the next cycle, in %.1f s, "
                    "tries again",
                    self.config.period_s,
                )
            self.stopping.wait(max(0.05, self.config.period_s - (time.monotonic() - began)))

    # -- the endpoint ----------------------------------------------------------------------

    def routes(self) -> FastAPI:
        app = FastAPI(title="EDL local backend", version="1")
        cluster = self.cluster

        @app.exception_handler(LocalError)
        def _local_error(_: Request, error: LocalError) -> JSONResponse:
            return JSONResponse({"detail": str(error)}, status_code=error.kind.value)

        @app.exception_handler(RequestValidationError)
        def _request_error(_: Request, error: RequestValidationError) -> JSONResponse:
            # Said in words, without echoing the input: FastAPI's own answer repeats it,
            # and an input such as Infinity cannot be written back as JSON (a 500).
            found = "; ".join(
                f"{'.'.join(str(p) for p in e.get('loc', ())[1:]) or 'the body'}: {e.get('msg')}"
                for e in error.errors()[:5]
            )
            return JSONResponse(
                {"detail": f"invalid request ({found}): fix it as the API's schema says"},
                status_code=422,
            )

        @app.exception_handler(TrainingJobError)
        def _job_error(_: Request, error: TrainingJobError) -> JSONResponse:
            return JSONResponse({"detail": str(error)}, status_code=422)

        @app.get("/healthz")
        def healthz() -> dict[str, Any]:
            return {"ok": True, "pid": os.getpid(), "slots": self.config.slots}

        @app.post("/jobs")
        def submit(request: SubmitRequest) -> JobSummary:
            job = load_training_job(request.manifest)
            cluster.submit(job, request.workdir)
            return summary_of(cluster.get(job.key), time.time())

        @app.get("/jobs")
        def listing() -> list[JobSummary]:
            now = time.time()
            return [summary_of(r, now) for r in self.store.jobs()]

        @app.get("/jobs/{namespace}/{name}")
        def describe(namespace: str, name: str) -> JobDetails:
            return self.details(f"{namespace}/{name}")

        @app.post("/jobs/{namespace}/{name}/scale")
        def scale(namespace: str, name: str, request: ScaleRequest) -> JobSummary:
            key = f"{namespace}/{name}"
            cluster.scale(key, request.min_replicas, request.max_replicas)
            return summary_of(cluster.get(key), time.time())

        @app.post("/jobs/{namespace}/{name}/suspend")
        def suspend(namespace: str, name: str) -> JobSummary:
            key = f"{namespace}/{name}"
            cluster.set_suspended(key, True)
            return summary_of(cluster.get(key), time.time())

        @app.post("/jobs/{namespace}/{name}/resume")
        def resume(namespace: str, name: str) -> JobSummary:
            key = f"{namespace}/{name}"
            cluster.set_suspended(key, False)
            return summary_of(cluster.get(key), time.time())

        @app.delete("/jobs/{namespace}/{name}")
        def delete(namespace: str, name: str) -> dict[str, str]:
            key = f"{namespace}/{name}"
            cluster.delete(key)
            return {"deleted": key}

        @app.get("/jobs/{namespace}/{name}/logs")
        def logs(
            namespace: str,
            name: str,
            worker: str | None = None,
            offset: int | None = None,
            tail: int = Query(default=0, ge=0),
        ) -> LogChunk:
            path = cluster.log_path(f"{namespace}/{name}", worker)
            return read_log(path, offset, tail)

        @app.get("/cluster")
        def top() -> ClusterView:
            return self.cluster_view()

        @app.post("/shutdown")
        def shutdown(request: ShutdownRequest) -> dict[str, bool]:
            self.keep_running = request.keep_running
            if self.server is not None:
                self.server.should_exit = True
            return {"stopping": True}

        return app

    def details(self, key: str) -> JobDetails:
        row = self.cluster.get(key)
        workers = []
        for w in self.store.replicas(key):
            try:
                state = self.supervisor.status(w.name).state.value
            except UnknownProcess:
                state = "Unknown"
            workers.append(
                WorkerView(
                    name=w.name,
                    pid=w.pid,
                    node="local",
                    slots=list(w.slots),
                    draining=w.draining,
                    started=w.started,
                    state=state,
                    role=w.role.value,
                )
            )
        return JobDetails(
            summary=summary_of(row, time.time()),
            manifest=row.job.to_dict(),
            workers=workers,
            events=[
                EventView(time=e.time, type=e.type, reason=e.reason, message=e.message)
                for e in self.store.events(key)
            ],
            resizes=[
                ResizeView(
                    time=r.time,
                    from_replicas=r.from_replicas,
                    to_replicas=r.to_replicas,
                    reason=r.reason,
                )
                for r in self.store.resizes(key)
            ],
            progress=dict(row.job.status.progress),
            coordinator_pid=row.coordinator_pid,
            logs=self.cluster.log_names(key),
        )

    def cluster_view(self) -> ClusterView:
        now = time.time()
        owner = {s: w.job for w in self.store.workers() for s in w.slots}
        return ClusterView(
            backend="local",
            slots=self.config.slots,
            gpus=self.config.gpus,
            used=len(owner),
            jobs=[summary_of(r, now) for r in self.store.jobs()],
            slot_owner=owner,
            policy=self.config.policy.name,
            pid=os.getpid(),
        )

    # -- running ---------------------------------------------------------------------------

    def serve(self) -> None:
        """Run until asked to stop (``/shutdown``, SIGTERM or SIGINT)."""
        with exclusive(self.config.home / "service.lock"):
            socket_path = self.config.home / SOCKET_NAME
            sock = bind_socket(socket_path)
            (self.config.home / "service.pid").write_text(str(os.getpid()))
            self.cluster.recover()
            self.loop_thread.start()
            config = uvicorn.Config(
                self.app,
                http=owner_only(AutoHTTPProtocol, os.geteuid()),
                log_level="warning",
                access_log=False,
            )
            self.server = uvicorn.Server(config)
            try:
                self.server.run(sockets=[sock])
            finally:
                sock.close()
                self.stopping.set()
                self.loop_thread.join(timeout=30)
                if self.keep_running:
                    self.cluster.release_all()
                else:
                    self.supervisor.close(grace_s=10)
                    for row in self.store.jobs():
                        self.store.set_coordinator(row.key, None, None)
                        for w in self.store.replicas(row.key):
                            self.store.remove_worker(w.name)
                self.store.close()
                socket_path.unlink(missing_ok=True)
                (self.config.home / "service.pid").unlink(missing_ok=True)


class ServiceBusy(RuntimeError):
    """Another local service already runs on this home directory."""


@contextmanager
def exclusive(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ServiceBusy(
                f"a local service already runs on {path.parent}: use it, or stop it with "
                "`edlctl local stop`"
            ) from None
        yield


def read_log(path: Path, offset: int | None, tail: int) -> LogChunk:
    """A chunk of a log: from ``offset`` (following), or its last ``tail`` lines."""
    size = path.stat().st_size
    with path.open("rb") as f:
        if offset is not None:
            start = min(max(0, offset), size)
        elif tail:
            start = max(0, size - LOG_CHUNK_MAX)
        else:
            start = max(0, size - LOG_CHUNK_MAX)
        f.seek(start)
        data = f.read(LOG_CHUNK_MAX)
    text = data.decode(errors="replace")
    if offset is None and tail:
        text = "\n".join(text.splitlines()[-tail:]) + ("\n" if text.endswith("\n") else "")
    return LogChunk(worker=path.stem, text=text, offset=start + len(data))
