"""The worker side of the PS API: pushing and pulling the flattened parameters in parallel.

One `ServerLink` per parameter server holds several gRPC channels (separate TCP
connections: `grpc.use_local_subchannel_pool`), so that a partition's range is pushed or
pulled as several streams at once; each stream carries raw chunks of `CHUNK_BYTES` (the
header rides in binary metadata). A push sends one copy of each slice of the flat numpy
view of the worker's gradient buffer; a pull writes each received chunk straight into the
flat parameter buffer (the torch parameters are views of it). `Links` runs every stream of
every server on one thread pool.

Every call has a deadline. A refused generation (FAILED_PRECONDITION) or an unreachable or
not-yet-ready server (UNAVAILABLE) becomes `GroupChanged`: the caller looks at its
generation again instead of retrying blindly, because a push is not idempotent.

Embedding tables (`layout.Table`) travel by row when the caller names the rows a batch
touches (`touched`: table -> ascending unique row numbers): a push sends those rows'
gradients (`PushRows`, the others count as zero), a pull fetches those rows (`PullRows`),
the dense rest as before. Without `touched` a pull fetches everything, tables included.

What must stay true: a push sends each element of a range exactly once (a row push covers
its segment's rows once); no call waits longer than its deadline.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent import futures
from typing import Any, TypeVar

import grpc
import numpy as np
import numpy.typing as npt

from trainer_runtime.protocol import TOKEN_HEADER, statuses
from trainer_runtime.protocol.parameter_server import (
    CHANNEL_OPTIONS,
    PS_METHODS,
    PULL_HEADER,
    PUSH_HEADER,
    ROWS_HEADER,
    Shape,
    ps,
)
from trainer_runtime.protocol.tls import JobTls, opening_channel
from trainer_runtime.ps.layout import Piece, Segment, Table, splitting

CHUNK_BYTES = 1024 * 1024
#: A segment's rows take one more parallel stream per this many bytes: a stream's fixed
#: cost outweighs its parallelism on a batch's few MB of rows (measured on loopback).
ROW_STREAM_BYTES = 16 * 1024 * 1024
CALL_TIMEOUT_S = 60.0
T = TypeVar("T")
Rows = Mapping[Table, npt.NDArray[np.int64]]  # table -> ascending unique row numbers


class GroupChanged(RuntimeError):
    """A server refused the generation or is gone: ask the coordinator for the generation."""


class ServerError(RuntimeError):
    """A server refused a request as invalid (a bug or a misconfigured job, not a resize)."""


def translating(error: grpc.RpcError, address: str) -> Exception:
    code = error.code()
    if statuses.received(error) in (statuses.Stale, statuses.Unready) or code in (
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.CANCELLED,
    ):
        return GroupChanged(f"parameter server {address}: {code.name}: {error.details()}")
    return ServerError(f"parameter server {address}: {code.name}: {error.details()}")


def spans(start: int, stop: int, parts: int, grain: int = 1) -> list[tuple[int, int]]:
    """Cut `[start, stop)` into at most `parts` consecutive non-empty spans whose inner
    boundaries are multiples of `grain` from `start` (so every stream's chunks line up with
    the same grid, whatever the number of streams)."""
    grains = -(-(stop - start) // grain)
    parts = max(1, min(parts, grains))
    base, extra = divmod(grains, parts)
    cuts, first = [], start
    for index in range(parts):
        last = min(stop, first + (base + (1 if index < extra else 0)) * grain)
        cuts.append((first, last))
        first = last
    return cuts


def chunk_elements(itemsize: int) -> int:
    return max(1, CHUNK_BYTES // itemsize)


class ServerLink:
    """Channels to one parameter server (TLS with ``tls``), with the caller's credential on
    every call."""

    def __init__(
        self, address: str, token: str, channels: int = 2, tls: JobTls | None = None
    ) -> None:
        self.address = address
        self.metadata = ((TOKEN_HEADER, token),)
        options = [*CHANNEL_OPTIONS, ("grpc.use_local_subchannel_pool", 1)]
        self.channels = [opening_channel(address, options, tls) for _ in range(channels)]
        self.calls: list[dict[str, Any]] = []
        for channel in self.channels:
            table: dict[str, Any] = {}
            for name, method in PS_METHODS.items():
                build = {
                    Shape.UNARY: channel.unary_unary,
                    Shape.STREAMS_REQUESTS: channel.stream_unary,
                    Shape.STREAMS_REPLIES: channel.unary_stream,
                }[method.shape]
                table[name] = build(method.path(name), **method.codec())
            self.calls.append(table)

    def close(self) -> None:
        for channel in self.channels:
            channel.close()

    def calling(self, name: str, request: Any, timeout_s: float = CALL_TIMEOUT_S) -> Any:
        try:
            return self.calls[0][name](request, timeout=timeout_s, metadata=self.metadata)
        except grpc.RpcError as error:
            raise translating(error, self.address) from error

    def pushing_span(
        self,
        lane: int,
        header: dict[str, int],
        gradient: npt.NDArray[Any],
        start: int,
        stop: int,
    ) -> bool:
        step = chunk_elements(gradient.itemsize)

        def chunks() -> Iterator[bytes]:
            for offset in range(start, stop, step):
                yield gradient[offset : min(stop, offset + step)].tobytes()

        described = ps.PushHeader(offset=start, **header).SerializeToString()
        return self.streaming(lane, "Push", chunks(), (PUSH_HEADER, described))

    def streaming(
        self, lane: int, name: str, messages: Iterator[bytes], header: tuple[str, bytes]
    ) -> bool:
        """Send one push stream with its header; whether the step became complete."""
        try:
            reply = self.calls[lane % len(self.calls)][name](
                messages, timeout=CALL_TIMEOUT_S, metadata=(*self.metadata, header)
            )
        except grpc.RpcError as error:
            raise translating(error, self.address) from error
        return bool(reply.complete)

    def pulling_span(
        self,
        lane: int,
        generation: int,
        at_least: int,
        timeout_s: float,
        into: npt.NDArray[Any],
        start: int,
        stop: int,
    ) -> int | None:
        """Fill `into[start:stop]`; the partition's watermark, or None if it was not ready."""
        request = ps.PullRequest(
            generation=generation, at_least=at_least, timeout_s=timeout_s, start=start, stop=stop
        )
        try:
            stream = self.calls[lane % len(self.calls)]["Pull"](
                request, timeout=timeout_s + CALL_TIMEOUT_S, metadata=self.metadata
            )
            header = self.opened(stream)
            if header is None:
                return None
            self.filling(stream, into[start:stop])
        except grpc.RpcError as error:
            raise translating(error, self.address) from error
        return int(header.watermark)

    def opened(self, stream: Any) -> Any:
        """A pull's PullHeader, or None (the stream cancelled) if it was not ready."""
        found = dict(stream.initial_metadata() or ()).get(PULL_HEADER)
        if not isinstance(found, bytes):  # the call ended before the server answered
            raise GroupChanged(f"parameter server {self.address} did not answer a pull")
        header = ps.PullHeader.FromString(found)
        if not header.ready:
            stream.cancel()
            return None
        return header

    def pushing_rows(
        self,
        lane: int,
        header: dict[str, int],
        gradient: npt.NDArray[Any],
        segment: Segment,
        rows: npt.NDArray[np.int64],
        span: tuple[int, int],
    ) -> bool:
        """Push the gradients of `rows` (of the segment) inside the row span `span`. Each
        message gathers its own rows: a chunk gathered and sent while it is still in cache,
        the first on its way before the last is gathered."""
        length = segment.table.row_length
        start, stop = segment.start + span[0] * length, segment.start + span[1] * length
        numbers = rows - span[0]
        table = gradient[start:stop].reshape(-1, length)
        step = max(1, chunk_elements(gradient.itemsize) // length)

        def messages() -> Iterator[bytes]:
            yield numbers.astype("<i8", copy=False).tobytes()
            for first in range(0, numbers.size, step):
                yield np.take(table, numbers[first : first + step], axis=0).tobytes()

        described = ps.RowsHeader(start=start, stop=stop, rows=numbers.size, **header)
        return self.streaming(
            lane, "PushRows", messages(), (ROWS_HEADER, described.SerializeToString())
        )

    def pulling_rows(
        self,
        lane: int,
        generation: int,
        at_least: int,
        timeout_s: float,
        into: npt.NDArray[Any],
        segment: Segment,
        rows: npt.NDArray[np.int64],
        span: tuple[int, int],
    ) -> int | None:
        """Fill the segment's `rows` (numbers inside the segment, in the row span `span`)
        of `into`; the partition's watermark, or None if it was not ready."""
        length = segment.table.row_length
        start, stop = segment.start + span[0] * length, segment.start + span[1] * length
        rows = rows - span[0]
        request = ps.PullRowsRequest(
            generation=generation,
            at_least=at_least,
            timeout_s=timeout_s,
            start=start,
            stop=stop,
            rows=rows.astype("<i8", copy=False).tobytes(),
        )
        try:
            stream = self.calls[lane % len(self.calls)]["PullRows"](
                request, timeout=timeout_s + CALL_TIMEOUT_S, metadata=self.metadata
            )
            header = self.opened(stream)
            if header is None:
                return None
            self.scattering(stream, into[start:stop].reshape(-1, length), rows)
        except grpc.RpcError as error:
            raise translating(error, self.address) from error
        return int(header.watermark)

    def scattering(self, stream: Any, table: npt.NDArray[Any], rows: npt.NDArray[np.int64]) -> None:
        """Write a row pull's chunks (whole rows, in the order of `rows`) into the rows
        `rows` of `table` as they come; they must cover `rows` exactly."""
        length, position = table.shape[1], 0
        for chunk in stream:
            values = np.frombuffer(chunk, dtype=table.dtype)
            count = values.size // length
            if values.size % length or position + count > rows.size:
                break
            table[rows[position : position + count]] = values.reshape(count, length)
            position += count
        else:
            if position == rows.size:
                return
        raise ServerError(
            f"parameter server {self.address} sent more or less than the {rows.size} rows asked for"
        )

    def filling(self, stream: Any, target: npt.NDArray[Any]) -> None:
        """Copy a pull's raw chunks into `target`, which they must fill exactly."""
        position = 0
        for chunk in stream:
            values = np.frombuffer(chunk, dtype=target.dtype)
            if position + values.size > target.size:
                break
            target[position : position + values.size] = values
            position += values.size
        else:
            if position == target.size:
                return
        raise ServerError(
            f"parameter server {self.address} sent more or less than the "
            f"{target.size} elements asked for"
        )


def row_lanes(
    segment: Segment, touched: Rows, parts: int, itemsize: int
) -> list[tuple[int, npt.NDArray[np.int64], tuple[int, int]]]:
    """The streams of one segment's row push or pull: (lane, rows, row span), at most
    `parts` and one per `ROW_STREAM_BYTES` of rows, the spans tiling the segment's rows, the
    touched rows (counted from the segment's first row) shared about evenly."""
    found = touched.get(segment.table)
    total = (segment.stop - segment.start) // segment.table.row_length
    rows = np.zeros(0, dtype=np.int64)
    if found is not None:
        low, high = np.searchsorted(found, [segment.first_row, segment.first_row + total])
        rows = found[low:high] - segment.first_row
    row_bytes = segment.table.row_length * itemsize
    parts = max(1, min(parts, rows.size, -(-rows.size * row_bytes // ROW_STREAM_BYTES)))
    cuts = [0, *(int(rows[rows.size * k // parts]) for k in range(1, parts)), total]
    lanes = []
    for lane, (a, b) in enumerate((a, b) for a, b in itertools.pairwise(cuts) if b > a):
        low, high = np.searchsorted(rows, [a, b])
        lanes.append((lane, rows[low:high], (a, b)))
    return lanes


class Links:
    """Every server of one layout, and the thread pool their streams run on."""

    def __init__(self, token: str, channels_per_server: int = 2, tls: JobTls | None = None) -> None:
        self.token = token
        self.channels_per_server = channels_per_server
        self.tls = tls
        self.links: dict[str, ServerLink] = {}
        self.pool = futures.ThreadPoolExecutor(max_workers=32, thread_name_prefix="ps-link")
        self.lock = threading.Lock()

    def link(self, address: str) -> ServerLink:
        with self.lock:
            found = self.links.get(address)
            if found is None:
                found = ServerLink(address, self.token, self.channels_per_server, self.tls)
                self.links[address] = found
            return found

    def everywhere(self, tasks: Sequence[Callable[[], T]]) -> list[T]:
        """Run `tasks` in parallel; the first error is raised once every task ended."""
        running = [self.pool.submit(task) for task in tasks]
        futures.wait(running)
        return [task.result() for task in running]

    def pushing(
        self,
        pieces: Sequence[Piece],
        header: dict[str, int],
        gradient: npt.NDArray[Any],
        tables: Sequence[Table] = (),
        touched: Rows | None = None,
    ) -> bool:
        """Push `gradient` (the flat vector) to every piece, the tables' `touched` rows
        only; True if all became complete."""
        tasks: list[Callable[[], bool]] = []
        grain = chunk_elements(gradient.itemsize)
        for piece in pieces:
            link = self.link(piece.address)
            dense, segments = splitting(piece, tables)
            for start, stop in dense:
                cuts = spans(start, stop, len(link.channels), grain)
                for lane, (a, b) in enumerate(cuts):
                    tasks.append(
                        lambda link=link, lane=lane, a=a, b=b: link.pushing_span(  # type: ignore[misc]
                            lane, header, gradient, a, b
                        )
                    )
            for segment in segments:
                for lane, rows, span in row_lanes(
                    segment, touched or {}, len(link.channels), gradient.itemsize
                ):
                    tasks.append(
                        lambda link=link, lane=lane, s=segment, r=rows, span=span: (  # type: ignore[misc]
                            link.pushing_rows(lane, header, gradient, s, r, span)
                        )
                    )
        return all(self.everywhere(tasks))

    def pulling(
        self,
        pieces: Sequence[Piece],
        generation: int,
        at_least: int,
        timeout_s: float,
        into: npt.NDArray[Any],
        tables: Sequence[Table] = (),
        touched: Rows | None = None,
    ) -> int | None:
        """Pull every piece into `into` (of the tables, the `touched` rows only, if given);
        the lowest watermark, or None if one was not ready."""
        tasks: list[Callable[[], int | None]] = []
        for piece in pieces:
            link = self.link(piece.address)
            dense, segments = splitting(piece, tables if touched is not None else ())
            for start, stop in dense:
                for lane, (a, b) in enumerate(spans(start, stop, len(link.channels))):
                    tasks.append(
                        lambda link=link, lane=lane, a=a, b=b: link.pulling_span(  # type: ignore[misc]
                            lane, generation, at_least, timeout_s, into, a, b
                        )
                    )
            for segment in segments:
                for lane, rows, span in row_lanes(
                    segment, touched or {}, len(link.channels), into.itemsize
                ):
                    tasks.append(
                        lambda link=link, lane=lane, s=segment, r=rows, span=span: (  # type: ignore[misc]
                            link.pulling_rows(
                                lane, generation, at_least, timeout_s, into, s, r, span
                            )
                        )
                    )
        marks = self.everywhere(tasks)
        if any(mark is None for mark in marks):
            return None
        return min(mark for mark in marks if mark is not None)

    def stepping(
        self, pieces: Sequence[Piece], name: str, generation: int, step: int, timeout_s: float
    ) -> list[Any]:
        """`Seal` or `Apply` one step on every piece, in parallel."""
        request = ps.StepRequest(generation=generation, step=step, timeout_s=timeout_s)
        return self.everywhere(
            [
                lambda piece=piece: self.link(piece.address).calling(  # type: ignore[misc]
                    name, request, timeout_s + CALL_TIMEOUT_S
                )
                for piece in pieces
            ]
        )

    def closing(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
        with self.lock:
            for link in self.links.values():
                link.close()
            self.links.clear()
