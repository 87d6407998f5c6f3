"""A typed client of the coordinator API, for workers and for the controller.

Every call has a deadline. Calls that are safe to repeat are retried with tenacity while
the coordinator is unreachable (it may be restarting), up to the retry budget; after that
the caller gets `CoordinatorUnreachable`, never a hang. gRPC status codes become the
runtime's own errors: a fenced worker, a refused token, a ledger conflict, a coordinator
replaced since the worker registered (`Reincarnated`).

A client remembers the incarnation of the coordinator its last `register` reached, and
names it in every lease and commit: a replacement refuses those (its lease ids and
generations are its own), so that the worker registers again and reports what it trained.

What must stay true: no call waits longer than its timeout plus the retry budget.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import grpc
from tenacity import (
    RetryError,
    Retrying,
    retry_if_exception,
    stop_after_delay,
    wait_exponential,
)

from trainer_runtime.protocol import METHODS, TOKEN_HEADER, pb, statuses
from trainer_runtime.protocol.tls import JobTls, opening_channel
from trainer_runtime.sharding import SampleRange, StepWindow

TRANSIENT = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
#: The pauses between tries while the coordinator is unreachable: from 20 ms, doubling, at
#: most ``RETRY_PAUSE_MAX_S``. The controller starts a job's workers in the same act as its
#: coordinator, so they register while it is still starting: each one joins within about
#: that much of its listening. The channel's own reconnection back-off is bounded alike
#: (while it waits to reconnect, a call fails at once and a retry gains nothing).
RETRY_PAUSE_FIRST_S = 0.02
RETRY_PAUSE_MAX_S = 0.1


class CoordinatorError(RuntimeError):
    """A call to the coordinator failed."""


class CoordinatorUnreachable(CoordinatorError):
    """The coordinator did not answer within the retry budget."""


class TokenRefused(CoordinatorError):
    """The coordinator refused the caller's credential, or this call for it (a worker acting
    for another worker id, or calling a controller's method): no retry mends it."""


class Fenced(CoordinatorError):
    """The coordinator refused a call from a stale or unknown worker: stop, no split brain."""


class Reincarnated(Fenced):
    """The coordinator that answered is not the one the worker registered with (it was
    replaced, maybe from an older state): register again, reporting what was trained."""


class LedgerConflict(CoordinatorError):
    """A commit would have lost or repeated samples."""


RETRY_PAUSES = wait_exponential(multiplier=RETRY_PAUSE_FIRST_S, max=RETRY_PAUSE_MAX_S)


def is_transient(error: BaseException) -> bool:
    return isinstance(error, grpc.RpcError) and error.code() in TRANSIENT


def translating(error: grpc.RpcError) -> CoordinatorError:
    """The runtime's error for a call the coordinator refused (`protocol/statuses.py` says
    which status each refusal has)."""
    code, details = error.code(), error.details()
    if code in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED):
        return TokenRefused(details)
    kind = statuses.received(error)
    if kind is statuses.Replaced:
        return Reincarnated(details)
    if kind is statuses.Stale:
        return Fenced(details)
    if kind is statuses.Conflict:
        return LedgerConflict(details)
    if code in TRANSIENT:
        return CoordinatorUnreachable(f"{code.name}: {details}")
    return CoordinatorError(f"{code.name}: {details}")


@dataclass(frozen=True, slots=True)
class Rejoining:
    """What a worker tells the coordinator that replaced the one it knew: the newest
    generation it was a member of, what it trained in its latest epoch, and the newest
    lease id it held."""

    last_generation: int
    trained: tuple[tuple[int, SampleRange], ...] = ()
    last_lease_id: int = 0


def window_message(window: StepWindow) -> Any:
    return pb.StepWindow(
        step=window.step,
        epoch=window.epoch,
        ranges=[pb.SampleRange(start=r.start, stop=r.stop) for r in window.ranges],
    )


def ranges_from(messages: Any) -> list[SampleRange]:
    return [SampleRange(m.start, m.stop) for m in messages]


class CoordinatorClient:
    """One channel to one coordinator (TLS with ``tls``), with the caller's credential on
    every call."""

    def __init__(
        self,
        address: str,
        token: str,
        timeout_s: float = 10.0,
        retry_s: float = 30.0,
        tls: JobTls | None = None,
    ) -> None:
        self.address = address
        self.timeout_s = timeout_s
        self.retry_s = retry_s
        self.metadata = ((TOKEN_HEADER, token),)
        self.channel = opening_channel(
            address,
            [
                ("grpc.keepalive_time_ms", 5000),
                ("grpc.keepalive_timeout_ms", 2000),
                ("grpc.keepalive_permit_without_calls", 1),
                ("grpc.initial_reconnect_backoff_ms", int(RETRY_PAUSE_FIRST_S * 1000)),
                ("grpc.max_reconnect_backoff_ms", int(RETRY_PAUSE_MAX_S * 1000)),
            ],
            tls,
        )
        #: The incarnation of the coordinator the last `register` reached ("" before one).
        self.incarnation = ""
        self.calls: dict[str, Any] = {}
        for name, shape in METHODS.items():
            build = self.channel.unary_stream if shape.streams_replies else self.channel.unary_unary
            self.calls[name] = build(
                shape.path(name),
                request_serializer=shape.request.SerializeToString,
                response_deserializer=shape.reply.FromString,
            )

    def close(self) -> None:
        self.channel.close()

    def calling(
        self, name: str, request: Any, timeout_s: float | None = None, retry: bool = True
    ) -> Any:
        timeout = self.timeout_s if timeout_s is None else timeout_s
        if not retry:
            try:
                return self.calls[name](request, timeout=timeout, metadata=self.metadata)
            except grpc.RpcError as error:
                raise translating(error) from error
        try:
            for attempt in Retrying(
                retry=retry_if_exception(is_transient),
                stop=stop_after_delay(self.retry_s),
                wait=RETRY_PAUSES,
                reraise=False,
            ):
                with attempt:
                    return self.calls[name](request, timeout=timeout, metadata=self.metadata)
        except RetryError as error:
            last = error.last_attempt.exception()
            raise CoordinatorUnreachable(
                f"coordinator {self.address} unreachable for {self.retry_s:.0f} s: {last}"
            ) from error
        except grpc.RpcError as error:
            raise translating(error) from error
        raise CoordinatorUnreachable(f"no attempt reached {self.address}")

    # ----- worker side -----

    def register(
        self,
        worker_id: str,
        node: str,
        store_address: str,
        server: bool = False,
        rejoin: Rejoining | None = None,
    ) -> int:
        """Join the job as a worker, or (`server`) as a parameter server serving at
        `store_address`. With `rejoin`, the worker registers again because the incarnation
        this client last reached was replaced, and reports what it knows."""
        request = pb.RegisterRequest(
            worker_id=worker_id,
            node=node,
            store_address=store_address,
            role=pb.SERVER if server else pb.WORKER,
        )
        if rejoin is not None:
            if not self.incarnation:
                raise ValueError("a worker that never registered has nothing to report")
            request.previous_incarnation = self.incarnation
            request.last_generation = rejoin.last_generation
            request.last_lease_id = rejoin.last_lease_id
            request.trained.extend(
                pb.TrainedRange(epoch=epoch, range=pb.SampleRange(start=r.start, stop=r.stop))
                for epoch, r in rejoin.trained
            )
        reply = self.calling("Register", request)
        self.incarnation = str(reply.incarnation)
        return int(reply.generation)

    def watch(self, worker_id: str) -> Iterator[Any]:
        """The stream of notices for one worker; it ends or raises when the channel drops."""
        stream: Iterator[Any] = self.calls["Watch"](
            pb.WatchRequest(worker_id=worker_id), metadata=self.metadata
        )
        return stream

    def awaiting_generation(self, worker_id: str, after: int, timeout_s: float) -> Any:
        request = pb.AwaitGenerationRequest(
            worker_id=worker_id, after=after, timeout_s=timeout_s, incarnation=self.incarnation
        )
        return self.calling("AwaitGeneration", request, timeout_s=timeout_s + self.timeout_s)

    def reconcile(
        self, worker_id: str, generation: int, step: int, windows: Sequence[StepWindow]
    ) -> Any:
        request = pb.ReconcileRequest(
            worker_id=worker_id,
            generation=generation,
            step=step,
            windows=[window_message(w) for w in windows],
        )
        return self.calling("Reconcile", request)

    def commit(
        self,
        worker_id: str,
        generation: int,
        windows: Sequence[StepWindow],
        step_time_s: float,
        retry: bool = True,
        noise: pb.GradientNoise | None = None,
        batch: pb.BatchInUse | None = None,
    ) -> Any:
        """Commit applied windows; `noise`, the job's gradient statistics now, and `batch`,
        what rank 0 runs at, ride along."""
        request = pb.CommitRequest(
            worker_id=worker_id,
            generation=generation,
            windows=[window_message(w) for w in windows],
            step_time_s=step_time_s,
            noise=noise,
            incarnation=self.incarnation,
            batch=batch,
        )
        return self.calling("Commit", request, retry=retry)

    def lease_shard(self, worker_id: str, generation: int) -> Any:
        request = pb.LeaseRequest(
            worker_id=worker_id, generation=generation, incarnation=self.incarnation
        )
        return self.calling("LeaseShard", request)

    def commit_leases(self, worker_id: str, lease_ids: Sequence[int], step_time_s: float) -> Any:
        request = pb.CommitLeasesRequest(
            worker_id=worker_id,
            lease_ids=list(lease_ids),
            step_time_s=step_time_s,
            incarnation=self.incarnation,
        )
        return self.calling("CommitLeases", request)

    def view_ledger(self) -> Any:
        """The dataset plan, epoch and committed step (read-only; any member may ask)."""
        return self.calling("ViewLedger", pb.Empty())

    def leave(self, worker_id: str) -> None:
        self.calling("Leave", pb.LeaveRequest(worker_id=worker_id))

    # ----- controller side -----

    def drain(self, worker_id: str) -> None:
        """Ask a worker to leave at its next step boundary (it then exits 0)."""
        self.calling("Drain", pb.DrainRequest(worker_id=worker_id))

    def set_target(self, workers: int) -> None:
        """Tell the coordinator the planned worker count (0: none), closing join windows early."""
        self.calling("SetTarget", pb.TargetRequest(workers=workers))

    def progress(self) -> Any:
        """Generation, epoch, committed step, samples done, members and throughput by size."""
        return self.calling("GetProgress", pb.Empty())

    def snapshot(self) -> str:
        """The coordinator's whole state as one JSON document, for the controller to keep."""
        return str(self.calling("GetSnapshot", pb.Empty()).state_json)
