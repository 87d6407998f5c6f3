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

Prints one JSON line:
`{"model_mb": 100, "ps_gb_s": ..., "socket_gb_s": ..., "ratio": ...}` (GB = 1e9 bytes),
with `ratio` = ps / socket, and the settings beside them.

Run: `python benchmarks/ps_throughput.py [--model-mb 100] [--servers 2] [--channels 2]
[--rounds 6]`. `--role server|echo` is internal (a child process).
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
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from trainer_runtime.protocol.credentials import Issuer, JobCredentials  # noqa: E402
from trainer_runtime.ps import serving as ps_serving  # noqa: E402
from trainer_runtime.ps import transport  # noqa: E402
from trainer_runtime.ps.layout import laying_out  # noqa: E402
from trainer_runtime.ps.serving import ParameterServer, ParameterService  # noqa: E402
from trainer_runtime.ps.snapshots import SnapshotDirectory  # noqa: E402
from trainer_runtime.ps.transport import Links  # noqa: E402

#: Derived from a fixed secret, so that the server processes this script starts (each
#: imports it anew) check the credentials the client holds: one machine, 127.0.0.1 only.
CREDENTIALS = JobCredentials(Issuer.from_secret("ps-throughput"), "ps-throughput")
GENERATION = 1


def serving(start: int, stop: int, size: int) -> None:
    """Child: one parameter server holding `[start, stop)`, until stdin closes."""
    directory = SnapshotDirectory(Path(os.environ.get("TMPDIR", "/tmp")) / "ps-throughput")
    service = ParameterService(directory, CREDENTIALS.verifier())
    zeros = np.zeros(stop - start, dtype=np.float32)
    service.partition.adopting(
        GENERATION, start, stop, size, "float32", 0.01, 0.0, 0, 0, (zeros, zeros.copy())
    )
    server = ParameterServer(service).start()
    print(f"port {server.port}", flush=True)
    sys.stdin.read()
    server.stop(0.1)


def echoing(size: int) -> None:
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


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model-mb", type=int, default=100)
    parser.add_argument("--servers", type=int, default=2)
    parser.add_argument("--channels", type=int, default=2, help="streams per server")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--chunk-mb", type=float, default=1.0, help="MB per stream message")
    parser.add_argument("--role", choices=["driver", "server", "echo"], default="driver")
    parser.add_argument("--range", type=int, nargs=3, metavar=("START", "STOP", "SIZE"))
    args = parser.parse_args()
    size = args.model_mb * 1_000_000 // 4
    transport.CHUNK_BYTES = ps_serving.CHUNK_BYTES = int(args.chunk_mb * 1024 * 1024)
    if args.role == "server":
        serving(*args.range)
        return
    if args.role == "echo":
        echoing(size * 4)
        return
    children = []
    try:
        servers = []
        for index, piece in enumerate(
            laying_out(size, [(str(i), "") for i in range(args.servers)])
        ):
            bounds = [str(piece.start), str(piece.stop), str(size)]
            process, port = child(
                ["--chunk-mb", str(args.chunk_mb), "--role", "server", "--range", *bounds]
            )
            children.append(process)
            servers.append((str(index), f"127.0.0.1:{port}"))
        echo, echo_port = child(["--role", "echo", "--model-mb", str(args.model_mb)])
        children.append(echo)
        pieces = laying_out(size, servers)
        links = Links(CREDENTIALS.worker("w0"), args.channels)
        gradient = np.full(size, 1e-3, dtype=np.float32)
        params = np.empty(size, dtype=np.float32)
        connection = socket.create_connection(("127.0.0.1", echo_port))
        back = memoryview(bytearray(size * 4))
        data = memoryview(gradient).cast("B")
        step = 0
        phases: list[tuple[float, float, float]] = []

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
            return ended - started

        ps_round()  # warm-up: connections, first buffers
        socket_round(connection, data, back)
        ps_times, socket_times = [], []
        for index in range(args.rounds):
            order = (socket_round, ps_round) if index % 2 == 0 else (ps_round, socket_round)
            for run in order:
                if run is ps_round:
                    ps_times.append(ps_round())
                else:
                    socket_times.append(socket_round(connection, data, back))
        if not np.allclose(params[:8], -0.01 * 1e-3 * step):
            raise RuntimeError("the pulled parameters do not hold the applied steps")
        moved = 2 * size * 4
        transfer_times = [push + pull for push, _, pull in phases[1:]]
        ps_rate = moved / statistics.median(transfer_times) / 1e9
        step_rate = moved / statistics.median(ps_times) / 1e9
        socket_rate = moved / statistics.median(socket_times) / 1e9
        print(
            json.dumps(
                {
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
            )
        )
        connection.close()
        links.closing()
    finally:
        for process in children:
            if process.stdin:
                process.stdin.close()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()


if __name__ == "__main__":
    main()
