"""The parameter-server gRPC service, described once for the PS and for its clients.

The messages are generated from `ps.proto`; this table names the service's methods with
their request and reply types and their streaming shape, so that the server registers its
handlers and the worker-side client builds its calls from one place (as `protocol/__init__`
does for the coordinator). Large tensors travel as raw gRPC messages (a type of None here:
numpy buffer bytes, no protobuf copy), their small headers as protobuf messages in binary
metadata (`PUSH_HEADER`, `PULL_HEADER`); grpcio carries the wire protocol.

What must stay true: every method of `ps.proto`'s service appears in `PS_METHODS` with the
same types and shape; the message limits below exceed the largest chunk a client sends.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from google.protobuf.message import Message

from trainer_runtime.protocol import ps_pb2 as ps

PS_SERVICE = "edl.ps.v1.ParameterServer"
PUSH_HEADER = "x-edl-push-bin"  # a serialized ps.PushHeader, on every Push call
PULL_HEADER = "x-edl-pull-bin"  # a serialized ps.PullHeader, in every Pull reply's metadata
ROWS_HEADER = "x-edl-rows-bin"  # a serialized ps.RowsHeader, on every PushRows call
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
    request: type[Message] | None  # None: raw bytes messages
    reply: type[Message] | None
    shape: Shape = Shape.UNARY

    def path(self, name: str) -> str:
        return f"/{PS_SERVICE}/{name}"

    def codec(self) -> dict[str, Any]:
        """Serializers for a client stub (raw messages pass through as bytes)."""
        return {
            "request_serializer": self.request.SerializeToString if self.request else None,
            "response_deserializer": self.reply.FromString if self.reply else None,
        }

    def server_codec(self) -> dict[str, Any]:
        return {
            "request_deserializer": self.request.FromString if self.request else None,
            "response_serializer": self.reply.SerializeToString if self.reply else None,
        }


PS_METHODS: dict[str, PsMethod] = {
    "Push": PsMethod(None, ps.PushReply, Shape.STREAMS_REQUESTS),
    "Pull": PsMethod(ps.PullRequest, None, Shape.STREAMS_REPLIES),
    "PushRows": PsMethod(None, ps.PushReply, Shape.STREAMS_REQUESTS),
    "PullRows": PsMethod(ps.PullRowsRequest, None, Shape.STREAMS_REPLIES),
    "Seal": PsMethod(ps.StepRequest, ps.StepReply),
    "Apply": PsMethod(ps.StepRequest, ps.StepReply),
    "Fence": PsMethod(ps.FenceRequest, ps.Status),
    "Settle": PsMethod(ps.SettleRequest, ps.Status),
    "Snapshot": PsMethod(ps.FenceRequest, ps.Status),
    "Adopt": PsMethod(ps.AdoptRequest, ps.Status),
    "Release": PsMethod(ps.FenceRequest, ps.Empty),
}

__all__ = [
    "CHANNEL_OPTIONS",
    "MAX_MESSAGE_BYTES",
    "PS_METHODS",
    "PS_SERVICE",
    "PULL_HEADER",
    "PUSH_HEADER",
    "ROWS_HEADER",
    "PsMethod",
    "Shape",
    "ps",
]
