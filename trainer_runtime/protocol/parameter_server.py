"""The parameter-server gRPC service, described once for the PS and for its clients.

The messages are generated from `ps.proto`; this table names the service's methods with
their request and reply types and their streaming shape, so that the server registers its
handlers and the worker-side client builds its calls from one place (as `protocol/__init__`
does for the coordinator). Large tensors travel as `bytes` fields of chunk messages; grpcio
carries the wire protocol.

What must stay true: every method of `ps.proto`'s service appears in `PS_METHODS` with the
same types and shape; the message limits below exceed the largest chunk a client sends.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from google.protobuf.message import Message

from trainer_runtime.protocol import ps_pb2 as ps

PS_SERVICE = "edl.ps.v1.ParameterServer"
MAX_MESSAGE_BYTES = 64 * 1024 * 1024
CHANNEL_OPTIONS = (
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
)


class Shape(enum.Enum):
    """How a method streams: one message each way, many requests, or many replies."""

    UNARY = "unary"
    STREAMS_REQUESTS = "streams-requests"
    STREAMS_REPLIES = "streams-replies"


@dataclass(frozen=True, slots=True)
class PsMethod:
    request: type[Message]
    reply: type[Message]
    shape: Shape = Shape.UNARY

    def path(self, name: str) -> str:
        return f"/{PS_SERVICE}/{name}"


PS_METHODS: dict[str, PsMethod] = {
    "Push": PsMethod(ps.PushChunk, ps.PushReply, Shape.STREAMS_REQUESTS),
    "Pull": PsMethod(ps.PullRequest, ps.PullChunk, Shape.STREAMS_REPLIES),
    "Seal": PsMethod(ps.StepRequest, ps.StepReply),
    "Apply": PsMethod(ps.StepRequest, ps.StepReply),
    "Fence": PsMethod(ps.FenceRequest, ps.Status),
    "Settle": PsMethod(ps.SettleRequest, ps.Status),
    "Snapshot": PsMethod(ps.FenceRequest, ps.Status),
    "Adopt": PsMethod(ps.AdoptRequest, ps.Status),
    "Release": PsMethod(ps.FenceRequest, ps.Empty),
}

__all__ = ["CHANNEL_OPTIONS", "MAX_MESSAGE_BYTES", "PS_METHODS", "PS_SERVICE", "PsMethod", "ps"]
