"""The controller's narrow port to a job's coordinator, and its gRPC adapter.

Why this exists: the controller asks a coordinator four things (drain a worker, the planned
size, progress, a state snapshot) and must never block its planning loop on one that is
down. The port (``CoordinatorPort``) is what the rest of the controller sees; ``GrpcCoordinator``
speaks the documented coordinator protocol (``trainer_runtime/protocol/coordinator.proto``)
through its generated messages.

Layering: the trainer runtime and the controller are independent packages; they meet only
through the protocol. This module is the one place the controller calls a coordinator
through ``trainer_runtime.protocol`` (the proto's generated messages, the method table, and
the TLS channel, which import nothing else of the runtime; ``config`` and ``shaping`` use
its credentials and TLS only to issue them); the import-linter contract names exactly these
imports, and a second contract forbids the controller every other runtime module. We do not use the
runtime's ``CoordinatorClient``: its retries wait up to 30 s for a restarting coordinator,
which suits a worker, while the controller wants one short call and to try again next cycle.

What must stay true: every call has a deadline of ``timeout_s`` and raises
``CoordinatorCallError`` on any failure; nothing here retries or sleeps.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import grpc

from edl_scheduler.api import BatchInUse, GradientStatistics
from trainer_runtime.protocol import METHODS, TOKEN_HEADER, pb
from trainer_runtime.protocol.tls import JobTls, opening_channel


class CoordinatorCallError(RuntimeError):
    """A call to a coordinator failed (unreachable, refused, or timed out)."""


@dataclass(frozen=True, slots=True)
class SizeThroughput:
    nodes: int
    workers: int
    samples_per_second: float
    step_seconds: float
    batch: int = 0  # the global batch the rate was measured at (0: not reported)


@dataclass(frozen=True, slots=True)
class Progress:
    """What a coordinator reports, in the controller's own terms."""

    generation: int
    epoch: int
    epochs: int
    committed_step: int
    samples_done: int
    samples_per_epoch: int
    finished: bool
    members: tuple[str, ...]
    draining: tuple[str, ...]
    throughput: tuple[SizeThroughput, ...]
    efficiency: GradientStatistics | None = None  # the gradient statistics, once measured
    batch: BatchInUse | None = None  # what rank 0 runs at, once it reported it

    def as_status(self) -> dict[str, Any]:
        """The ``status.progress`` block."""
        return {
            "generation": self.generation,
            "epoch": self.epoch,
            "epochs": self.epochs,
            "committedStep": self.committed_step,
            "samplesDone": self.samples_done,
            "samplesPerEpoch": self.samples_per_epoch,
            "finished": self.finished,
            "members": len(self.members),
        }


class CoordinatorPort(Protocol):
    """The four things the controller asks of a job's coordinator."""

    def drain(self, worker_id: str) -> None: ...

    def set_target(self, workers: int) -> None: ...

    def progress(self) -> Progress: ...

    def snapshot(self) -> str: ...

    def close(self) -> None: ...


class GrpcCoordinator:
    """One channel to one coordinator (TLS with ``tls``); every call carries the
    controller's credential for the job."""

    def __init__(
        self, address: str, token: str, timeout_s: float = 1.0, tls: JobTls | None = None
    ) -> None:
        self.address = address
        self.timeout_s = timeout_s
        self._metadata = ((TOKEN_HEADER, token),)
        self._channel = opening_channel(
            address,
            [
                # A coordinator that is starting is asked every 0.1 s (its first answer
                # lets the job's workers be created): reconnect about as often.
                ("grpc.initial_reconnect_backoff_ms", 100),
                ("grpc.max_reconnect_backoff_ms", 250),
            ],
            tls,
        )
        self._calls: dict[str, Any] = {}
        for name in ("Drain", "SetTarget", "GetProgress", "GetSnapshot"):
            shape = METHODS[name]
            self._calls[name] = self._channel.unary_unary(
                shape.path(name),
                request_serializer=shape.request.SerializeToString,
                response_deserializer=shape.reply.FromString,
            )

    def _call(self, name: str, request: Any) -> Any:
        try:
            return self._calls[name](request, timeout=self.timeout_s, metadata=self._metadata)
        except grpc.RpcError as error:
            code = error.code() if hasattr(error, "code") else None
            raise CoordinatorCallError(
                f"{name} to coordinator {self.address}: {code}: "
                f"{error.details() if hasattr(error, 'details') else error}"
            ) from None

    def drain(self, worker_id: str) -> None:
        self._call("Drain", pb.DrainRequest(worker_id=worker_id))

    def set_target(self, workers: int) -> None:
        self._call("SetTarget", pb.TargetRequest(workers=workers))

    def progress(self) -> Progress:
        reply = self._call("GetProgress", pb.Empty())
        return Progress(
            generation=int(reply.generation),
            epoch=int(reply.epoch),
            epochs=int(reply.epochs),
            committed_step=int(reply.committed_step),
            samples_done=int(reply.samples_done),
            samples_per_epoch=int(reply.samples_per_epoch),
            finished=bool(reply.finished),
            members=tuple(str(m.worker_id) for m in reply.members),
            draining=tuple(str(d) for d in reply.draining),
            throughput=tuple(
                SizeThroughput(
                    int(t.nodes),
                    int(t.workers),
                    float(t.samples_per_s),
                    float(t.step_time_s),
                    int(t.batch),
                )
                for t in reply.throughput
            ),
            efficiency=GradientStatistics(
                init_batch=int(reply.noise.init_batch),
                grad_sqr=float(reply.noise.grad_sqr),
                grad_var=float(reply.noise.grad_var),
                steps=int(reply.noise.steps),
            )
            if reply.HasField("noise")
            else None,
            batch=BatchInUse.reported(reply.batch) if reply.HasField("batch") else None,
        )

    def snapshot(self) -> str:
        return str(self._call("GetSnapshot", pb.Empty()).state_json)

    def close(self) -> None:
        self._channel.close()
