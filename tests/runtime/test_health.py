"""The standard gRPC health service of the coordinator and the parameter server
(``trainer_runtime.protocol.health``), and the probe the kubelet runs (``health_probe``).

Aspects tested:
- the coordinator answers ``Check`` and ``Watch`` SERVING without the job's token, while its
  own API still refuses a call without it; it tells nothing else: another service name is
  NOT_FOUND, ``List`` is unimplemented;
- after a save that keeps failing (the coordinator stops), ``Check`` answers NOT_SERVING at
  once and an open ``Watch`` is told; NOT_SERVING too once the server starts to stop;
- the parameter server answers SERVING without the token, NOT_SERVING once it stops;
- ``python -m trainer_runtime.protocol.health_probe``: exit 0 on SERVING, 1 on NOT_SERVING
  and on no answer, with one line saying which; ``--host-env`` takes the address from the
  environment.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from trainer_runtime.client import CoordinatorClient, CoordinatorUnreachable
from trainer_runtime.coordinator.serving import CoordinatorServer
from trainer_runtime.protocol import METHODS, SERVICE
from trainer_runtime.protocol.health import NOT_SERVING, SERVING, check
from trainer_runtime.protocol.health_probe import main as probe_main
from trainer_runtime.ps.serving import ParameterServer, ParameterService
from trainer_runtime.ps.snapshots import SnapshotDirectory

from .harness import REPO, TOKEN, waiting_for
from .test_coordinator_faults import FlakyStore, _serve


@pytest.fixture
def coordinator(tmp_path: Path) -> Iterator[tuple[CoordinatorServer, FlakyStore]]:
    store = FlakyStore(tmp_path / "state.json")
    server = _serve(store)
    try:
        yield server, store
    finally:
        server.stop()


def stub(address: str) -> Any:
    return health_pb2_grpc.HealthStub(grpc.insecure_channel(address))


def test_coordinator_is_serving_without_a_token_and_tells_nothing_else(
    coordinator: tuple[CoordinatorServer, FlakyStore],
) -> None:
    server, _ = coordinator
    health = stub(server.address)
    # No metadata at all: what the kubelet's gRPC probe sends.
    assert health.Check(health_pb2.HealthCheckRequest(), timeout=2).status == SERVING
    watch = health.Watch(health_pb2.HealthCheckRequest(), timeout=2)
    assert next(watch).status == SERVING
    watch.cancel()
    for asked in (SERVICE, "grpc.health.v1.Health", "anything"):
        with pytest.raises(grpc.RpcError) as unknown:
            health.Check(health_pb2.HealthCheckRequest(service=asked), timeout=2)
        assert unknown.value.code() == grpc.StatusCode.NOT_FOUND
    with pytest.raises(grpc.RpcError) as listed:
        health.List(health_pb2.HealthListRequest(), timeout=2)
    assert listed.value.code() == grpc.StatusCode.UNIMPLEMENTED
    # The coordinator's own API still wants the token.
    shape = METHODS["GetProgress"]
    call = grpc.insecure_channel(server.address).unary_unary(
        shape.path("GetProgress"),
        request_serializer=shape.request.SerializeToString,
        response_deserializer=shape.reply.FromString,
    )
    with pytest.raises(grpc.RpcError) as refused:
        call(shape.request(), timeout=2)
    assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED


def test_coordinator_is_not_serving_once_a_save_failed_for_good(
    coordinator: tuple[CoordinatorServer, FlakyStore],
) -> None:
    server, store = coordinator
    health = stub(server.address)
    watch = health.Watch(health_pb2.HealthCheckRequest(), timeout=10)
    seen: list[int] = []

    def watching() -> None:
        try:
            seen.extend(m.status for m in watch)
        except grpc.RpcError as error:  # cancelled below, once told
            assert error.code() == grpc.StatusCode.CANCELLED

    watcher = threading.Thread(target=watching)
    watcher.start()
    waiting_for(lambda: seen == [SERVING], 5.0, "the watch's first answer")
    store.fail = 10**6
    with pytest.raises(CoordinatorUnreachable):
        CoordinatorClient(server.address, TOKEN, timeout_s=1.0, retry_s=1.0).register("w", "n", "")
    assert server.service.failure is not None
    assert check(server.address, 2.0) == NOT_SERVING  # at once, not after a thread's turn
    waiting_for(lambda: seen[-1:] == [NOT_SERVING], 5.0, "the watch to be told")
    watch.cancel()
    watcher.join(5)


def test_coordinator_is_not_serving_while_it_stops(
    coordinator: tuple[CoordinatorServer, FlakyStore],
) -> None:
    server, _ = coordinator
    assert check(server.address, 2.0) == SERVING
    server.service.stopping.set()  # what ``stop`` does first, before the server goes
    assert check(server.address, 2.0) == NOT_SERVING


def test_parameter_server_is_serving_until_it_stops(tmp_path: Path) -> None:
    server = ParameterServer(ParameterService(SnapshotDirectory(tmp_path), TOKEN)).start()
    try:
        assert check(server.address, 2.0) == SERVING
        server.stopping.set()  # what ``stop`` and a releasing ``__main__`` do first
        assert check(server.address, 2.0) == NOT_SERVING
    finally:
        server.stop(0.1)


def test_probe_exits_zero_only_on_serving(
    coordinator: tuple[CoordinatorServer, FlakyStore],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    server, _ = coordinator
    assert probe_main(["--port", str(server.port)]) == 0
    assert "SERVING" in capsys.readouterr().out
    monkeypatch.setenv("EDL_WORKER_HOST", "127.0.0.1")
    assert probe_main(["--port", str(server.port), "--host-env", "EDL_WORKER_HOST"]) == 0
    server.service.stopping.set()
    assert probe_main(["--port", str(server.port)]) == 1
    assert "NOT_SERVING" in capsys.readouterr().out
    server.stop()
    assert probe_main(["--port", str(server.port), "--timeout", "0.5"]) == 1
    assert "no answer" in capsys.readouterr().err


def test_probe_runs_as_the_kubelet_runs_it(
    coordinator: tuple[CoordinatorServer, FlakyStore],
) -> None:
    """The module as a command, which is what the exec probe runs."""
    server, _ = coordinator
    done = subprocess.run(
        [sys.executable, "-m", "trainer_runtime.protocol.health_probe", "--port",
         str(server.port)],
        capture_output=True, text=True, timeout=30, check=False, cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    assert (done.returncode, done.stdout.strip()) == (0, f"127.0.0.1:{server.port}: SERVING")
