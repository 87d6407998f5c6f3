"""The coordinator's gRPC server: a thin executor around `CoordinatorState`.

Each call is authenticated (the caller's credential in the `x-edl-token` metadata, checked
with the job's public key) and allowed (a worker acts only for itself, only the controller
resizes: ``protocol/checks``), then runs one state method under one lock; a call that
changed the state persists it before it answers, so whatever a worker was told survives a
coordinator restart. A change whose save fails for good is undone (the state is read back
from the last saved document) before the lock is let go, so no caller ever sees a state the
disk does not hold. A ticker thread expires silent
workers and opens generations when the join window closes. A worker's `Watch` stream is its
liveness: when the stream drops (the process died), the worker departs at once and its
leases go back to todo.

Every reply a worker acts on names this process's incarnation; a lease or commit that names
another is refused (FAILED_PRECONDITION with the trailing metadata ``x-edl-refusal:
incarnation``), and the worker registers again with its report (``recovering.py``). While a
state loaded from a document recovers, no generation is given (``AwaitGeneration`` waits)
and no shard is leased. Nor is one given between a departure and the generation that
replaces it (the next tick): its number would come with members it did not open with.

What must stay true: every wait is bounded; no state change is answered before it is saved,
and none is visible to another call unless it was saved; a call refused by the checks
changes nothing. The server also answers the standard gRPC health service
(``protocol.health``) without a credential: SERVING until the service stops.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from typing import Any

import grpc
from google.protobuf.message import Message

from trainer_runtime.coordinator.membership import WorkerPhase
from trainer_runtime.coordinator.messages import (
    PHASE_STATUS,
    batch_from,
    ledger_message,
    member_messages,
    noise_from,
    progress_message,
    rejoin_from,
    windows_from,
)
from trainer_runtime.coordinator.state import CoordinatorState
from trainer_runtime.coordinator.storing import StateStore
from trainer_runtime.protocol import METHODS, SERVICE, pb
from trainer_runtime.protocol.checks import caller, name_problem, refusal, size_problem
from trainer_runtime.protocol.credentials import Verifier
from trainer_runtime.protocol.health import HealthService
from trainer_runtime.protocol.statuses import Unready, refusing
from trainer_runtime.protocol.tls import JobTls, listening

LOG = logging.getLogger(__name__)
TICK_S = 0.02
LONGEST_WAIT_S = 30.0
WATCH_REFRESH_S = 1.0

# Clients ping every 5 s, also on an idle Watch stream (`client.py`); gRPC's default server
# answers pings more frequent than 5 minutes without data with GOAWAY "too_many_pings",
# which drops the stream, and a dropped Watch means a dead worker or server here.
KEEPALIVE_ACCEPTED = (
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.min_recv_ping_interval_without_data_ms", 1000),
    ("grpc.http2.max_ping_strikes", 0),
)


def liveness_options(lease_timeout_s: float) -> tuple[tuple[str, int], ...]:
    """The server's own pings, which make a worker it cannot reach depart within its lease
    timeout. A `Watch` stream is a worker's liveness, but a stream over a connection that
    stopped carrying bytes without closing (a network partition, a host that vanished)
    stays open for the server: its handler kept renewing the worker's `last_seen` and the
    worker, its leases with it, was never declared gone (measured: a worker behind a proxy
    that relays nothing stayed a member, holding its shard, for as long as the partition
    lasted, and the job stalled on that shard). So the server pings every connection every
    half lease timeout and closes the one whose ping is not answered within the other half:
    its streams end, and their workers depart as if their processes had died."""
    half_ms = max(int(lease_timeout_s * 500), 500)
    return (
        ("grpc.keepalive_time_ms", half_ms),
        ("grpc.keepalive_timeout_ms", half_ms),
        ("grpc.http2.ping_timeout_ms", half_ms),
        ("grpc.http2.max_pings_without_data", 0),  # a quiet Watch stream is pinged too
    )


# gRPC binds with SO_REUSEPORT unless told not to: a second coordinator started on a port
# another one listens on would share it, and each would answer some of the other job's calls
# (with the wrong token). Refused, the second one fails at start and says which port.
SERVER_OPTIONS = (*KEEPALIVE_ACCEPTED, ("grpc.so_reuseport", 0))

#: Tries of one save before the coordinator gives up and stops (a disk full for longer
#: than a few tenths of a second is not going to clear by itself).
SAVE_TRIES = 3
SAVE_PAUSE_S = 0.1
#: What a call is answered (UNAVAILABLE) once the state could not be saved.
RESTARTING = "the coordinator is restarting"


class StateNotSaved(Unready, RuntimeError):
    """The state could not be saved: the coordinator stops, and answers no more calls."""

    def details(self) -> str:
        return RESTARTING


class CoordinatorService:
    """The handlers of the coordinator API, over one state, one lock and one store."""

    def __init__(
        self,
        state: CoordinatorState,
        store: StateStore,
        verifier: Verifier,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.state = state
        self.store = store
        self.verifier = verifier
        self.clock = clock
        self.changed = threading.Condition()
        self.watch_serial: dict[str, int] = {}
        self.stopping = threading.Event()
        #: Why the state could not be saved, once it could not: from then on no call is
        #: answered (memory may be ahead of what is saved) and the process exits non-zero,
        #: to be restarted from what was saved (``__main__``).
        self.failure: Exception | None = None
        #: The document last saved: what the state is rolled back to when a save fails.
        self.saved = self.state.to_json()
        self.store.save(self.saved)

    # ----- plumbing -----

    def saving(self) -> None:
        """Persist and wake every waiter; the caller holds `self.changed`. A save that fails
        is tried again (``SAVE_TRIES``); one that keeps failing undoes the change (the state
        is read back from the last saved document), stops the coordinator (``failure``) and
        raises ``StateNotSaved``, so that the call that made the change is not answered as
        if it had been kept."""
        document = self.state.to_json()
        for attempt in range(SAVE_TRIES):
            try:
                self.store.save(document)
                self.saved = document
                break
            except Exception as error:
                if attempt + 1 < SAVE_TRIES:
                    LOG.warning("saving the state failed (%s); trying again", error)
                    time.sleep(SAVE_PAUSE_S * (attempt + 1))
                    continue
                self.state = CoordinatorState.from_json(
                    self.saved, now=self.clock(), incarnation=self.state.incarnation
                )
                self.failure = error
                self.stopping.set()
                self.changed.notify_all()
                LOG.critical(
                    "cannot save the coordinator state (%s): stopping, to be restarted from "
                    "the state last saved",
                    error,
                )
                raise StateNotSaved(str(error)) from error
        self.changed.notify_all()

    def ticking_forever(self) -> None:
        while not self.stopping.wait(TICK_S):
            with self.changed:
                if self.state.ticking(self.clock()):
                    try:
                        self.saving()
                    except StateNotSaved:
                        return  # said in saving(); the process exits (``__main__``)

    def guarded(self, name: str) -> Callable[[Message, grpc.ServicerContext], Any]:
        handler: Callable[[Any, grpc.ServicerContext], Any] = getattr(self, name)

        def calling(request: Message, context: grpc.ServicerContext) -> Any:
            claims = caller(context.invocation_metadata(), self.verifier)
            if claims is None:
                context.abort(grpc.StatusCode.UNAUTHENTICATED, "wrong or missing credential")
            if self.failure is not None:
                context.abort(grpc.StatusCode.UNAVAILABLE, RESTARTING)
            problem = name_problem(request) or size_problem(request)
            if problem is not None:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, problem)
            refused = refusal(claims, name, request) if claims is not None else None
            if refused is not None:
                context.abort(grpc.StatusCode.PERMISSION_DENIED, refused)
            with refusing(context):
                reply = handler(request, context)
            if self.failure is not None:
                # The coordinator stopped while this call waited (another's save failed
                # for good): the process restarts, and nothing more is answered.
                context.abort(grpc.StatusCode.UNAVAILABLE, RESTARTING)
            return reply

        return calling

    def handlers(self) -> grpc.GenericRpcHandler:
        table: dict[str, Any] = {}
        for name, shape in METHODS.items():
            build = (
                grpc.unary_stream_rpc_method_handler
                if shape.streams_replies
                else grpc.unary_unary_rpc_method_handler
            )
            table[name] = build(
                self.guarded(name),
                request_deserializer=shape.request.FromString,
                response_serializer=shape.reply.SerializeToString,
            )
        return grpc.method_handlers_generic_handler(SERVICE, table)

    # ----- worker side -----

    def Register(self, request: Any, context: grpc.ServicerContext) -> Any:
        with self.changed:
            self.state.registering(
                request.worker_id,
                request.node,
                request.store_address,
                self.clock(),
                server=request.role == pb.SERVER,
                rejoin=rejoin_from(request),
            )
            self.saving()
            return pb.RegisterReply(
                generation=self.state.membership.generation, incarnation=self.state.incarnation
            )

    def notice_for(self, worker_id: str) -> Any:
        phase = self.state.membership.phase_of(worker_id)
        generation = -1 if phase is WorkerPhase.FENCED else self.state.membership.generation
        return pb.Notice(
            generation=generation,
            draining=phase is WorkerPhase.DRAINED,
            finished=self.state.ledger.finished,
            incarnation=self.state.incarnation,
        )

    def Watch(self, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
        worker_id = request.worker_id
        with self.changed:
            serial = self.watch_serial.get(worker_id, 0) + 1
            self.watch_serial[worker_id] = serial
            self.state.membership.seeing(worker_id, self.clock(), connected=True)
        context.add_callback(lambda: self.losing_watch(worker_id, serial))
        last: Any = None
        while context.is_active() and not self.stopping.is_set():
            with self.changed:
                notice = self.notice_for(worker_id)
                if notice == last:
                    self.changed.wait(WATCH_REFRESH_S)
                    notice = self.notice_for(worker_id)
                self.state.membership.seeing(worker_id, self.clock())
                if self.failure is not None:
                    return  # no notice from a memory ahead of what was saved
            if notice != last:
                last = notice
                yield notice

    def losing_watch(self, worker_id: str, serial: int) -> None:
        """A worker's stream ended: the process is gone unless it already left or re-watched."""
        with self.changed:
            if self.watch_serial.get(worker_id) != serial or self.stopping.is_set():
                return
            phase = self.state.membership.phase_of(worker_id)
            if phase in (WorkerPhase.MEMBER, WorkerPhase.PENDING):
                LOG.warning("worker %s lost its connection: departing", worker_id)
                self.state.departing(worker_id)
                with contextlib.suppress(StateNotSaved):  # said in saving(); it stops
                    self.saving()

    def AwaitGeneration(self, request: Any, context: grpc.ServicerContext) -> Any:
        deadline = self.clock() + min(max(request.timeout_s, 0.0), LONGEST_WAIT_S)
        with self.changed:
            while True:
                view = self.state.viewing_generation(request.worker_id)
                incarnation = self.state.incarnation
                if request.incarnation and request.incarnation != incarnation:
                    # Registered with a replaced incarnation: it must register again first,
                    # and no generation is given while the recovery waits for just that.
                    return pb.Generation(
                        status=pb.PENDING, number=view.number, incarnation=incarnation
                    )
                if view.finished:
                    return pb.Generation(
                        status=pb.FINISHED, number=view.number, incarnation=incarnation
                    )
                if view.phase in (WorkerPhase.DRAINED, WorkerPhase.FENCED):
                    return pb.Generation(
                        status=PHASE_STATUS[view.phase], number=view.number, incarnation=incarnation
                    )
                if (
                    view.phase is WorkerPhase.MEMBER
                    and view.number > request.after
                    and not self.state.is_recovering()
                    and self.state.membership.is_as_opened()  # else the next tick opens one
                ):
                    return pb.Generation(
                        status=pb.MEMBER,
                        number=view.number,
                        rank=view.rank,
                        members=member_messages(view.members),
                        servers=member_messages(view.servers),
                        retiring=member_messages(view.retiring),
                        incarnation=incarnation,
                    )
                remaining = deadline - self.clock()
                if remaining <= 0 or not context.is_active():
                    return pb.Generation(
                        status=pb.PENDING, number=view.number, incarnation=incarnation
                    )
                self.changed.wait(remaining)

    def Reconcile(self, request: Any, context: grpc.ServicerContext) -> Any:
        with self.changed:
            self.state.reconciling(
                request.worker_id, request.generation, request.step, windows_from(request.windows)
            )
            self.saving()
            return self.ledger_view()

    def ledger_view(self) -> Any:
        return ledger_message(self.state.ledger)

    def ViewLedger(self, request: Any, context: grpc.ServicerContext) -> Any:
        with self.changed:
            return self.ledger_view()

    def Commit(self, request: Any, context: grpc.ServicerContext) -> Any:
        with self.changed:
            self.state.committing_windows(
                request.worker_id,
                request.generation,
                windows_from(request.windows),
                request.step_time_s,
                noise_from(request),
                incarnation=request.incarnation,
                batch=batch_from(request),
            )
            self.saving()
            return pb.CommitReply(
                committed_step=self.state.ledger.committed_step,
                finished=self.state.ledger.finished,
            )

    def LeaseShard(self, request: Any, context: grpc.ServicerContext) -> Any:
        with self.changed:
            lease = self.state.leasing_shard(
                request.worker_id, request.generation, request.incarnation
            )
            if lease is None:
                return pb.LeaseReply(finished=self.state.ledger.finished)
            self.saving()
            return pb.LeaseReply(
                leases=[
                    pb.Lease(
                        lease_id=lease.lease_id,
                        epoch=lease.epoch,
                        range=pb.SampleRange(start=lease.samples.start, stop=lease.samples.stop),
                    )
                ]
            )

    def CommitLeases(self, request: Any, context: grpc.ServicerContext) -> Any:
        with self.changed:
            self.state.committing_leases(
                request.worker_id,
                list(request.lease_ids),
                request.step_time_s,
                request.incarnation,
            )
            self.saving()
            return pb.CommitReply(
                committed_step=self.state.ledger.committed_step,
                finished=self.state.ledger.finished,
            )

    def Leave(self, request: Any, context: grpc.ServicerContext) -> Any:
        with self.changed:
            self.state.departing(request.worker_id)
            self.watch_serial.pop(request.worker_id, None)
            self.saving()
        return pb.Empty()

    # ----- controller side -----

    def Drain(self, request: Any, context: grpc.ServicerContext) -> Any:
        with self.changed:
            if not self.state.draining(request.worker_id):
                context.abort(grpc.StatusCode.NOT_FOUND, f"no worker {request.worker_id}")
            self.saving()
        return pb.Empty()

    def SetTarget(self, request: Any, context: grpc.ServicerContext) -> Any:
        with self.changed:
            self.state.membership.targeting(request.workers if request.workers > 0 else None)
            self.saving()
        return pb.Empty()

    def GetProgress(self, request: Any, context: grpc.ServicerContext) -> Any:
        with self.changed:
            return progress_message(self.state)

    def GetSnapshot(self, request: Any, context: grpc.ServicerContext) -> Any:
        with self.changed:
            return pb.Snapshot(state_json=self.state.to_json())


class CoordinatorServer:
    """A running coordinator: the gRPC server, its service and its ticker thread."""

    def __init__(
        self,
        service: CoordinatorService,
        host: str = "127.0.0.1",
        port: int = 0,
        tls: JobTls | None = None,
    ):
        self.service = service
        self.server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=256, thread_name_prefix="coordinator"),
            options=[
                *SERVER_OPTIONS,
                *liveness_options(service.state.membership.lease_timeout_s),
            ],
            maximum_concurrent_rpcs=512,
        )
        self.server.add_generic_rpc_handlers((service.handlers(),))
        # The standard health service, beside the API: answered without a credential,
        # SERVING until the service stops (a save that failed for good, or ``stop``).
        self.health = HealthService(service.stopping)
        self.health.register(self.server)
        self.port: int = listening(self.server, f"{host}:{port}", tls)
        if self.port == 0:
            raise OSError(f"cannot listen on {host}:{port}")
        self.address = f"{host}:{self.port}"
        self.ticker = threading.Thread(
            target=service.ticking_forever, name="coordinator-ticker", daemon=True
        )

    def start(self) -> CoordinatorServer:
        self.server.start()
        self.ticker.start()
        return self

    def stop(self, grace_s: float = 1.0) -> None:
        self.service.stopping.set()
        with self.service.changed:
            self.service.changed.notify_all()
        self.server.stop(grace_s).wait(grace_s + 1.0)
        self.ticker.join(timeout=1.0)
