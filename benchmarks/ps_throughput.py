"""Push+pull throughput of parameter-server mode against a plain socket, on loopback.

Method:
- The model is `--model-mb` MB of float32 parameters (default 100 MB), split evenly over
  `--servers` parameter-server processes (each the real `ParameterService` behind a real
  gRPC server, its partition adopted directly, no coordinator). The driver is one worker:
  each round it pushes the whole gradient (every partition, `--channels` parallel streams
  per server, 4 MB chunks), applies the step (two-phase: `Apply` on every partition, which
  runs the SGD update), and pulls the whole model back at the new step into its flat
  buffer. Bytes counted: pushed plus pulled (2 x model size) per round.
- The peer is a plain TCP socket to an echo process: the driver sends the same bytes from
  the same buffer with `sendall`, the echo process receives them into a buffer and sends
  them back, the driver receives them into its buffer. Bytes counted the same way.
- Both peers run in the same run, in alternating rounds (socket, ps, ps, socket, ...), so
  that both see the same background load; the values are medians over rounds.

The Paddle sparse case (`--case paddle-sparse`) measures what a Paddle PS worker with an
embedding table moves each step: the table is `--table-rows` rows of `--row-length` float32
(default 1M x 64, 256 MB), declared a table (`layout.Table`) on the servers; each round
draws the rows a batch touches (`--touched`, default 10%, new rows each round), pushes
their gradients by row (`PushRows`), applies, and pulls those rows back (`PullRows`), the
calls `paddle.ps` makes. Bytes counted: the touched rows' elements pushed plus pulled (the
8-byte row numbers travel beside them, uncounted). The socket peer moves the same bytes,
alternated with it in the same run. It also times, apart, the Paddle worker's own copies of
those rows (`paddle_rows_copy_s`: gather the gradient rows of an `nn.Embedding`'s weight,
scatter the pulled rows into it) and of a dense parameter of the same bytes
(`paddle_dense_copy_s`: `set_value`, then the gradient copied out).

Prints one JSON line per case (`--case all`, the default, prints both):
`{"model_mb": 100, "ps_gb_s": ..., "socket_gb_s": ..., "ratio": ...}` (GB = 1e9 bytes),
with `ratio` = ps / socket, and `{"case": "paddle-sparse", ..., "paddle_sparse_ratio": ...}`
(touched rows push+pull / socket), with the settings beside them.

Run: `python benchmarks/ps_throughput.py [--case all|dense|paddle-sparse] [--model-mb 100]
[--servers 2] [--channels 2] [--rounds 8] [--table-rows 1000000] [--row-length 64]
[--touched 0.1]`. `--role server|echo` is internal (a child process).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from trainer_runtime.protocol.credentials import Issuer, JobCredentials  # noqa: E402
from trainer_runtime.ps import serving as ps_serving  # noqa: E402
from trainer_runtime.ps import transport  # noqa: E402
from trainer_runtime.ps.layout import Table, laying_out  # noqa: E402
from trainer_runtime.ps.serving import ParameterServer, ParameterService  # noqa: E402
from trainer_runtime.ps.snapshots import SnapshotDirectory  # noqa: E402
from trainer_runtime.ps.transport import Links  # noqa: E402

#: Derived from a fixed secret, so that the server processes this script starts (each
#: imports it anew) check the credentials the client holds: one machine, 127.0.0.1 only.
CREDENTIALS = JobCredentials(Issuer.from_secret("ps-throughput"), "ps-throughput")
GENERATION = 1


def serving(start: int, stop: int, size: int, tables: tuple[Table, ...]) -> None:
    """Child: one parameter server holding `[start, stop)`, until stdin closes."""
    directory = SnapshotDirectory(Path(os.environ.get("TMPDIR", "/tmp")) / "ps-throughput")
    service = ParameterService(directory, CREDENTIALS.verifier())
    zeros = np.zeros(stop - start, dtype=np.float32)
    service.partition.adopting(
        GENERATION, start, stop, size, "float32", 0.01, 0.0, 0, 0, (zeros, zeros.copy()), tables
    )
    server = ParameterServer(service).start()
    print(f"port {server.port}", flush=True)
    sys.stdin.read()
    server.stop(0.1)


def echoing(size: int) -> None:  # bytes
    """Child: receive `size` bytes, send them back, per connection round, until EOF."""
    listener = socket.create_server(("127.0.0.1", 0))
    print(f"port {listener.getsockname()[1]}", flush=True)
    connection, _ = listener.accept()
    buffer = bytearray(size)
    view = memoryview(buffer)
    while True:
        received = 0
        while received < size:
            count = connection.recv_into(view[received:], size - received)
            if count == 0:
                return
            received += count
        connection.sendall(view)


def child(argv: list[str]) -> tuple[subprocess.Popen[str], int]:
    process = subprocess.Popen(
        [sys.executable, __file__, *argv],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert process.stdout is not None
    line = process.stdout.readline()
    if not line.startswith("port "):
        raise RuntimeError(f"child {argv} did not start: {line!r}")
    return process, int(line.split()[1])


def socket_round(connection: socket.socket, data: memoryview, back: memoryview) -> float:
    started = time.perf_counter()
    connection.sendall(data)
    received = 0
    while received < len(back):
        received += connection.recv_into(back[received:], len(back) - received)
    return time.perf_counter() - started


def alternating(rounds: int, first: Callable[[], float], second: Callable[[], float]) -> None:
    """Run the two in alternating order (a b, b a, ...), after one warm-up each."""
    first()
    second()
    for index in range(rounds):
        for run in (first, second) if index % 2 == 0 else (second, first):
            run()


class Peers:
    """The servers (children holding the layout's pieces) and the echo process."""

    def __init__(self, args: argparse.Namespace, size: int, tables: tuple[Table, ...]) -> None:
        self.children: list[subprocess.Popen[str]] = []
        servers = []
        described = [str(x) for t in tables for x in (t.start, t.rows, t.row_length)]
        for index, piece in enumerate(
            laying_out(size, [(str(i), "") for i in range(args.servers)], tables)
        ):
            bounds = [str(piece.start), str(piece.stop), str(size)]
            _, port = self.child(
                ["--chunk-mb", str(args.chunk_mb), "--role", "server", "--range", *bounds]
                + (["--tables", *described] if described else [])
            )
            servers.append((str(index), f"127.0.0.1:{port}"))
        self.pieces = laying_out(size, servers, tables)
        self.links = Links(CREDENTIALS.worker("w0"), args.channels)

    def child(self, argv: list[str]) -> tuple[subprocess.Popen[str], int]:
        process, port = child(argv)
        self.children.append(process)
        return process, port

    def echo(self, size: int) -> socket.socket:
        _, port = self.child(["--role", "echo", "--echo-bytes", str(size)])
        return socket.create_connection(("127.0.0.1", port))

    def closing(self) -> None:
        self.links.closing()
        for process in self.children:
            if process.stdin:
                process.stdin.close()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()


def dense_case(args: argparse.Namespace) -> dict[str, object]:
    size = args.model_mb * 1_000_000 // 4
    peers = Peers(args, size, ())
    try:
        pieces, links = peers.pieces, peers.links
        connection = peers.echo(size * 4)
        gradient = np.full(size, 1e-3, dtype=np.float32)
        params = np.empty(size, dtype=np.float32)
        back = memoryview(bytearray(size * 4))
        data = memoryview(gradient).cast("B")
        step = 0
        phases: list[tuple[float, float, float]] = []
        ps_times, socket_times = [], []

        def ps_round() -> float:
            nonlocal step
            step += 1
            started = time.perf_counter()
            header = {"generation": GENERATION, "step": step, "contributor": 0, "contributors": 1}
            links.pushing(pieces, header, gradient)
            pushed = time.perf_counter()
            links.stepping(pieces, "Apply", GENERATION, step, 5.0)
            applied = time.perf_counter()
            mark = links.pulling(pieces, GENERATION, step, 30.0, params)
            if mark != step:
                raise RuntimeError(f"pulled step {mark}, expected {step}")
            ended = time.perf_counter()
            phases.append((pushed - started, applied - pushed, ended - applied))
            ps_times.append(ended - started)
            return ended - started

        def socket_timed() -> float:
            socket_times.append(socket_round(connection, data, back))
            return socket_times[-1]

        alternating(args.rounds, socket_timed, ps_round)
        if not np.allclose(params[:8], -0.01 * 1e-3 * step):
            raise RuntimeError("the pulled parameters do not hold the applied steps")
        connection.close()
    finally:
        peers.closing()
    ps_times, socket_times, phases = ps_times[1:], socket_times[1:], phases[1:]
    moved = 2 * size * 4
    ps_rate = moved / statistics.median(push + pull for push, _, pull in phases) / 1e9
    step_rate = moved / statistics.median(ps_times) / 1e9
    socket_rate = moved / statistics.median(socket_times) / 1e9
    return {
        "model_mb": args.model_mb,
        "ps_gb_s": round(ps_rate, 3),
        "socket_gb_s": round(socket_rate, 3),
        "ratio": round(ps_rate / socket_rate, 3),
        "step_gb_s": round(step_rate, 3),
        "step_ratio": round(step_rate / socket_rate, 3),
        "chunk_mb": args.chunk_mb,
        "servers": args.servers,
        "channels_per_server": args.channels,
        "rounds": args.rounds,
        "ps_round_s": round(statistics.median(ps_times), 4),
        "socket_round_s": round(statistics.median(socket_times), 4),
        "push_s": round(statistics.median(p[0] for p in phases), 4),
        "apply_s": round(statistics.median(p[1] for p in phases), 4),
        "pull_s": round(statistics.median(p[2] for p in phases), 4),
    }


def paddle_copies_s(table: Table, rows: np.ndarray, rounds: int) -> tuple[float, float]:
    """The Paddle worker's own copies per step, with its functions (`paddle.ps`; medians, s):
    of the touched rows (their gradient rows gathered from an embedding's weight and copied
    into the flat gradient, the pulled rows taken from the flat values and scattered into
    the weight), and of a dense parameter of the same bytes (`set_value` from the flat
    values, its gradient copied out)."""
    import paddle

    from trainer_runtime.paddle.ps import gradient_rows, viewing, writing_rows

    paddle.device.set_device("cpu")
    embedding = paddle.nn.Embedding(table.rows, table.row_length)
    embedding(paddle.to_tensor(rows)).sum().backward()
    weight = embedding.weight
    assert weight.grad is not None
    dense = paddle.create_parameter([rows.size, table.row_length], "float32")
    (dense * 2.0).sum().backward()
    assert dense.grad is not None
    flat = np.ones(table.stop, dtype=np.float32).reshape(-1, table.row_length)
    dense_flat = np.ones(rows.size * table.row_length, dtype=np.float32)
    rows_times, dense_times = [], []
    for _ in range(rounds):
        started = time.perf_counter()
        flat[rows] = gradient_rows(weight.grad, rows)
        writing_rows(weight, rows, np.take(flat, rows, axis=0))
        middle = time.perf_counter()
        dense.set_value(dense_flat.reshape(dense.shape))
        dense_flat[:] = viewing(dense.grad).reshape(-1)
        dense_times.append(time.perf_counter() - middle)
        rows_times.append(middle - started)
    return statistics.median(rows_times), statistics.median(dense_times)


def sparse_case(args: argparse.Namespace) -> dict[str, object]:
    table = Table(0, args.table_rows, args.row_length)
    size, touched = table.stop, max(1, int(args.table_rows * args.touched))
    row_bytes = table.row_length * 4
    peers = Peers(args, size, (table,))
    rng = np.random.default_rng(0)
    try:
        pieces, links = peers.pieces, peers.links
        connection = peers.echo(touched * row_bytes)
        gradient = np.full(size, 1e-3, dtype=np.float32)
        params = np.zeros(size, dtype=np.float32)
        outgoing = np.full(touched * table.row_length, 1e-3, dtype=np.float32)
        data = memoryview(outgoing).cast("B")
        back = memoryview(bytearray(touched * row_bytes))
        step = 0
        phases: list[tuple[float, float, float]] = []
        socket_times: list[float] = []

        def ps_round() -> float:
            nonlocal step
            step += 1
            rows = np.sort(rng.choice(table.rows, touched, replace=False)).astype(np.int64)
            started = time.perf_counter()
            header = {"generation": GENERATION, "step": step, "contributor": 0, "contributors": 1}
            links.pushing(pieces, header, gradient, (table,), {table: rows})
            pushed = time.perf_counter()
            links.stepping(pieces, "Apply", GENERATION, step, 5.0)
            applied = time.perf_counter()
            mark = links.pulling(pieces, GENERATION, step, 30.0, params, (table,), {table: rows})
            if mark != step:
                raise RuntimeError(f"pulled step {mark}, expected {step}")
            ended = time.perf_counter()
            phases.append((pushed - started, applied - pushed, ended - applied))
            first = params[rows[0] * table.row_length]
            if first >= 0:  # every pulled row was pushed at least once: it went down
                raise RuntimeError("the pulled rows do not hold the applied steps")
            return ended - started

        def socket_timed() -> float:
            socket_times.append(socket_round(connection, data, back))
            return socket_times[-1]

        alternating(args.rounds, socket_timed, ps_round)
        connection.close()
    finally:
        peers.closing()
    socket_times, phases = socket_times[1:], phases[1:]
    moved = 2 * touched * row_bytes
    ps_rate = moved / statistics.median(push + pull for push, _, pull in phases) / 1e9
    socket_rate = moved / statistics.median(socket_times) / 1e9
    sample = np.sort(rng.choice(table.rows, touched, replace=False)).astype(np.int64)
    rows_copy, dense_copy = paddle_copies_s(table, sample, 3)
    return {
        "case": "paddle-sparse",
        "table_rows": table.rows,
        "row_length": table.row_length,
        "touched_rows": touched,
        "touched_mb": round(touched * row_bytes / 1e6, 1),
        "ps_gb_s": round(ps_rate, 3),
        "socket_gb_s": round(socket_rate, 3),
        "paddle_sparse_ratio": round(ps_rate / socket_rate, 3),
        "servers": args.servers,
        "channels_per_server": args.channels,
        "rounds": args.rounds,
        "push_s": round(statistics.median(p[0] for p in phases), 4),
        "apply_s": round(statistics.median(p[1] for p in phases), 4),
        "pull_s": round(statistics.median(p[2] for p in phases), 4),
        "socket_round_s": round(statistics.median(socket_times), 4),
        "paddle_rows_copy_s": round(rows_copy, 4),
        "paddle_dense_copy_s": round(dense_copy, 4),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--case", choices=["all", "dense", "paddle-sparse"], default="all")
    parser.add_argument("--model-mb", type=int, default=100)
    parser.add_argument("--servers", type=int, default=2)
    parser.add_argument("--channels", type=int, default=2, help="streams per server")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--chunk-mb", type=float, default=1.0, help="MB per stream message")
    parser.add_argument("--table-rows", type=int, default=1_000_000)
    parser.add_argument("--row-length", type=int, default=64)
    parser.add_argument("--touched", type=float, default=0.1, help="share of rows a batch uses")
    parser.add_argument("--role", choices=["driver", "server", "echo"], default="driver")
    parser.add_argument("--range", type=int, nargs=3, metavar=("START", "STOP", "SIZE"))
    parser.add_argument("--tables", type=int, nargs="*", default=[], help="start rows length ...")
    parser.add_argument("--echo-bytes", type=int, default=0)
    args = parser.parse_args()
    transport.CHUNK_BYTES = ps_serving.CHUNK_BYTES = int(args.chunk_mb * 1024 * 1024)
    if args.role == "server":
        numbers = args.tables
        tables = tuple(Table(*numbers[i : i + 3]) for i in range(0, len(numbers), 3))
        start, stop, size = args.range
        serving(start, stop, size, tables)
        return
    if args.role == "echo":
        echoing(args.echo_bytes)
        return
    if args.case in ("all", "dense"):
        print(json.dumps(dense_case(args)), flush=True)
    if args.case in ("all", "paddle-sparse"):
        print(json.dumps(sparse_case(args)), flush=True)


if __name__ == "__main__":
    main()
