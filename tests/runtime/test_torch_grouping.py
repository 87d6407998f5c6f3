"""How a generation's group is prepared before torch builds it.

Aspects:
- every rank checks in under the generation's prefix and waits for the others; a member
  that never comes is an error within the store's timeout, not a hang (NCCL's blocking
  communicator setup is not bounded by the group's timeout);
- before an NCCL group is built, torch's watchdog is told to abort a failed collective's
  communicator and keep the process (`TORCH_NCCL_ASYNC_ERROR_HANDLING=2`), whatever the
  environment said, with a warning when it said otherwise;
- an NCCL group (with a stand-in for `ProcessGroupNCCL`, which CPU builds lack) is built
  with the group's timeout and name, and bound to its device;
- letting a live group go destroys it: a peer waiting in one of its collectives fails at
  once, not at gloo's timeout; so it does when the group's last works are handed over to
  go with it (a finished gloo work keeps the connections open), and when a DDP that
  wrapped it sits in a reference cycle, once the session collects it (a failed group).
"""

from __future__ import annotations

import datetime
import gc
import logging
import os
import threading
import time
import weakref
from typing import Any, ClassVar

import pytest
import torch
import torch.distributed as dist
from torch._C._distributed_c10d import PrefixStore, ProcessGroupGloo, TCPStore

from trainer_runtime.torch.grouping import (
    ABORT_ONLY,
    NCCL_ERROR_HANDLING,
    NCCL_NONBLOCKING,
    NCCL_NONBLOCKING_TIMEOUT,
    Holding,
    meeting,
    nccl_environment,
)
from trainer_runtime.torch.groups import Group, building
from trainer_runtime.torch.replicas import discarding, replicating

CPU = torch.device("cpu")


def store_server(timeout_s: float) -> TCPStore:
    return TCPStore(
        "127.0.0.1",
        0,
        is_master=True,
        wait_for_workers=False,
        timeout=datetime.timedelta(seconds=timeout_s),
    )


def client_of(server: TCPStore) -> TCPStore:
    timeout = datetime.timedelta(seconds=10)
    return TCPStore("127.0.0.1", server.port, is_master=False, timeout=timeout)


def test_a_member_that_never_comes_is_an_error_within_the_timeout() -> None:
    server = store_server(1.0)
    started = time.monotonic()
    with pytest.raises(dist.DistStoreError):
        meeting(PrefixStore("job/g3/", server), 0, 2)
    assert time.monotonic() - started < 10


def test_all_members_meet_and_generations_do_not_mix() -> None:
    server = store_server(10.0)
    client = TCPStore(
        "127.0.0.1", server.port, is_master=False, timeout=datetime.timedelta(seconds=10)
    )
    meeting(PrefixStore("job/g1/", server), 0, 1)  # an older generation of one member
    errors: list[BaseException] = []

    def joining() -> None:
        try:
            meeting(PrefixStore("job/g2/", client), 1, 2)
        except BaseException as error:  # reported to the test thread
            errors.append(error)

    thread = threading.Thread(target=joining)
    thread.start()
    meeting(PrefixStore("job/g2/", server), 0, 2)
    thread.join(timeout=10)
    assert not thread.is_alive() and not errors
    server.set_timeout(datetime.timedelta(seconds=0.5))
    with pytest.raises(dist.DistStoreError):  # earlier generations' ranks 0 do not count
        meeting(PrefixStore("job/g3/", server), 1, 2)


@pytest.mark.parametrize("before", [None, "1", "3", "0", ABORT_ONLY])
def test_nccl_failures_abort_the_communicator_and_keep_the_process(
    before: str | None, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    for name in (NCCL_ERROR_HANDLING, NCCL_NONBLOCKING, NCCL_NONBLOCKING_TIMEOUT):
        monkeypatch.delenv(name, raising=False)  # (restored after the test)
    if before is not None:
        monkeypatch.setenv(NCCL_ERROR_HANDLING, before)
    with caplog.at_level(logging.WARNING, logger="trainer_runtime.torch.grouping"):
        nccl_environment(30.0)
    assert os.environ[NCCL_ERROR_HANDLING] == "2"
    warned = any(NCCL_ERROR_HANDLING in record.getMessage() for record in caplog.records)
    assert warned == (before not in (None, ABORT_ONLY))


@pytest.mark.parametrize("before", [None, "0", "1"])
def test_the_communicators_set_up_is_bounded_by_the_groups_timeout(
    before: str | None, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Blocking set-up (torch's default) waits for ever on a member that checked in and
    never built its group; the non-blocking one gives up after the timeout it is told."""
    for name in (NCCL_ERROR_HANDLING, NCCL_NONBLOCKING, NCCL_NONBLOCKING_TIMEOUT):
        monkeypatch.delenv(name, raising=False)
    if before is not None:
        monkeypatch.setenv(NCCL_NONBLOCKING, before)
    with caplog.at_level(logging.WARNING, logger="trainer_runtime.torch.grouping"):
        nccl_environment(7.6)
    assert os.environ[NCCL_NONBLOCKING] == "1"
    assert os.environ[NCCL_NONBLOCKING_TIMEOUT] == "8"  # whole seconds, as torch reads it
    warned = any(NCCL_NONBLOCKING in record.getMessage() for record in caplog.records)
    assert warned == (before == "0")


def test_a_newer_generation_abandons_the_attempt_at_once() -> None:
    """A member waiting at the check-in for a peer that left gives up as soon as the newer
    generation opens, well before the timeout; a late peer then learns the verdict."""
    server = store_server(10.0)
    store = PrefixStore("job/g4a1/", server)
    started = time.monotonic()
    with pytest.raises(dist.DistStoreError, match="abandoned"):
        meeting(store, 0, 2, superseded=lambda: True)
    assert time.monotonic() - started < 5
    with pytest.raises(dist.DistStoreError, match="abandoned"):  # the verdict stands
        meeting(store, 1, 2)


class StandInNccl:
    """`torch.distributed.ProcessGroupNCCL` as `groups.building` uses it: its options, and
    a constructor (here a one-member gloo backend; it records what it was given)."""

    built: ClassVar[list[tuple[int, int, Any]]] = []

    class Options:
        _timeout: datetime.timedelta | None = None
        group_name: str = ""

    def __new__(cls, store: object, rank: int, size: int, options: Any) -> Any:
        cls.built.append((rank, size, options))
        return ProcessGroupGloo(dist.HashStore(), 0, 1, datetime.timedelta(seconds=5))


def test_an_nccl_group_is_built_with_its_timeout_name_and_device(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(dist, "ProcessGroupNCCL", StandInNccl, raising=False)
    device = torch.device("cuda", 0)
    timeout = datetime.timedelta(seconds=7)
    group = building(dist.HashStore(), 0, 1, device, timeout, "job/g3")
    (rank, size, options), *_ = StandInNccl.built
    assert (rank, size, options._timeout, options.group_name) == (0, 1, timeout, "job/g3")
    assert group.is_nccl and group.pg.bound_device_id == device and group.name == "job/g3"


def two_ranks(timeout_s: float) -> tuple[Group, Group]:
    """A two-member gloo group built by two threads of this process."""
    server = store_server(30.0)
    timeout = datetime.timedelta(seconds=timeout_s)
    groups: dict[int, Group] = {}

    def building_as(rank: int) -> None:
        store = server if rank == 0 else client_of(server)
        groups[rank] = building(PrefixStore("g1/", store), rank, 2, CPU, timeout, "g1")

    builder = threading.Thread(target=building_as, args=(1,))
    builder.start()
    building_as(0)
    builder.join(10)
    return groups[0], groups[1]


def waiting_for_rank_0(peer: Group, failed_after: list[float]) -> threading.Thread:
    """The peer waits in a broadcast from rank 0 that rank 0 never joins (it gave it up)."""

    def waiting() -> None:
        started = time.monotonic()
        with pytest.raises(RuntimeError):
            dist.broadcast(torch.ones(4), group=peer.pg, group_src=0)
        failed_after.append(time.monotonic() - started)

    waiter = threading.Thread(target=waiting)
    waiter.start()
    time.sleep(0.5)
    return waiter


def test_letting_the_live_group_go_ends_a_peers_collective_in_it_at_once() -> None:
    """A survivor whose step failed (a third member died) lets its old group go before it
    meets the others; a peer still inside a collective of that group then fails at once,
    not at gloo's timeout (gloo closes its connections only when the group is destroyed)."""
    group, peer = two_ranks(20.0)
    failed_after: list[float] = []
    waiter = waiting_for_rank_0(peer, failed_after)
    live = Holding(group)
    del group
    live.letting_go()
    waiter.join(15)
    assert failed_after and failed_after[0] < 5, failed_after


@pytest.mark.parametrize("handed", [True, False])
def test_the_last_steps_works_go_with_the_group(handed: bool) -> None:
    """A finished gloo work keeps its group's connections open: handed to `Holding`, it is
    released with the group and a peer waiting in one of the group's collectives fails at
    once; kept by the caller past that, the peer waits for gloo's timeout (here 8 s)."""
    group, peer = two_ranks(8.0)
    done: dict[int, Any] = {}

    def voting(rank: int, member: Group) -> None:
        done[rank] = dist.all_reduce(torch.ones(2), group=member.pg, async_op=True)
        done[rank].wait()

    other = threading.Thread(target=voting, args=(1, peer))
    other.start()
    voting(0, group)
    other.join(10)
    failed_after: list[float] = []
    waiter = waiting_for_rank_0(peer, failed_after)
    live = Holding(group)
    del group
    kept = done.pop(0)
    if handed:
        live.works.append(kept)
        del kept
    live.letting_go()
    waiter.join(20)
    assert failed_after and (failed_after[0] < 4) == handed, failed_after


@pytest.mark.parametrize("broken", [True, False])
def test_a_failed_groups_ddp_left_in_a_cycle_is_collected_so_the_group_goes(broken: bool) -> None:
    """The first DDP of a process outlives the session's reference in a reference cycle
    (torch's own: stood in for here by one of the test's), and its reducer holds the group:
    for a failed group `replicas.discarding` collects it, and a peer waiting in one of the
    group's collectives fails at once when the group is let go; otherwise (a group that did
    not fail, whose members all leave at a step boundary) it waits for gloo's timeout."""
    group, peer = two_ranks(8.0)
    collecting = gc.isenabled()
    gc.disable()  # only `discarding` collects
    try:
        live = Holding(group)
        ddp: Any = replicating(torch.nn.Linear(4, 2), group)
        ddp.cycle = ddp
        del group
        failed_after: list[float] = []
        waiter = waiting_for_rank_0(peer, failed_after)
        left = weakref.ref(ddp)
        del ddp
        discarding(left, broken, CPU)
        live.letting_go()
        waiter.join(20)
    finally:
        if collecting:
            gc.enable()
    assert failed_after and (failed_after[0] < 4) == broken, failed_after
