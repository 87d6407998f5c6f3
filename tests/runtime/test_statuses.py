"""Which gRPC status answers each refusal of the runtime's servers, and how a client reads it
back (`trainer_runtime/protocol/statuses.py`).

Aspects:
- every server error the coordinator and the parameter servers raise has the status it had
  when each server kept a table of its own (and a streaming call answers `SnapshotMissing`
  as a unary one does: its copy of the table once lacked it);
- a client reads back the kind each status names, the incarnation refusal told apart from
  a fence by its trailing header, and turns it into the same error as before.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import grpc
import pytest

from trainer_runtime import client
from trainer_runtime.coordinator.ledger import LedgerError
from trainer_runtime.coordinator.recovering import ReportError
from trainer_runtime.coordinator.serving import RESTARTING, StateNotSaved
from trainer_runtime.coordinator.state import FencedError, Reincarnated
from trainer_runtime.protocol import REFUSAL_HEADER, Refusal, statuses
from trainer_runtime.ps.partition import NotAdopted, PartitionError, StaleGeneration
from trainer_runtime.ps.snapshots import SnapshotMissing


class Aborted(Exception):
    pass


class Context:
    """What `refusing` uses of a servicer context; `abort` raises, as grpc's does."""

    def __init__(self) -> None:
        self.trailing: tuple[tuple[str, str], ...] = ()
        self.answer: tuple[grpc.StatusCode, str] | None = None

    def set_trailing_metadata(self, metadata: tuple[tuple[str, str], ...]) -> None:
        self.trailing = metadata

    def abort(self, code: grpc.StatusCode, details: str) -> None:
        self.answer = (code, details)
        raise Aborted()


class Failed(grpc.RpcError):  # type: ignore[misc]
    """A failed call as a client sees it."""

    def __init__(self, code: grpc.StatusCode, details: str, trailing: Any = ()) -> None:
        self._code, self._details, self._trailing = code, details, trailing

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details

    def trailing_metadata(self) -> Any:
        return self._trailing


F, A, U = (
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.ABORTED,
    grpc.StatusCode.UNAVAILABLE,
)
ANSWERS = [
    (FencedError("stale"), F, "stale"),
    (Reincarnated("another"), F, "another"),
    (LedgerError("gap"), A, "gap"),
    (ReportError("bad"), grpc.StatusCode.INVALID_ARGUMENT, "bad"),
    (StateNotSaved("disk full"), U, RESTARTING),
    (StaleGeneration("old"), F, "old"),
    (NotAdopted("later"), U, "later"),
    (PartitionError("corrupt"), A, "corrupt"),
    (SnapshotMissing("none"), grpc.StatusCode.NOT_FOUND, "none"),
]


def answering(error: Exception, streaming: bool) -> Context:
    context = Context()

    def unary() -> None:
        with statuses.refusing(context):
            raise error

    def streamed() -> Iterator[int]:
        with statuses.refusing(context):
            yield 1
            raise error

    with pytest.raises(Aborted):
        if streaming:
            list(streamed())
        else:
            unary()
    return context


@pytest.mark.parametrize("streaming", [False, True])
@pytest.mark.parametrize(("error", "code", "details"), ANSWERS)
def test_each_refusal_has_its_status_in_unary_and_streaming_calls(
    error: Exception, code: grpc.StatusCode, details: str, streaming: bool
) -> None:
    context = answering(error, streaming)
    assert context.answer == (code, details)
    header = ((REFUSAL_HEADER, Refusal.INCARNATION.value),)
    assert context.trailing == (header if isinstance(error, Reincarnated) else ())


def test_anything_else_is_not_answered_as_a_refusal() -> None:
    context = Context()
    with pytest.raises(KeyError), statuses.refusing(context):
        raise KeyError("a bug")
    assert context.answer is None


def test_a_client_reads_back_the_kind_and_its_error() -> None:
    incarnation = ((REFUSAL_HEADER, Refusal.INCARNATION.value),)
    assert statuses.received(Failed(F, "x", incarnation)) is statuses.Replaced
    assert statuses.received(Failed(F, "x")) is statuses.Stale
    assert statuses.received(Failed(grpc.StatusCode.INTERNAL, "x")) is None
    assert type(client.translating(Failed(F, "x", incarnation))) is client.Reincarnated
    assert type(client.translating(Failed(F, "x"))) is client.Fenced
    assert type(client.translating(Failed(A, "x"))) is client.LedgerConflict
    assert type(client.translating(Failed(U, "x"))) is client.CoordinatorUnreachable
    refused = client.translating(Failed(grpc.StatusCode.PERMISSION_DENIED, "x"))
    assert type(refused) is client.TokenRefused
    other = client.translating(Failed(grpc.StatusCode.NOT_FOUND, "no worker w9"))
    assert type(other) is client.CoordinatorError
    assert str(other) == "NOT_FOUND: no worker w9"
