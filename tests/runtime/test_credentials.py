"""Credentials: each caller acts only as what its launcher made it.

Aspects tested:
- a credential verifies only with its issuer's key, for the job it names; one altered,
  forged, of another job or of another key, or too long, is refused and changes nothing;
- a worker's credential acts only for its own worker id (register, commit, leave) and calls
  no controller method (target, drain, snapshot; it may read progress); the controller's
  may do both;
- a worker's credential cannot register a parameter server, nor a server's a worker;
- the parameter servers accept any credential of their job, and no other;
- the command line makes keys and credentials and refuses bad input with exit 2.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import grpc
import pytest

from trainer_runtime.client import CoordinatorClient, TokenRefused
from trainer_runtime.coordinator.serving import CoordinatorServer, CoordinatorService
from trainer_runtime.coordinator.state import CoordinatorState
from trainer_runtime.coordinator.storing import MemoryStore
from trainer_runtime.protocol import TOKEN_HEADER
from trainer_runtime.protocol import ps_pb2 as ps
from trainer_runtime.protocol.credentials import (
    CACHE_SIZE,
    CallerRole,
    Claims,
    Issuer,
    JobCredentials,
    Verifier,
)
from trainer_runtime.protocol.parameter_server import PS_SERVICE
from trainer_runtime.ps.serving import ParameterServer, ParameterService
from trainer_runtime.ps.snapshots import SnapshotDirectory
from trainer_runtime.sharding import DatasetPlan

from .harness import CREDENTIALS, REPO, TOKEN, VERIFIER


def client(server: CoordinatorServer, credential: str) -> CoordinatorClient:
    return CoordinatorClient(server.address, credential, timeout_s=2.0, retry_s=2.0)


def test_a_credential_says_what_it_was_issued_for() -> None:
    assert VERIFIER.claims(CREDENTIALS.worker("w0")) == Claims("test-job", CallerRole.WORKER, "w0")
    assert VERIFIER.claims(CREDENTIALS.server("ps0")) == Claims(
        "test-job", CallerRole.SERVER, "ps0"
    )
    assert VERIFIER.claims(TOKEN) == Claims("test-job", CallerRole.CONTROLLER, "")
    with pytest.raises(ValueError, match="needs a worker id"):
        CREDENTIALS.issuer.issue("test-job", CallerRole.WORKER)
    with pytest.raises(ValueError, match="names no worker id"):
        CREDENTIALS.issuer.issue("test-job", CallerRole.CONTROLLER, "w0")


def _altered(text: str) -> str:
    """``text`` with one character in its middle changed: every bit of it is data (the
    last characters of a base64 text carry padding bits, and the last byte of an Ed25519
    signature is often small, so "...AA" may decode to the same signature)."""
    at = len(text) // 2
    return text[:at] + ("B" if text[at] == "A" else "A") + text[at + 1 :]


def test_altered_forged_foreign_or_oversized_credentials_are_refused() -> None:
    genuine = CREDENTIALS.worker("w0")
    prefix, claims, signature = genuine.split(".")
    stolen_claims = CREDENTIALS.worker("w1").split(".")[1]
    other_key = Issuer.generate()
    refused = [
        None,
        "",
        "wrong",
        f"{prefix}.{stolen_claims}.{signature}",  # w1's claims under w0's signature
        f"{prefix}.{claims}.{_altered(signature)}",
        f"edl0.{claims}.{signature}",
        other_key.issue("test-job", CallerRole.CONTROLLER),  # another launcher
        CREDENTIALS.issuer.issue("other-job", CallerRole.CONTROLLER),  # another job
        f"{genuine}.{'x' * 2000}",
        "\u00e9" * 40,
    ]
    for credential in refused:
        assert VERIFIER.claims(credential) is None, credential
    assert Verifier(CREDENTIALS.issuer.public_text(), "other-job").claims(genuine) is None


def test_the_cache_of_checked_credentials_stays_bounded() -> None:
    verifier = CREDENTIALS.verifier()
    for number in range(CACHE_SIZE + 10):
        assert verifier.claims(f"edl1.forged{number}.x") is None
    assert len(verifier._known) <= CACHE_SIZE
    assert verifier.claims(CREDENTIALS.worker("w0")) is not None


def test_a_worker_acts_only_for_itself(coordinator: CoordinatorServer) -> None:
    w0, w1 = client(coordinator, CREDENTIALS.worker("w0")), client(coordinator, TOKEN)
    w0.register("w0", "n", "")
    w1.register("w1", "n", "")
    with pytest.raises(TokenRefused, match="cannot act for 'w1'"):
        w0.leave("w1")
    with pytest.raises(TokenRefused, match="cannot act for 'w2'"):
        w0.register("w2", "n", "")
    generation = w0.awaiting_generation("w0", 0, 5.0).number
    with pytest.raises(TokenRefused, match="cannot act for 'w1'"):
        w0.commit("w1", generation, [], 0.1)
    for call in (
        lambda: w0.set_target(1000),
        lambda: w0.drain("w1"),
        w0.snapshot,
    ):
        with pytest.raises(TokenRefused, match="for the job's controller"):
            call()
    members = coordinator.service.state.membership
    assert sorted(members.workers) == ["w0", "w1"] and members.target is None
    assert not members.drained
    assert w0.progress().generation == generation  # the job's progress it may read
    w0.leave("w0")  # its own
    client(coordinator, TOKEN).set_target(2)  # the controller's
    assert members.target == 2


def test_a_role_registers_only_as_itself() -> None:
    state = CoordinatorState.starting(DatasetPlan(40, 4, 1), join_window_s=0.05)
    coordinator = CoordinatorServer(CoordinatorService(state, MemoryStore(), VERIFIER)).start()
    try:
        _registering_roles(coordinator)
    finally:
        coordinator.stop(0.1)


def _registering_roles(coordinator: CoordinatorServer) -> None:
    with pytest.raises(TokenRefused, match="cannot register as another role"):
        client(coordinator, CREDENTIALS.worker("w0")).register("w0", "n", "a:1", server=True)
    with pytest.raises(TokenRefused, match="cannot register as another role"):
        client(coordinator, CREDENTIALS.server("ps0")).register("ps0", "n", "a:1")
    client(coordinator, CREDENTIALS.server("ps0")).register("ps0", "n", "a:1", server=True)
    membership = coordinator.service.state.membership
    assert list(membership.servers) == ["ps0"] and not membership.workers


def test_parameter_servers_take_any_credential_of_their_job_only(tmp_path: Path) -> None:
    service = ParameterService(SnapshotDirectory(tmp_path), VERIFIER)
    server = ParameterServer(service, "127.0.0.1", 0, 2).start()
    try:
        channel = grpc.insecure_channel(f"127.0.0.1:{server.port}")
        release = channel.unary_unary(
            f"/{PS_SERVICE}/Release",
            request_serializer=ps.FenceRequest.SerializeToString,
            response_deserializer=ps.Empty.FromString,
        )
        foreign = JobCredentials(Issuer.generate(), "test-job").worker("w0")
        with pytest.raises(grpc.RpcError) as refused:
            release(ps.FenceRequest(), metadata=((TOKEN_HEADER, foreign),), timeout=5)
        assert refused.value.code() is grpc.StatusCode.UNAUTHENTICATED
        release(ps.FenceRequest(), metadata=((TOKEN_HEADER, CREDENTIALS.worker("w3")),), timeout=5)
        channel.close()
    finally:
        server.stop(0.1)


def _credentials_tool(*args: str, key: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("EDL_SIGNING_KEY", None)
    if key is not None:
        env["EDL_SIGNING_KEY"] = key
    return subprocess.run(
        [sys.executable, "-m", "trainer_runtime.protocol.credentials", *args],
        env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def test_the_command_line_makes_keys_and_credentials() -> None:
    key = _credentials_tool("new-key").stdout.strip()
    public = _credentials_tool("public-key", key=key).stdout.strip()
    credential = _credentials_tool("issue", "j", "worker", "w0", key=key).stdout.strip()
    assert Verifier(public, "j").claims(credential) == Claims("j", CallerRole.WORKER, "w0")
    for args, key_given, said in (
        (("issue", "j", "boss", "w0"), key, "ROLE is one of worker, server, controller"),
        (("issue", "j", "worker"), key, "needs a worker id"),
        (("public-key",), None, "EDL_SIGNING_KEY: not an EDL signing key"),
        (("sign",), key, "usage:"),
    ):
        result = _credentials_tool(*args, key=key_given)
        assert result.returncode == 2 and said in result.stderr, result.stderr
        assert "Traceback" not in result.stderr
