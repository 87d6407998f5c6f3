"""Keeping the live group when a generation only loses members (`trainer_runtime.torch.
shrinking`), and not sending rank 0's state to members that hold it.

NCCL's shrink needs a GPU; gloo has none. So the multi-process tests run the session's own
path with a stand-in shrink on gloo (`torch_job.standing_in_shrink`: the survivors alone
build a group of their own in the old group's store, as NCCL's shrink leaves them one),
and the rule, the agreement and the fall-back are tested as they are.

Aspects:
- which generations may shrink: only members of the previous one, in its order, at least
  one gone, its rank 0 kept;
- every member of an attempt takes the same path: one that could not shrink, whose shrink
  failed, or that never reported, makes all of them build a new group, in the same
  attempt (one verdict, which a member that reports late reads too);
- through a drain the survivors shrink and are not sent the state they hold; after a
  SIGKILL (a broken group) they build anew; a newcomer is sent the state; the ledger stays
  exact;
- a shrink that fails on one member: all build anew, the ledger stays exact;
- NCCL's own calls, with a fake backend (CPU builds have no NCCL): a healthy group that can
  shrink does so by its backend's `shrink` (leavers sorted), and the survivors' group keeps
  the device and the store; a failed or unable one (or a gloo one) is built anew.
"""

from __future__ import annotations

import datetime
import json
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch._C._distributed_c10d import ErrorType, ProcessGroupGloo

from trainer_runtime.agent import Assignment, Outcome, Peer
from trainer_runtime.torch.groups import Group, building
from trainer_runtime.torch.shrinking import (
    agreed,
    confirming,
    leavers,
    nccl_shrinking,
    offering,
    shrinker_for,
    shrinking,
)

from .harness import Cluster, waiting_for
from .test_torch_elastic import coordinator_args, job_args, reference_parameters


def generation(number: int, *workers: str) -> Assignment:
    peers = tuple(
        Peer(worker, rank, f"127.0.0.1:{9000 + rank}") for rank, worker in enumerate(workers)
    )
    return Assignment(Outcome.MEMBER, number, 0, peers)


@pytest.mark.parametrize(
    ("before", "after", "expected"),
    [
        (("a", "b", "c", "d"), ("a", "b", "d"), [2]),
        (("a", "b", "c", "d"), ("a", "c"), [1, 3]),
        (("a", "b"), ("a",), [1]),
        (("a", "b", "c"), ("b", "c"), None),  # rank 0 leaves: its process held the store
        (("a", "b", "c"), ("a", "b", "e"), None),  # a newcomer
        (("a", "b", "c"), ("a", "b", "c"), None),  # nobody left
        (("a", "b", "c"), ("a", "c", "b"), None),  # a new order
    ],
)
def test_a_generation_shrinks_only_when_it_keeps_members_in_order(
    before: tuple[str, ...], after: tuple[str, ...], expected: list[int] | None
) -> None:
    assert leavers(generation(4, *before), generation(5, *after)) == expected


def test_no_shrink_without_a_previous_group_or_to_an_older_generation() -> None:
    assert leavers(None, generation(5, "a")) is None
    assert leavers(generation(5, "a", "b"), generation(5, "a")) is None


def test_members_shrink_only_when_all_offered() -> None:
    store = dist.HashStore()
    offering(store)
    assert not agreed(store, 2)
    offering(store)
    assert agreed(store, 2)


def alone(name: str) -> Group:
    """A one-member gloo group: what a shrinker returns here (no collective runs on it)."""
    timeout = datetime.timedelta(seconds=5)
    return building(dist.HashStore(), 0, 1, torch.device("cpu"), timeout, name)


def test_one_failed_shrink_makes_every_member_build_anew() -> None:
    store = dist.HashStore()
    verdicts: list[Group | None] = []

    def failing(live: Group, excluded: list[int]) -> Group:
        raise RuntimeError("refused")

    def fine(live: Group, excluded: list[int]) -> Group:
        return alone("shrunk")

    deadline = time.monotonic() + 10
    other = threading.Thread(
        target=lambda: verdicts.append(shrinking(store, failing, alone("a"), [2], 2, deadline))
    )
    other.start()
    verdicts.append(shrinking(store, fine, alone("b"), [2], 2, deadline))
    other.join(10)
    assert verdicts == [None, None]


def test_when_every_member_shrank_each_keeps_its_shrunk_group() -> None:
    store = dist.HashStore()
    kept: dict[str, str | None] = {}

    def fine(live: Group, excluded: list[int]) -> Group:
        return alone(live.name + "/shrunk")

    def member(name: str) -> None:
        shrunk = shrinking(store, fine, alone(name), [2], 2, time.monotonic() + 10)
        kept[name] = None if shrunk is None else shrunk.name

    other = threading.Thread(target=member, args=("a",))
    other.start()
    member("b")
    other.join(10)
    assert kept == {"a": "a/shrunk", "b": "b/shrunk"}


def test_only_a_live_nccl_group_is_offered_a_shrink() -> None:
    assert shrinker_for(None) is None  # no live group (a newcomer, a broken group)
    assert shrinker_for(alone("gloo")) is None  # gloo cannot shrink: it builds anew


class FakeNcclBackend:
    """What `shrinker_for` and `nccl_shrinking` ask of an NCCL backend (CPU builds have
    none): its health, whether it can shrink, and the shrink, which returns a real
    one-member gloo backend standing in for the survivors' communicator."""

    def __init__(self, error: ErrorType = ErrorType.SUCCESS, can: bool = True) -> None:
        self.error, self.supports_shrinking = error, can
        self.asked: list[list[int]] = []

    def get_error(self) -> ErrorType:
        return self.error

    def shrink(self, excluded: list[int]) -> object:
        self.asked.append(excluded)
        return ProcessGroupGloo(dist.HashStore(), 0, 1, datetime.timedelta(seconds=5))


@dataclass
class FakeNcclGroup:
    """A live NCCL group of three, rank 1 here, as `Group` looks to the shrink."""

    fake: FakeNcclBackend
    store: dist.Store = field(default_factory=dist.HashStore)
    device: torch.device = field(default_factory=lambda: torch.device("cuda", 0))
    name: str = "job/g4"
    rank: int = 1
    size: int = 3
    is_nccl: bool = True

    def backend(self) -> FakeNcclBackend:
        return self.fake


def test_an_nccl_group_shrinks_by_its_backend_and_keeps_its_device_and_store() -> None:
    fake = FakeNcclBackend()
    live = FakeNcclGroup(fake)
    shrinker = shrinker_for(live)  # type: ignore[arg-type]
    assert shrinker is nccl_shrinking
    shrunk = shrinker(live, [2, 0])  # type: ignore[arg-type]
    assert fake.asked == [[0, 2]]  # sorted, as torch's own shrink passes them
    assert (shrunk.rank, shrunk.size, shrunk.name) == (0, 1, "job/g4/shrunk")
    assert shrunk.device == live.device and shrunk.pg.bound_device_id == live.device


@pytest.mark.parametrize(
    "fake",
    [
        FakeNcclBackend(error=ErrorType.COMM_ERROR),  # the watchdog aborted it: build anew
        FakeNcclBackend(can=False),  # an NCCL older than 2.27
    ],
)
def test_a_failed_or_unable_nccl_group_is_not_offered_a_shrink(fake: FakeNcclBackend) -> None:
    assert shrinker_for(FakeNcclGroup(fake)) is None  # type: ignore[arg-type]


def test_a_member_that_never_reports_makes_all_build_anew_even_if_it_comes_late() -> None:
    """At the deadline the members that reported give up the shrink; the one verdict
    stands, so a member whose shrink returns after it builds anew with them, though its
    own shrink succeeded."""
    store = dist.HashStore()
    started = time.monotonic()
    assert not confirming(store, True, 2, time.monotonic() + 0.3)
    assert time.monotonic() - started < 5
    assert not confirming(store, True, 2, time.monotonic() + 10)  # the late one


def test_all_members_that_shrank_keep_the_group() -> None:
    store = dist.HashStore()
    verdicts: list[bool] = []
    deadline = time.monotonic() + 10
    other = threading.Thread(target=lambda: verdicts.append(confirming(store, True, 2, deadline)))
    other.start()
    verdicts.append(confirming(store, True, 2, deadline))
    other.join(10)
    assert verdicts == [True, True]


def paths(out: Path, worker: str) -> dict[int, tuple[str, bool]]:
    """Per generation this worker formed: the path its group took, whether state was sent."""
    summary = json.loads((out / f"{worker}.json").read_text())
    return {g: (path, sent) for g, attempt, path, sent in summary["reformations"]}


@pytest.mark.slow
def test_survivors_shrink_keep_their_state_and_the_ledger_stays_exact(cluster: Cluster) -> None:
    samples, epochs = 1200, 2
    cluster.starting_coordinator(*coordinator_args(samples, epochs))
    out = cluster.root / "out"
    args = [*job_args("ledger", samples, out, batch=8, sleep_s=0.1), "--stand-in-shrink"]
    client = cluster.client()

    def generation_now() -> int:
        return int(client.progress().generation)

    def advancing(by: int) -> None:
        target = int(client.progress().committed_step) + by
        waiting_for(
            lambda: client.progress().committed_step >= target, 90, f"step {target}", cluster.tails
        )

    def members() -> list[str]:  # in rank order: the oldest first
        return [m.worker_id for m in client.progress().members]

    for name in ("w0", "w1", "w2", "w3"):
        cluster.starting_worker(name, args)
    waiting_for(lambda: len(members()) == 4, 90, "four workers")
    advancing(3)
    # the youngest leaves each time: rank 0, whose store a shrunk group keeps, stays
    drained = members()[-1]
    client.drain(drained)  # 4 -> 3, graceful
    assert cluster.waiting_exit(drained, 60) == 0
    advancing(3)
    drained_at = generation_now()
    killed = members()[-1]
    cluster.killing(killed)  # 3 -> 2
    advancing(3)
    killed_at = generation_now()
    survivors = members()
    assert len(survivors) == 2 and killed not in survivors
    cluster.starting_worker("w4", args)  # 2 -> 3
    waiting_for(lambda: len(members()) == 3, 90, "w4 to join")
    joined_at = generation_now()
    for name in (*survivors, "w4"):
        assert cluster.waiting_exit(name, 120) == 0, cluster.log(name)[-3000:]
    for name in (*survivors, "w4"):
        counts = torch.load(out / f"{name}.pt")["counts"]
        assert torch.equal(counts, torch.full((samples,), float(epochs), dtype=torch.float64))
    for name in survivors:
        formed = paths(out, name)
        assert formed[drained_at] == ("shrunk", False), formed
        # after a SIGKILL the group broke: it is built anew, and the survivors, whose
        # steps failed alike, are not sent the state they hold unless one applied more
        assert formed[killed_at][0] == "formed", formed
        # a join: the survivors built the group beside their running one (`joining`)
        assert formed[joined_at] == ("prepared", True), formed
    assert paths(out, "w4")[joined_at] == ("formed", True)


@pytest.mark.slow
def test_a_shrink_that_fails_on_one_member_falls_back_for_all(cluster: Cluster) -> None:
    samples, epochs, batch = 2400, 1, 12  # 200 steps of 0.1 s at least: outlasts the joins
    cluster.starting_coordinator(*coordinator_args(samples, epochs))
    out = cluster.root / "out"
    args = [*job_args("mlp", samples, out, batch=batch, sleep_s=0.1), "--stand-in-shrink"]
    client = cluster.client()
    cluster.starting_worker("w0", args)
    waiting_for(lambda: len(client.progress().members) == 1, 90, "w0")
    for name in ("w1", "w2"):
        extra = ["--failing-shrink"] if name == "w1" else []
        cluster.starting_worker(name, [*args, *extra])
        waiting_for(lambda n=name: n in [m.worker_id for m in client.progress().members], 90, name)  # type: ignore[misc]
    target = int(client.progress().committed_step) + 3
    waiting_for(lambda: client.progress().committed_step >= target, 90, "steps at 3")
    assert not client.progress().finished, "the drain should land mid-job"
    client.drain("w2")  # 3 -> 2: w0 shrinks, w1 fails to; both build a new group
    assert cluster.waiting_exit("w2", 60) == 0
    drained_at = int(client.progress().generation)
    for name in ("w0", "w1"):
        assert cluster.waiting_exit(name, 120) == 0, cluster.log(name)[-3000:]
        assert paths(out, name)[drained_at] == ("formed", False)
    expected = reference_parameters(samples, epochs, batch)
    for name in ("w0", "w1"):
        final = torch.load(out / f"{name}.pt")
        for key, value in expected.items():
            torch.testing.assert_close(final[key], value, rtol=1e-9, atol=1e-10)
