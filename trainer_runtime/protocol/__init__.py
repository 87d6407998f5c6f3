"""The coordinator's gRPC service, described once for both the server and the client.

The messages are generated from `coordinator.proto` (protobuf); this module names the
service's methods with their request and reply types, so that the server registers its
handlers and the client builds its calls from one table. grpcio's generic handlers carry the
wire protocol; nothing here encodes bytes by hand.

What must stay true: every method of `coordinator.proto`'s service appears in `METHODS`
with the same types, and `TOKEN_HEADER` and `REFUSAL_HEADER` are the metadata keys both
sides use.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from google.protobuf.message import Message

from trainer_runtime.protocol import coordinator_pb2 as pb

SERVICE = "edl.coordinator.v1.Coordinator"
TOKEN_HEADER = "x-edl-token"
#: The trailing metadata key that tells one kind of refusal from another of the same status.
REFUSAL_HEADER = "x-edl-refusal"


class Refusal(enum.Enum):
    """Why a call was refused, where the status code alone does not say
    (``REFUSAL_HEADER``)."""

    #: FAILED_PRECONDITION: the call named another incarnation of the coordinator than the
    #: one answering (the one the worker registered with was replaced): register again.
    INCARNATION = "incarnation"


@dataclass(frozen=True, slots=True)
class MethodShape:
    request: type[Message]
    reply: type[Message]
    streams_replies: bool = False

    def path(self, name: str) -> str:
        return f"/{SERVICE}/{name}"


METHODS: dict[str, MethodShape] = {
    "Register": MethodShape(pb.RegisterRequest, pb.RegisterReply),
    "Watch": MethodShape(pb.WatchRequest, pb.Notice, streams_replies=True),
    "AwaitGeneration": MethodShape(pb.AwaitGenerationRequest, pb.Generation),
    "Reconcile": MethodShape(pb.ReconcileRequest, pb.LedgerView),
    "Commit": MethodShape(pb.CommitRequest, pb.CommitReply),
    "LeaseShard": MethodShape(pb.LeaseRequest, pb.LeaseReply),
    "CommitLeases": MethodShape(pb.CommitLeasesRequest, pb.CommitReply),
    "Leave": MethodShape(pb.LeaveRequest, pb.Empty),
    "ViewLedger": MethodShape(pb.Empty, pb.LedgerView),
    "Drain": MethodShape(pb.DrainRequest, pb.Empty),
    "SetTarget": MethodShape(pb.TargetRequest, pb.Empty),
    "GetProgress": MethodShape(pb.Empty, pb.Progress),
    "GetSnapshot": MethodShape(pb.Empty, pb.Snapshot),
}

__all__ = [
    "METHODS",
    "REFUSAL_HEADER",
    "SERVICE",
    "TOKEN_HEADER",
    "MethodShape",
    "Refusal",
    "pb",
]
