"""A worker that starts before its coordinator listens (the controller may create both in
one cycle, and a loaded node can take long to start the coordinator).

Aspects:
- the worker's agent keeps retrying registration, with backoff, for the contract's whole
  timeout: a coordinator that starts listening several seconds late still gets it, and
  the worker becomes a member of the first generation;
- past the timeout it stops with `CoordinatorUnreachable`, not earlier and not much later.
"""

from __future__ import annotations

import socket
import threading
import time

import pytest

from trainer_runtime.agent import Outcome, WorkerAgent
from trainer_runtime.client import CoordinatorUnreachable
from trainer_runtime.coordinator.serving import CoordinatorServer, CoordinatorService
from trainer_runtime.coordinator.state import ConsumptionMode, CoordinatorState
from trainer_runtime.coordinator.storing import MemoryStore
from trainer_runtime.environment import WorkerContract
from trainer_runtime.sharding import DatasetPlan

from .harness import TOKEN, VERIFIER

LATE_S = 4.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def contract(port: int, timeout_s: float) -> WorkerContract:
    return WorkerContract(f"127.0.0.1:{port}", TOKEN, "job", "w0", "node", timeout_s=timeout_s)


def test_a_worker_waits_for_a_coordinator_that_listens_late() -> None:
    port = free_port()
    agent = WorkerAgent(contract(port, timeout_s=30.0))
    servers: list[CoordinatorServer] = []

    def listening_late() -> None:
        time.sleep(LATE_S)
        state = CoordinatorState.starting(
            DatasetPlan(40, 4, 1), ConsumptionMode.GROUP, join_window_s=0.05
        )
        servers.append(
            CoordinatorServer(CoordinatorService(state, MemoryStore(), VERIFIER), port=port)
        )
        servers[0].start()

    late = threading.Thread(target=listening_late)
    started = time.monotonic()
    late.start()
    try:
        agent.starting("127.0.0.1:1")  # retries while nothing listens
        assert time.monotonic() - started >= LATE_S - 0.5
        assignment = agent.awaiting_assignment()
        assert assignment.outcome is Outcome.MEMBER
        assert (assignment.generation, assignment.rank) == (1, 0)
    finally:
        late.join()
        agent.closing()
        for server in servers:
            server.stop(0.1)


def test_a_worker_gives_up_once_its_timeout_passed() -> None:
    agent = WorkerAgent(contract(free_port(), timeout_s=3.0))
    started = time.monotonic()
    with pytest.raises(CoordinatorUnreachable):
        agent.starting("127.0.0.1:1")
    took = time.monotonic() - started
    agent.closing()
    assert 3.0 <= took < 15.0, f"gave up after {took:.1f} s, not after its 3 s timeout"
