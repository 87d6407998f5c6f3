"""TLS between a job's processes (``trainer_runtime/protocol/tls.py``).

Aspects tested:
- the job's key and certificate are derived from its secret, byte for byte the same each
  time, and another secret gives another; clients get the certificate without the key;
- a coordinator serving TLS answers a client that trusts the job's certificate, and neither
  a plaintext client nor one that trusts another job's certificate; so does a parameter
  server;
- a real coordinator process and real worker processes given the TLS variables train a
  job to the end, every sample once;
- a server told to serve TLS without its key refuses to start, saying which variable;
- the kubelet's health probe speaks TLS where the server does (its container's
  ``EDL_TLS_CERT``), and gets no answer in plaintext.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import grpc
import pytest

from trainer_runtime.client import CoordinatorClient, CoordinatorUnreachable
from trainer_runtime.coordinator.serving import CoordinatorServer, CoordinatorService
from trainer_runtime.coordinator.state import ConsumptionMode, CoordinatorState
from trainer_runtime.coordinator.storing import MemoryStore
from trainer_runtime.protocol import TOKEN_HEADER
from trainer_runtime.protocol import ps_pb2 as ps
from trainer_runtime.protocol.health import SERVING, check
from trainer_runtime.protocol.health_probe import main as probe_main
from trainer_runtime.protocol.parameter_server import PS_SERVICE
from trainer_runtime.protocol.tls import CERT_ENV, KEY_ENV, JobTls, opening_channel
from trainer_runtime.ps.serving import ParameterServer, ParameterService
from trainer_runtime.ps.snapshots import SnapshotDirectory
from trainer_runtime.sharding import DatasetPlan

from .harness import REPO, TOKEN, TRUST, VERIFIER, Cluster

JOB_TLS = JobTls.derived("the job's secret")


def test_the_certificate_is_derived_the_same_each_time() -> None:
    again = JobTls.derived("the job's secret")
    assert again == JOB_TLS and JOB_TLS.key_pem is not None
    other = JobTls.derived("another job's secret")
    assert other.cert_pem != JOB_TLS.cert_pem and other.key_pem != JOB_TLS.key_pem
    assert JOB_TLS.for_clients() == JobTls(JOB_TLS.cert_pem)
    assert JOB_TLS.for_clients().environ() == {CERT_ENV: JOB_TLS.cert_pem}


def _coordinator(tls: JobTls) -> CoordinatorServer:
    state = CoordinatorState.starting(
        DatasetPlan(40, 4, 1), ConsumptionMode.INDEPENDENT, join_window_s=0.05
    )
    return CoordinatorServer(CoordinatorService(state, MemoryStore(), VERIFIER), tls=tls).start()


def test_a_tls_coordinator_answers_its_jobs_clients_only() -> None:
    server = _coordinator(JOB_TLS)
    try:
        trusted = CoordinatorClient(server.address, TOKEN, 2.0, 2.0, tls=JOB_TLS.for_clients())
        trusted.register("w0", "n", "")
        assert list(server.service.state.membership.workers) == ["w0"]
        plaintext = CoordinatorClient(server.address, TOKEN, 0.5, 1.0)
        stranger = JobTls.derived("another job's secret").for_clients()
        misled = CoordinatorClient(server.address, TOKEN, 0.5, 1.0, tls=stranger)
        for client in (plaintext, misled):
            with pytest.raises(CoordinatorUnreachable):
                client.register("w1", "n", "")
            client.close()
        assert list(server.service.state.membership.workers) == ["w0"]
        trusted.close()
    finally:
        server.stop(0.1)


def test_a_tls_parameter_server_answers_its_jobs_clients_only(tmp_path: Path) -> None:
    service = ParameterService(SnapshotDirectory(tmp_path), VERIFIER)
    server = ParameterServer(service, "127.0.0.1", 0, 2, tls=JOB_TLS).start()
    address = f"127.0.0.1:{server.port}"
    try:
        for tls, answered in ((JOB_TLS.for_clients(), True), (None, False)):
            channel = opening_channel(address, [], tls)
            release = channel.unary_unary(
                f"/{PS_SERVICE}/Release",
                request_serializer=ps.FenceRequest.SerializeToString,
                response_deserializer=ps.Empty.FromString,
            )
            try:
                release(ps.FenceRequest(), metadata=((TOKEN_HEADER, TOKEN),), timeout=2)
                assert answered
            except grpc.RpcError as error:
                assert not answered and error.code() is grpc.StatusCode.UNAVAILABLE
            channel.close()
    finally:
        server.stop(0.1)


def test_real_processes_train_over_tls(cluster: Cluster) -> None:
    servers = JOB_TLS.environ()
    cluster.starting_coordinator(
        "--samples", "40", "--shard-size", "4", "--mode", "independent", extra=servers
    )
    clients = JOB_TLS.for_clients().environ()
    for name in ("w0", "w1"):
        argv = ["-m", "trainer_runtime.plain_worker", "--step-time-s", "0.01"]
        cluster.starting_worker(name, argv, clients)
    for name in ("w0", "w1"):
        assert cluster.waiting_exit(name, 60) == 0, cluster.log(name)
    client = CoordinatorClient(
        f"127.0.0.1:{cluster.port}", TOKEN, 5.0, 20.0, tls=JOB_TLS.for_clients()
    )
    progress = client.progress()
    assert progress.finished and progress.samples_done == 40
    client.close()


def test_a_server_told_to_serve_tls_without_its_key_refuses_to_start() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "trainer_runtime.coordinator", "--samples", "8"],
        env={**TRUST, **JOB_TLS.for_clients().environ(), "PYTHONPATH": str(REPO),
             "PATH": "/usr/bin:/bin"},
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert KEY_ENV in result.stderr and "Traceback" not in result.stderr


def test_the_health_probe_speaks_tls_where_the_servers_do(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    server = _coordinator(JOB_TLS)
    try:
        assert probe_main(["--port", str(server.port), "--timeout", "1"]) == 1  # plaintext
        assert "no answer" in capsys.readouterr().err
        monkeypatch.setenv(CERT_ENV, JOB_TLS.cert_pem)  # as in the server's container
        assert probe_main(["--port", str(server.port)]) == 0
        assert check(server.address, 2.0, JOB_TLS.for_clients()) == SERVING
    finally:
        server.stop(0.1)
