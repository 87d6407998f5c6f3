"""The coordinator API over real gRPC, in one process.

Aspects:
- a call with a wrong token is refused and changes nothing; so is one naming a worker, node
  or address longer than a Kubernetes name (a 3 MB id would grow every saved state);
- registration, the join window and the generation a worker is told;
- a stale-generation commit is rejected (fencing);
- a dropped watch stream (a dead worker) returns its leases to todo at once;
- drain requests reach the worker's watch, and it is told DRAINED;
- progress, throughput and the state snapshot the controller reads;
- an unreachable coordinator gives a clear error within the retry budget;
- a second coordinator on a port another one listens on is refused at start (it would share
  the port and answer the other job's calls), and the port is free again once it stops.
"""

from __future__ import annotations

import json
import time

import pytest

from trainer_runtime.client import (
    CoordinatorClient,
    CoordinatorError,
    CoordinatorUnreachable,
    Fenced,
    TokenRefused,
)
from trainer_runtime.coordinator.serving import CoordinatorServer, CoordinatorService
from trainer_runtime.coordinator.state import ConsumptionMode, CoordinatorState
from trainer_runtime.coordinator.storing import MemoryStore
from trainer_runtime.protocol import pb
from trainer_runtime.sharding import DatasetPlan, SampleRange, StepWindow

from .harness import TOKEN, VERIFIER, waiting_for


def client_of(server: CoordinatorServer, token: str = TOKEN) -> CoordinatorClient:
    return CoordinatorClient(server.address, token, timeout_s=2.0, retry_s=2.0)


def test_wrong_token_is_refused(coordinator: CoordinatorServer) -> None:
    intruder = client_of(coordinator, token="wrong")
    with pytest.raises(TokenRefused):
        intruder.register("w0", "n", "")
    assert coordinator.service.state.membership.workers == {}


def test_a_name_too_long_is_refused_and_kept_out_of_the_state(
    coordinator: CoordinatorServer,
) -> None:
    client = client_of(coordinator)
    for worker, node, address in (("w" * 3_000_000, "n", ""), ("w0", "n", "a" * 300)):
        with pytest.raises(CoordinatorError, match=r"INVALID_ARGUMENT.*more than 261"):
            client.register(worker, node, address)
    assert coordinator.service.state.membership.workers == {}
    client.register("w" * 253, "n" * 253, "")  # a Kubernetes name is fine
    assert list(coordinator.service.state.membership.workers) == ["w" * 253]


def test_registered_workers_enter_one_generation_together(coordinator: CoordinatorServer) -> None:
    client = client_of(coordinator)
    client.register("w0", "n", "a:1")
    client.register("w1", "n", "b:1")
    reply = client.awaiting_generation("w1", after=0, timeout_s=2.0)
    assert reply.status == pb.MEMBER
    assert reply.number == 1
    assert [m.worker_id for m in reply.members] == ["w0", "w1"]
    assert reply.rank == 1


def test_stale_generation_lease_is_fenced(coordinator: CoordinatorServer) -> None:
    client = client_of(coordinator)
    client.register("w0", "n", "")
    assert client.awaiting_generation("w0", 0, 2.0).number == 1
    client.register("w1", "n", "")
    waiting_for(lambda: coordinator.service.state.membership.generation == 2, 10.0, "gen 2")
    with pytest.raises(Fenced, match="stale"):
        client.lease_shard("w0", 1)


def test_group_commit_from_stale_generation_is_rejected() -> None:
    from trainer_runtime.coordinator.serving import CoordinatorService
    from trainer_runtime.coordinator.state import CoordinatorState
    from trainer_runtime.coordinator.storing import MemoryStore
    from trainer_runtime.sharding import DatasetPlan

    state = CoordinatorState.starting(DatasetPlan(8, 4, 1), join_window_s=0.05)
    server = CoordinatorServer(CoordinatorService(state, MemoryStore(), VERIFIER)).start()
    try:
        client = client_of(server)
        client.register("w0", "n", "")
        client.awaiting_generation("w0", 0, 2.0)
        first = state.ledger.todo[0]
        window = StepWindow(1, 0, (SampleRange(first.start, first.start + 2),))
        with pytest.raises(Fenced, match="stale"):
            client.commit("w0", 0, [window], 0.1)
        assert client.commit("w0", 1, [window], 0.1).committed_step == 1
    finally:
        server.stop(0.1)


def test_dropped_watch_returns_leases_to_todo(coordinator: CoordinatorServer) -> None:
    client = client_of(coordinator)
    client.register("w0", "n", "")
    client.awaiting_generation("w0", 0, 2.0)
    stream = client.watch("w0")
    assert next(stream).generation == 1
    lease = client.lease_shard("w0", 1).leases[0]
    state = coordinator.service.state
    assert state.ledger.leases
    started = time.monotonic()
    client.close()  # the process "dies": its connection drops
    # Back on the drop, not on the worker's lease expiry (10 s unheard): a bound well
    # inside that, and not one second, which a loaded machine can take to run the
    # server's thread that sees the stream end.
    expiry = state.membership.lease_timeout_s
    waiting_for(lambda: not state.ledger.leases, expiry / 2, "the lease to come back")
    assert time.monotonic() - started < expiry / 2
    assert state.ledger.todo[0] == SampleRange(lease.range.start, lease.range.stop)


def test_drain_reaches_the_watch_and_the_worker_is_told_to_leave(
    coordinator: CoordinatorServer,
) -> None:
    client = client_of(coordinator)
    client.register("w0", "n", "")
    client.register("w1", "n", "")
    client.awaiting_generation("w1", 0, 2.0)
    stream = client.watch("w1")
    next(stream)
    client.drain("w1")
    assert next(stream).draining
    assert client.awaiting_generation("w1", 1, 1.0).status == pb.DRAINED
    client.leave("w1")
    assert "w1" not in coordinator.service.state.membership.drained


def test_progress_throughput_and_snapshot(coordinator: CoordinatorServer) -> None:
    client = client_of(coordinator)
    client.register("w0", "n", "")
    client.awaiting_generation("w0", 0, 2.0)
    lease = client.lease_shard("w0", 1).leases[0]
    client.commit_leases("w0", [lease.lease_id], step_time_s=0.5)
    progress = client.progress()
    assert progress.samples_done == 4
    assert progress.samples_per_epoch == 40
    assert [m.worker_id for m in progress.members] == ["w0"]
    assert progress.throughput[0].workers == 1
    assert progress.throughput[0].samples_per_s == pytest.approx(8.0, rel=0.3)
    snapshot = json.loads(client.snapshot())
    assert snapshot["ledger"]["committed_step"] == 1


def test_unreachable_coordinator_fails_clearly_within_budget() -> None:
    client = CoordinatorClient("127.0.0.1:1", TOKEN, timeout_s=0.5, retry_s=1.0)
    started = time.monotonic()
    with pytest.raises(CoordinatorUnreachable, match="unreachable"):
        client.register("w0", "n", "")
    assert time.monotonic() - started < 5.0


def test_a_port_in_use_is_refused_not_shared(coordinator: CoordinatorServer) -> None:
    def second(port: int) -> CoordinatorServer:
        state = CoordinatorState.starting(DatasetPlan(40, 4, 1), ConsumptionMode.INDEPENDENT)
        return CoordinatorServer(CoordinatorService(state, MemoryStore(), VERIFIER), port=port)

    with pytest.raises(RuntimeError, match=str(coordinator.port)):
        second(coordinator.port)
    port = coordinator.port
    coordinator.stop(0.1)
    again = second(port).start()
    try:
        assert again.port == port
    finally:
        again.stop(0.1)
