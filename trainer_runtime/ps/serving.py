"""The parameter server's gRPC service: a thin executor around one `Partition`.

Each call is authenticated (a credential of the job), then runs one partition method under one lock;
waits (a pull for a step not applied yet, a seal of a step still missing contributions, a
call of a generation whose layout is not adopted yet) are bounded long polls on one
condition. Pushes stream raw chunks straight into the step's buffer (`np.frombuffer` over
the received bytes, then one in-place add); pulls stream the range as raw chunks (one copy
of the numpy slice each); the headers ride in binary metadata. Row pushes and pulls
(`PushRows`, `PullRows`: the rows of an embedding table a batch touches) carry their row
numbers as raw int64 bytes and the rows' elements as raw chunks. Snapshots are
copied under the lock and written by a background thread, so a step's apply never waits for
the disk.

What must stay true: every wait is bounded; an unauthenticated call changes nothing; a call
of a fenced generation is refused with FAILED_PRECONDITION. The server also answers the
standard gRPC health service (``protocol.health``) without a token: SERVING until it stops.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from typing import Any

import grpc
import numpy as np

from trainer_runtime.protocol.checks import caller, name_problem
from trainer_runtime.protocol.credentials import Verifier
from trainer_runtime.protocol.health import HealthService
from trainer_runtime.protocol.parameter_server import (
    CHANNEL_OPTIONS,
    PS_METHODS,
    PS_SERVICE,
    PULL_HEADER,
    PUSH_HEADER,
    ROWS_HEADER,
    Shape,
    ps,
)
from trainer_runtime.protocol.statuses import refusing
from trainer_runtime.protocol.tls import JobTls, listening
from trainer_runtime.ps.layout import Table
from trainer_runtime.ps.partition import (
    Array,
    Partition,
    PartitionError,
    PartitionStatus,
    Readiness,
    StaleGeneration,
)
from trainer_runtime.ps.snapshots import SnapshotDirectory

LOG = logging.getLogger(__name__)
LONGEST_WAIT_S = 30.0
CHUNK_BYTES = 1024 * 1024


def status_message(status: PartitionStatus) -> Any:
    return ps.Status(
        generation=status.generation,
        holding=ps.HOLDING_RANGE if status.holding else ps.HOLDING_NOTHING,
        start=status.start,
        stop=status.stop,
        watermark=status.watermark,
        complete_steps=list(status.complete_steps),
        size=status.size,
        dtype=status.dtype,
        adopted=status.adopted,
    )


#: Tries of one snapshot before the server gives up and stops (a disk full for longer than
#: a few tenths of a second is not going to clear by itself).
SNAPSHOT_TRIES = 3
SNAPSHOT_PAUSE_S = 0.1


class SnapshotWriter:
    """Writes snapshot copies in the background, in order; `flushing` waits for the queue.

    A write that fails is tried again (``SNAPSHOT_TRIES``); one that keeps failing sets
    ``failed``, and the server stops with a non-zero exit (``__main__``), to be replaced: the
    job then rolls back to its last complete snapshot, as after a server's crash, rather than
    train on with a snapshot it will need missing. Later snapshots are not written."""

    def __init__(self, directory: SnapshotDirectory) -> None:
        self.directory = directory
        self.queue: queue.Queue[tuple[int, int, int, Array, Array, int] | None] = queue.Queue(2)
        self.failure: BaseException | None = None
        self.failed = threading.Event()
        self.thread = threading.Thread(target=self.writing, name="ps-snapshots", daemon=True)
        self.thread.start()

    def enqueue(
        self, step: int, start: int, stop: int, params: Array, velocity: Array, size: int
    ) -> None:
        self.queue.put((step, start, stop, params, velocity, size))

    def writing(self) -> None:
        while (item := self.queue.get()) is not None:
            try:
                if not self.failed.is_set():
                    self.trying(item)
            finally:
                self.queue.task_done()
        self.queue.task_done()

    def trying(self, item: tuple[int, int, int, Array, Array, int]) -> None:
        for attempt in range(SNAPSHOT_TRIES):
            try:
                self.directory.writing(*item)
                return
            except Exception as error:  # a full disk must not kill the server's threads
                if attempt + 1 < SNAPSHOT_TRIES:
                    LOG.warning("snapshot of step %d failed (%s); trying again", item[0], error)
                    time.sleep(SNAPSHOT_PAUSE_S * (attempt + 1))
                    continue
                LOG.critical(
                    "cannot write the snapshot of step %d (%s): stopping, to be replaced; "
                    "the job rolls back to its last complete snapshot",
                    item[0],
                    error,
                )
                self.failure = error
                self.failed.set()

    def flushing(self) -> None:
        self.queue.join()

    def closing(self) -> None:
        self.queue.put(None)
        self.thread.join(timeout=10)


class ParameterService:
    """The handlers of the PS API over one partition, one lock and one snapshot directory."""

    def __init__(
        self,
        directory: SnapshotDirectory,
        verifier: Verifier,
        on_release: Callable[[], None] = lambda: None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.directory = directory
        self.verifier = verifier
        self.on_release = on_release
        self.clock = clock
        self.writer = SnapshotWriter(directory)
        self.partition = Partition(on_snapshot=self.writer.enqueue)
        self.changed = threading.Condition()
        self.in_flight = 0  # pushes and pulls being served
        self.last_call = clock()

    # ----- plumbing -----

    def authorizing(self, context: grpc.ServicerContext) -> None:
        # Any process of the job may call a server: workers push and pull, the servers
        # move partitions between themselves; each acts on the partition, not as a worker.
        if caller(context.invocation_metadata(), self.verifier) is None:
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "wrong or missing credential")

    def guarded(self, name: str) -> Callable[[Any, grpc.ServicerContext], Any]:
        handler: Callable[[Any, grpc.ServicerContext], Any] = getattr(self, name)

        def calling(request: Any, context: grpc.ServicerContext) -> Any:
            self.authorizing(context)
            problem = name_problem(request)
            if problem is not None:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, problem)
            with refusing(context):
                return handler(request, context)

        return calling

    def streaming_guarded(self, name: str) -> Callable[[Any, grpc.ServicerContext], Any]:
        handler: Callable[[Any, grpc.ServicerContext], Iterator[Any]] = getattr(self, name)

        def calling(request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
            self.authorizing(context)
            problem = name_problem(request)
            if problem is not None:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, problem)
            with refusing(context):
                yield from handler(request, context)

        return calling

    def handlers(self) -> grpc.GenericRpcHandler:
        table: dict[str, Any] = {}
        for name, method in PS_METHODS.items():
            codec = method.server_codec()
            if method.shape is Shape.STREAMS_REQUESTS:
                table[name] = grpc.stream_unary_rpc_method_handler(self.guarded(name), **codec)
            elif method.shape is Shape.STREAMS_REPLIES:
                table[name] = grpc.unary_stream_rpc_method_handler(
                    self.streaming_guarded(name), **codec
                )
            else:
                table[name] = grpc.unary_unary_rpc_method_handler(self.guarded(name), **codec)
        return grpc.method_handlers_generic_handler(PS_SERVICE, table)

    def awaiting(
        self, generation: int, timeout_s: float, condition: Callable[[], bool] = lambda: True
    ) -> bool:
        """Wait (holding `changed`) until generation `generation` is served and `condition`
        holds; False when the bounded wait ran out. A fenced generation raises at once."""
        deadline = self.clock() + min(max(timeout_s, 0.0), LONGEST_WAIT_S)
        while True:
            state = self.partition.readiness(generation)
            if state is Readiness.STALE:
                self.partition.serving(generation)
            if state is Readiness.SERVING and condition():
                return True
            remaining = deadline - self.clock()
            if remaining <= 0:
                return False
            self.changed.wait(remaining)

    # ----- workers -----

    def calling(self, entering: bool) -> None:
        with self.changed:
            self.in_flight += 1 if entering else -1
            self.last_call = self.clock()

    def awaiting_quiet(self, idle_s: float, limit_s: float) -> bool:
        """Wait until no push or pull was served for `idle_s` (bounded by `limit_s`): once
        the job finished, workers may still be pulling the final parameters."""
        deadline = self.clock() + limit_s
        while self.clock() < deadline:
            with self.changed:
                if self.in_flight == 0 and self.clock() - self.last_call >= idle_s:
                    return True
            time.sleep(0.05)
        return False

    def Push(self, requests: Iterator[bytes], context: grpc.ServicerContext) -> Any:
        self.calling(True)
        try:
            return self.pushing(requests, context)
        finally:
            self.calling(False)

    def Pull(self, request: Any, context: grpc.ServicerContext) -> Iterator[bytes]:
        self.calling(True)
        try:
            yield from self.pulling(request, context)
        finally:
            self.calling(False)

    def PushRows(self, requests: Iterator[bytes], context: grpc.ServicerContext) -> Any:
        self.calling(True)
        try:
            return self.pushing_rows(requests, context)
        finally:
            self.calling(False)

    def PullRows(self, request: Any, context: grpc.ServicerContext) -> Iterator[bytes]:
        self.calling(True)
        try:
            yield from self.pulling_rows(request, context)
        finally:
            self.calling(False)

    def opening(self, context: grpc.ServicerContext, key: str, message: Any) -> Any:
        """The push's header (`message` parsed from metadata `key`), once its generation is
        served (a bounded wait)."""
        found = dict(context.invocation_metadata()).get(key)
        if not isinstance(found, bytes):
            raise PartitionError(f"a push needs the {key} metadata")
        header = message.FromString(found)
        with self.changed:
            if not self.awaiting(header.generation, 5.0):
                self.partition.serving(header.generation)
        return header

    def replying(self, step: int) -> Any:
        """Under `changed`: whether the step is complete here, waking its sealers if so."""
        complete = self.partition.complete(step)
        if complete:
            self.changed.notify_all()
        return ps.PushReply(complete=complete)

    def pushing(self, requests: Iterator[bytes], context: grpc.ServicerContext) -> Any:
        header = self.opening(context, PUSH_HEADER, ps.PushHeader)
        with self.changed:
            itemsize = np.dtype(self.partition.dtype).itemsize
        offset = header.offset
        for chunk in requests:
            with self.changed:
                self.partition.serving(header.generation)
                self.partition.adding(
                    header.step, header.contributor, header.contributors, offset, chunk
                )
            offset += len(chunk) // itemsize
        with self.changed:
            return self.replying(header.step)

    def pushing_rows(self, requests: Iterator[bytes], context: grpc.ServicerContext) -> Any:
        header = self.opening(context, ROWS_HEADER, ps.RowsHeader)
        numbers = next(requests, b"")
        data = bytearray().join(requests)  # writable: the step scales it in place
        with self.changed:
            self.partition.serving(header.generation)
            self.partition.adding_rows(
                header.step,
                header.contributor,
                header.contributors,
                header.start,
                header.stop,
                numbers,
                header.rows,
                data,
            )
            return self.replying(header.step)

    def ready_at(self, request: Any) -> Any:
        """Under `changed`: wait (bounded) for the pull's step; the PullHeader to send."""
        ready = self.awaiting(
            request.generation,
            request.timeout_s,
            lambda: self.partition.watermark >= request.at_least,
        )
        if not ready:
            self.partition.serving(request.generation)  # not adopted yet: UNAVAILABLE
        return ps.PullHeader(ready=ready, watermark=self.partition.watermark)

    def pulling(self, request: Any, context: grpc.ServicerContext) -> Iterator[bytes]:
        with self.changed:
            header = self.ready_at(request)
            start = max(request.start, self.partition.start)
            stop = min(request.stop, self.partition.stop) if request.stop else self.partition.stop
            itemsize = np.dtype(self.partition.dtype).itemsize
        context.send_initial_metadata(((PULL_HEADER, header.SerializeToString()),))
        if not header.ready:
            return
        step = max(1, CHUNK_BYTES // itemsize)
        for offset in range(start, stop, step):
            with self.changed:
                self.partition.serving(request.generation)
                data = self.partition.reading(offset, min(stop, offset + step)).tobytes()
            yield data

    def pulling_rows(self, request: Any, context: grpc.ServicerContext) -> Iterator[bytes]:
        with self.changed:
            header = self.ready_at(request)
            rows = None
            if header.ready:  # a copy, taken under the lock: a later apply cannot tear it
                rows = self.partition.reading_rows(request.start, request.stop, request.rows)
        context.send_initial_metadata(((PULL_HEADER, header.SerializeToString()),))
        if rows is None or not rows.size:
            return
        step = max(1, CHUNK_BYTES // (rows.itemsize * rows.shape[1]))
        for first in range(0, rows.shape[0], step):
            yield rows[first : first + step].tobytes()

    def Seal(self, request: Any, context: grpc.ServicerContext) -> Any:
        with self.changed:
            done = self.awaiting(
                request.generation, request.timeout_s, lambda: self.partition.complete(request.step)
            )
            return ps.StepReply(done=done, watermark=self.partition.watermark)

    def Apply(self, request: Any, context: grpc.ServicerContext) -> Any:
        with self.changed:
            self.partition.serving(request.generation)
            done = self.partition.deciding(request.step)
            self.changed.notify_all()
            return ps.StepReply(done=done, watermark=self.partition.watermark)

    # ----- the leader -----

    def Fence(self, request: Any, context: grpc.ServicerContext) -> Any:
        with self.changed:
            status = self.partition.fencing(request.generation)
            self.changed.notify_all()
            return status_message(status)

    def Settle(self, request: Any, context: grpc.ServicerContext) -> Any:
        with self.changed:
            if request.generation < self.partition.generation:
                raise StaleGeneration(f"generation {request.generation} is fenced")
            status = self.partition.settling(request.through)
            self.changed.notify_all()
            return status_message(status)

    def Snapshot(self, request: Any, context: grpc.ServicerContext) -> Any:
        with self.changed:
            if request.generation < self.partition.generation:
                raise StaleGeneration(f"generation {request.generation} is fenced")
            part = self.partition
            if not part.holding:
                raise PartitionError("this server holds no partition to snapshot")
            copy = (
                part.watermark,
                part.start,
                part.stop,
                part.params.copy(),
                part.velocity.copy(),
                part.size,
            )
            status = part.status()
        self.writer.flushing()
        self.directory.writing(*copy)
        return status_message(status)

    def Adopt(self, request: Any, context: grpc.ServicerContext) -> Any:
        state = None
        if request.from_snapshot:
            state = self.directory.reading(request.step, request.start, request.stop, request.dtype)
        with self.changed:
            status = self.partition.adopting(
                request.generation,
                request.start,
                request.stop,
                request.size,
                request.dtype,
                request.lr,
                request.momentum,
                request.step,
                request.snapshot_every,
                state,
                tuple(Table(t.start, t.rows, t.row_length) for t in request.tables),
            )
            self.changed.notify_all()
            return status_message(status)

    def Release(self, request: Any, context: grpc.ServicerContext) -> Any:
        with self.changed:
            if request.generation < self.partition.generation:
                raise StaleGeneration(f"generation {request.generation} is fenced")
            self.partition.holding = False
            self.partition.generation = request.generation
        LOG.info("released by the leader of generation %d", request.generation)
        self.on_release()
        return ps.Empty()


class ParameterServer:
    """A running PS: the gRPC server over its service."""

    def __init__(
        self,
        service: ParameterService,
        host: str = "127.0.0.1",
        port: int = 0,
        threads: int = 32,
        tls: JobTls | None = None,
    ) -> None:
        self.service = service
        self.server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=threads, thread_name_prefix="ps"),
            options=list(CHANNEL_OPTIONS),
            maximum_concurrent_rpcs=threads * 4,
        )
        self.server.add_generic_rpc_handlers((service.handlers(),))
        #: Set once the server shuts down: the health service answers NOT_SERVING from then.
        self.stopping = threading.Event()
        self.health = HealthService(self.stopping)
        self.health.register(self.server)
        self.port: int = listening(self.server, f"{host}:{port}", tls)
        if self.port == 0:
            raise OSError(f"cannot listen on {host}:{port}")
        self.address = f"{host}:{self.port}"

    def start(self) -> ParameterServer:
        self.server.start()
        return self

    def stop(self, grace_s: float = 1.0) -> None:
        self.stopping.set()
        with self.service.changed:
            self.service.changed.notify_all()
        self.server.stop(grace_s).wait(grace_s + 1.0)
        self.service.writer.closing()
