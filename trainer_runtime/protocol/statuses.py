"""Which gRPC status answers which refusal, written once for every server of the runtime (the
coordinator, `coordinator/serving.py`; the parameter servers, `ps/serving.py`) and read
back by their clients (`client.py`).

A server's own errors say what kind of refusal they are by deriving from one of the kinds
below (`FencedError` is `Stale`, `LedgerError` is `Conflict`, `SnapshotMissing` is
`Missing`, ...); `refusing` turns any of them into its status in every handler, unary or
streaming alike, so that no handler can answer a refusal with another status than the
others (one copy of this table once lacked `SnapshotMissing` in streaming calls). A client
asks `received` which kind a failed call's status names.

What must stay true: each kind has one status; a kind that shares its status with another
(`Replaced` and `Stale`) is told apart by `REFUSAL_HEADER`, set by `refusing` and read by
`received`; a refusal's message reaches the caller as the status's details.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import ClassVar

import grpc

from trainer_runtime.protocol import REFUSAL_HEADER, Refusal


class Refused(Exception):
    """A call a server refuses: its kind's `code` answers it, with `details()`."""

    code: ClassVar[grpc.StatusCode] = grpc.StatusCode.UNKNOWN
    #: Told apart from another kind of the same code by this trailing metadata.
    refusal: ClassVar[Refusal | None] = None

    def details(self) -> str:
        return str(self)


class Stale(Refused):
    """The caller acts for a generation (or a worker) that is over: it must ask again."""

    code = grpc.StatusCode.FAILED_PRECONDITION


class Replaced(Stale):
    """The call names another incarnation of the coordinator than the one answering."""

    refusal = Refusal.INCARNATION


class Conflict(Refused):
    """The call would make the state inconsistent (lose or repeat a sample, corrupt a
    partition); nothing changed."""

    code = grpc.StatusCode.ABORTED


class Unready(Refused):
    """The server cannot answer this now (it is restarting, or not yet in the caller's
    generation): the caller may try again."""

    code = grpc.StatusCode.UNAVAILABLE


class Missing(Refused):
    """What the call asks for does not exist."""

    code = grpc.StatusCode.NOT_FOUND


class Malformed(Refused):
    """The request itself is wrong; no retry mends it."""

    code = grpc.StatusCode.INVALID_ARGUMENT


#: Every kind, the more specific first (`received` takes the first that matches).
KINDS: tuple[type[Refused], ...] = (Replaced, Stale, Conflict, Unready, Missing, Malformed)


@contextlib.contextmanager
def refusing(context: grpc.ServicerContext) -> Iterator[None]:
    """Answer a `Refused` raised inside with its kind's status (and refusal header)."""
    try:
        yield
    except Refused as error:
        if error.refusal is not None:
            context.set_trailing_metadata(((REFUSAL_HEADER, error.refusal.value),))
        context.abort(error.code, error.details())


def received(error: grpc.RpcError) -> type[Refused] | None:
    """The kind of refusal a failed call's status names; None for a status no kind has."""
    code = error.code()
    trailing = dict(error.trailing_metadata() or ())
    for kind in KINDS:
        if kind.code is code and (
            kind.refusal is None or trailing.get(REFUSAL_HEADER) == kind.refusal.value
        ):
            return kind
    return None
