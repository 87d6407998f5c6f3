"""A worker started before its coordinator listens (the controller creates both in one act).

Aspects:
- its registration retries until the coordinator listens and then succeeds: no failure, and
  it is a member of the first generation;
- the pauses between tries stay short and bounded (20 ms doubling to 100 ms, the channel's
  reconnection back-off alike), so it joins within about 0.1 s of the coordinator
  listening, and a worker's whole timeout is spent trying, not sleeping;
- a watch refused for the worker's token is an error line and stops the worker, not a
  silent retry.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from typing import Any

import pytest
from tenacity import RetryCallState

from trainer_runtime import client as client_module
from trainer_runtime.agent import WorkerAgent
from trainer_runtime.client import CoordinatorClient, TokenRefused
from trainer_runtime.coordinator.serving import CoordinatorServer, CoordinatorService
from trainer_runtime.coordinator.state import ConsumptionMode, CoordinatorState
from trainer_runtime.coordinator.storing import MemoryStore
from trainer_runtime.environment import WorkerContract
from trainer_runtime.protocol import pb
from trainer_runtime.sharding import DatasetPlan

from .harness import TOKEN, VERIFIER


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_a_worker_started_before_its_coordinator_registers_once_it_listens() -> None:
    port = free_port()
    client = CoordinatorClient(f"127.0.0.1:{port}", TOKEN, timeout_s=2.0, retry_s=20.0)
    outcome: dict[str, Any] = {}

    def registering() -> None:
        try:
            client.register("w0", "n", "")
            outcome["registered_at"] = time.monotonic()
        except Exception as error:  # the test reports it below
            outcome["error"] = error

    worker = threading.Thread(target=registering, daemon=True)
    worker.start()
    time.sleep(0.8)  # the worker tries against nothing meanwhile
    assert "error" not in outcome and "registered_at" not in outcome
    state = CoordinatorState.starting(
        DatasetPlan(40, 4, 1), ConsumptionMode.INDEPENDENT, join_window_s=0.05
    )
    server = CoordinatorServer(
        CoordinatorService(state, MemoryStore(), VERIFIER), port=port
    ).start()
    try:
        worker.join(15)
        assert "error" not in outcome, outcome.get("error")
        assert "registered_at" in outcome
        reply = client.awaiting_generation("w0", after=0, timeout_s=5.0)
        assert reply.status == pb.MEMBER and reply.number == 1
    finally:
        client.close()
        server.stop(0.1)


def test_the_pauses_between_tries_are_short_and_bounded() -> None:
    pauses = []
    for attempt in range(1, 400):
        state = RetryCallState(None, None, (), {})
        state.attempt_number = attempt
        pauses.append(client_module.RETRY_PAUSES(state))
    assert pauses[0] <= 0.02 and max(pauses) <= 0.1
    assert sum(pauses) >= 30.0, "a 30 s timeout must be spent in tries every 0.1 s at most"


def test_a_watch_refused_for_its_token_stops_the_worker_with_an_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The token is checked on every call: a worker whose token the coordinator refuses
    (rotated, or another job's) says so in an error line and stops at its next step
    boundary, instead of reopening the watch forever in silence."""
    state = CoordinatorState.starting(
        DatasetPlan(40, 4, 1), ConsumptionMode.INDEPENDENT, join_window_s=0.05
    )
    server = CoordinatorServer(CoordinatorService(state, MemoryStore(), VERIFIER)).start()
    contract = WorkerContract(
        f"127.0.0.1:{server.port}", "another job's token", "job", "w0", "n", timeout_s=5.0
    )
    agent = WorkerAgent(contract)
    try:
        with caplog.at_level(logging.ERROR, logger="trainer_runtime.agent"):
            agent.watcher.start()  # (registration is refused too; the watch alone here)
            agent.watcher.join(10)
        assert not agent.watcher.is_alive()
        assert isinstance(agent.refused, TokenRefused) and agent.changed()
        assert any("refuses this worker's token" in r.getMessage() for r in caplog.records)
        with pytest.raises(TokenRefused):
            agent.awaiting_assignment()
    finally:
        agent.closing()
        server.stop()
