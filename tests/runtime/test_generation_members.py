"""A generation's number names one member list, whoever asks for it and whenever.

A departure (a drain, a leave, a lost watch) takes its worker out of the members at once,
while the generation that replaces it opens at the coordinator's next tick. A worker that
asked for its generation in between was told the old number with the new, shorter member
list: in parameter-server mode it then pushed each step as one of 3 contributors where its
peers, told the same number earlier, pushed as one of 4, and the servers refused its push
("step 45 expects 4 contributions", the flake of
`test_ps_elastic.py::test_sync_ledger_is_exact_through_worker_and_server_resizes`).

Aspects (on the service's handlers, with no ticker thread, so the gap stays open):
- between a drain or a leave and the next tick, a worker late to the generation is told to
  wait, not the generation's number with members it did not open with;
- the tick then opens the next generation, and the late worker is told that one.
"""

from __future__ import annotations

from typing import Any

import grpc
import pytest

from trainer_runtime.coordinator.serving import CoordinatorService
from trainer_runtime.coordinator.state import CoordinatorState
from trainer_runtime.coordinator.storing import MemoryStore
from trainer_runtime.protocol import pb
from trainer_runtime.sharding import DatasetPlan

from .harness import VERIFIER

WORKERS = ("w0", "w1", "w2", "w3")


class Context:
    """What the coordinator's handlers use of a servicer context."""

    def is_active(self) -> bool:
        return True

    def abort(self, code: grpc.StatusCode, details: str) -> None:
        raise AssertionError(f"refused: {code.name}: {details}")


def opened_with_four() -> tuple[CoordinatorService, Any]:
    """A service whose generation 1 opened with `WORKERS`, and rank 0's answer for it."""
    state = CoordinatorState.starting(DatasetPlan(60, 10, 1), join_window_s=0.3)
    service = CoordinatorService(state, MemoryStore(), VERIFIER)
    for worker in WORKERS:
        state.registering(worker, "n", "", now=0.0)
    assert state.ticking(now=1.0)
    first = asking(service, "w0", after=0)
    assert (first.status, first.number) == (pb.MEMBER, 1)
    assert names(first) == list(WORKERS)
    return service, first


def asking(service: CoordinatorService, worker: str, after: int) -> Any:
    request = pb.AwaitGenerationRequest(worker_id=worker, after=after, timeout_s=0.0)
    return service.AwaitGeneration(request, Context())


def names(reply: Any) -> list[str]:
    return [m.worker_id for m in reply.members]


@pytest.mark.parametrize("departure", ["Drain", "Leave"])
def test_a_worker_late_to_a_generation_is_not_told_it_with_other_members(departure: str) -> None:
    service, first = opened_with_four()
    request = pb.DrainRequest if departure == "Drain" else pb.LeaveRequest
    getattr(service, departure)(request(worker_id="w3"), Context())
    late = asking(service, "w1", after=0)  # w1 had not asked for generation 1 yet
    if late.status == pb.MEMBER and late.number == first.number:
        assert names(late) == names(first), "one generation told with two member lists"
    assert late.status == pb.PENDING  # the replacing generation is due at the next tick
    assert service.state.ticking(now=1.02)
    following = asking(service, "w1", after=0)
    assert (following.status, following.number) == (pb.MEMBER, 2)
    assert names(following) == ["w0", "w1", "w2"]
    assert following.rank == 1
