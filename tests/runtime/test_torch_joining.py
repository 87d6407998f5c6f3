"""Joins off the critical path (`trainer_runtime.torch.joining`): the next generation's group
built beside the running one, and the switch at a step boundary.

Aspects:
- which generations a running group may prepare: every member kept at its rank, members
  added after them;
- in one process (threads, gloo): two running members prepare a three-member group while a
  newcomer forms it plainly; all three meet at the switch and the group works; a prepared
  group that one member gives up makes the others' switch fail at once, not at a timeout;
  a generation that is not a growth is declined without checking in, and so is one whose
  preparation was given up before it claimed its generation;
- the vote a rank casts from its preparation: nothing while it builds, ready once built,
  leave now for any other change;
- under real processes: a newcomer whose formation is 3 s late costs the running group a
  short pause, not the 3 s (it trains on meanwhile), the ledger stays exact; with
  prepared joins turned off the same delay is a pause of about 3 s (what the test would
  see if the preparation did nothing).
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from trainer_runtime.agent import Assignment, Outcome, Peer
from trainer_runtime.torch.grouping import (
    StoreHost,
    attempt_store,
    forming,
    prepared_count,
    switching,
)
from trainer_runtime.torch.groups import Group
from trainer_runtime.torch.joining import (
    PREPARING_WINDOWS,
    Joiner,
    Preparation,
    Readiness,
    growing,
)
from trainer_runtime.torch.shrinking import Reformation

from .harness import Cluster, waiting_for
from .test_torch_elastic import coordinator_args, job_args

CPU = torch.device("cpu")
TIMEOUT_S = 10.0
JOB_ID = "join-test"


def generation(
    number: int, *workers: str, rank: int = 0, stores: list[str] | None = None
) -> Assignment:
    addresses = stores or [f"127.0.0.1:{9000 + r}" for r in range(len(workers))]
    peers = tuple(Peer(worker, r, addresses[r]) for r, worker in enumerate(workers))
    return Assignment(Outcome.MEMBER, number, rank, peers)


@pytest.mark.parametrize(
    ("before", "after", "expected"),
    [
        (("a", "b"), ("a", "b", "c"), True),
        (("a",), ("a", "b", "c"), True),
        (("a", "b"), ("a", "b"), False),  # nobody added
        (("a", "b"), ("a", "c"), False),  # one left
        (("a", "b"), ("b", "a", "c"), False),  # reordered
        (("a", "b"), ("a", "c", "b"), False),  # a newcomer ranked before a member
    ],
)
def test_only_a_growth_keeping_every_rank_is_prepared(
    before: tuple[str, ...], after: tuple[str, ...], expected: bool
) -> None:
    assert growing(generation(4, *before), generation(5, *after)) is expected
    assert not growing(generation(5, *before), generation(5, *after))  # not newer


class Agent:
    """What a preparation asks of the worker agent, scripted: the next generation's answer
    and the news."""

    def __init__(self, upcoming: Assignment | None) -> None:
        self.upcoming = upcoming
        self.news = True
        self.only_newer = True

    def peeking_assignment(self, timeout_s: float) -> Assignment | None:
        return self.upcoming

    def changed(self) -> bool:
        return self.news

    def changed_since(self, generation: int) -> bool:
        return not self.only_newer

    def only_newer_generation(self) -> bool:
        return self.only_newer


def members(count: int) -> list[StoreHost]:
    return [StoreHost("127.0.0.1", TIMEOUT_S) for _ in range(count)]


def place(hosts: list[StoreHost], number: int, rank: int) -> Assignment:
    workers = [f"w{r}" for r in range(len(hosts))]
    return generation(number, *workers, rank=rank, stores=[h.address for h in hosts])


def preparing(hosts: list[StoreHost], rank: int, live_size: int) -> tuple[Preparation, Agent]:
    live = generation(1, *[f"w{r}" for r in range(live_size)], rank=rank)
    agent = Agent(place(hosts, 2, rank))
    preparation = Preparation(live, 0, agent, hosts[rank], JOB_ID, CPU)  # type: ignore[arg-type]
    return preparation, agent


def newcomer(hosts: list[StoreHost], rank: int, results: list[object]) -> threading.Thread:
    """A newcomer forming generation 2 plainly, in a thread; its group or error in `results`."""

    def running() -> None:
        try:
            path, group = forming(place(hosts, 2, rank), 0, JOB_ID, hosts[rank], CPU)
            results.append((path, group))
        except RuntimeError as error:
            results.append(error)

    thread = threading.Thread(target=running)
    thread.start()
    return thread


def ready(preparation: Preparation) -> bool:
    waiting_for(lambda: preparation.state is not Readiness.BUILDING, 20, "the preparation")
    return preparation.state is Readiness.READY


def switching_in(hosts: list[StoreHost], rank: int, errors: list[BaseException]) -> None:
    """A running member at its step boundary: the switch's roll call of generation 2."""
    store = attempt_store(place(hosts, 2, rank), 0, JOB_ID, hosts[rank])
    try:
        switching(store, rank, len(hosts), TIMEOUT_S)
    except RuntimeError as error:
        errors.append(error)


def two_running_and_a_newcomer() -> tuple[
    list[StoreHost], Preparation, Preparation, list[object], threading.Thread
]:
    """Two running members whose prepared group of three is built, and the newcomer's thread
    forming it plainly (its outcome lands in the list)."""
    hosts = members(3)
    first, _ = preparing(hosts, 0, 2)
    second, _ = preparing(hosts, 1, 2)
    results: list[object] = []
    thread = newcomer(hosts, 2, results)
    assert ready(first) and ready(second)
    return hosts, first, second, results, thread


def test_running_members_prepare_the_group_and_meet_the_newcomer_at_the_switch() -> None:
    hosts, first, second, results, thread = two_running_and_a_newcomer()
    groups: list[Group] = []
    for rank, preparation in enumerate((first, second)):
        group = preparation.taking(place(hosts, 2, rank), 0)
        assert group is not None and group.size == 3 and group.rank == rank
        groups.append(group)
    time.sleep(0.5)  # the newcomer waits at the switch for the running members
    assert not results
    errors: list[BaseException] = []
    survivors = [threading.Thread(target=switching_in, args=(hosts, r, errors)) for r in (0, 1)]
    for survivor in survivors:
        survivor.start()
    for joining in (thread, *survivors):
        joining.join(30)
    assert not errors and len(results) == 1 and isinstance(results[0], tuple), (errors, results)
    path, group = results[0]
    assert path is Reformation.FORMED
    groups.append(group)
    store = attempt_store(place(hosts, 2, 0), 0, JOB_ID, hosts[0])
    assert prepared_count(store) == 2
    values = [torch.ones(1) * (g.rank + 1) for g in groups]
    works = [
        dist.all_reduce(v, group=g.pg, async_op=True) for v, g in zip(values, groups, strict=True)
    ]
    for work in works:
        work.wait()
    assert [float(v) for v in values] == [6.0, 6.0, 6.0]


def test_a_prepared_group_given_up_ends_the_others_switch_at_once() -> None:
    hosts, first, second, results, thread = two_running_and_a_newcomer()
    started = time.monotonic()
    # the second member forms a newer generation instead: it gives its preparation up
    assert second.taking(place(hosts, 3, 1), 0) is None
    errors: list[BaseException] = []
    switching_in(hosts, 0, errors)
    thread.join(30)
    assert time.monotonic() - started < TIMEOUT_S / 2
    assert len(errors) == 1 and "abandoned" in str(errors[0])
    assert len(results) == 1 and isinstance(results[0], dist.DistStoreError), results
    first.cancelling()


def test_a_generation_that_is_not_a_growth_is_declined_without_checking_in() -> None:
    hosts = members(2)
    live = generation(1, "w0", "w9", rank=0)  # w9 left: generation 2 is w0, w1
    agent = Agent(place(hosts, 2, 0))
    preparation = Preparation(live, 0, agent, hosts[0], JOB_ID, CPU)  # type: ignore[arg-type]
    assert not ready(preparation)
    assert preparation.state is Readiness.DECLINED and preparation.claimed is None
    assert preparation.taking(place(hosts, 2, 0), 0) is None  # the plain path forms it
    assert prepared_count(attempt_store(place(hosts, 2, 0), 0, JOB_ID, hosts[0])) == 0


def test_a_preparation_that_failed_fails_its_attempt() -> None:
    hosts = members(2)
    preparation, agent = preparing(hosts, 0, 1)
    agent.only_newer = False  # a drain came: the roll call is given up
    assert not ready(preparation) and preparation.state is Readiness.FAILED
    with pytest.raises(RuntimeError, match="not there"):
        preparation.taking(place(hosts, 2, 0), 0)


def test_the_vote_follows_the_preparation() -> None:
    hosts = members(2)
    live = generation(1, "w0", rank=0)
    agent = Agent(place(hosts, 2, 0))
    agent.news = False
    joiner = Joiner(agent, hosts[0], JOB_ID, CPU)  # type: ignore[arg-type]
    assert joiner.news(live, 5) == (False, False)  # nothing new: no preparation
    assert joiner.preparation is None
    agent.news = True
    assert joiner.news(None, 5) == (True, False)  # no live group to train on: leave now
    assert joiner.news(live, 5) == (False, False)  # preparing: train on
    preparation = joiner.preparation
    assert preparation is not None
    results: list[object] = []
    thread = newcomer(hosts, 1, results)
    assert ready(preparation)
    assert joiner.news(live, 6) == (False, True)
    assert joiner.news(live, 6 + PREPARING_WINDOWS) == (True, False)  # trained on too long
    agent.only_newer = False
    assert joiner.news(live, 7) == (True, False)  # a drain as well: leave now
    joiner.cancelling()
    thread.join(30)
    assert isinstance(results[0], dist.DistStoreError)  # the newcomer learnt it at the switch


def trace_of(path: Path, pid: int) -> list[tuple[float, int]]:
    """One process's steps in a trace: (time, world size)."""
    steps = [line.split() for line in path.read_text().splitlines() if line.startswith("step")]
    return [(float(t), int(world)) for _, t, _, world, p in steps if int(p) == pid]


@pytest.mark.slow
@pytest.mark.parametrize("plain", [False, True])
def test_a_late_newcomer_costs_the_running_group_a_short_pause(
    cluster: Cluster, plain: bool
) -> None:
    samples, epochs, delay_s = 1200, 2, 3.0
    cluster.starting_coordinator(*coordinator_args(samples, epochs))
    out, trace = cluster.root / "out", cluster.root / "trace"
    args = [*job_args("ledger", samples, out, batch=8, sleep_s=0.05), "--trace", str(trace)]
    if plain:
        args.append("--plain-joins")
    client = cluster.client()

    def members() -> list[str]:
        return [m.worker_id for m in client.progress().members]

    for name in ("w0", "w1"):
        cluster.starting_worker(name, args)
    waiting_for(lambda: len(members()) == 2, 90, "two workers")
    target = int(client.progress().committed_step) + 5
    waiting_for(
        lambda: client.progress().committed_step >= target, 90, f"step {target}", cluster.tails
    )
    assert not client.progress().finished, "the join should land mid-job"
    cluster.starting_worker("w2", [*args, "--late-check-in-s", str(delay_s)])
    for name in ("w0", "w1", "w2"):
        assert cluster.waiting_exit(name, 180) == 0, cluster.log(name)[-3000:]
    summary = json.loads((out / "w0.json").read_text())
    mine = trace_of(trace, summary["pid"])
    last_of_two = max(t for t, world in mine if world == 2)
    first_of_three = min(t for t, world in mine if world == 3)
    pause = first_of_three - last_of_two
    paths = {path for _, _, path, _ in summary["reformations"]}
    if plain:  # (the running group may finish a step after the newcomer began to wait)
        assert pause >= 0.8 * delay_s, pause
        assert "prepared" not in paths
    else:
        assert 0 < pause < delay_s / 2, pause
        assert "prepared" in paths
    for name in ("w0", "w1", "w2"):
        counts = torch.load(out / f"{name}.pt")["counts"]
        assert torch.equal(counts, torch.full((samples,), float(epochs), dtype=torch.float64))


def test_a_preparation_given_up_before_it_claimed_never_checks_in() -> None:
    """The session forms plainly as soon as `taking` found nothing claimed: the thread,
    answered late, must not check in at the same attempt too (a member counted twice)."""
    hosts = members(2)
    released = threading.Event()

    class SlowAgent(Agent):
        def peeking_assignment(self, timeout_s: float) -> Assignment | None:
            released.wait(10)
            return self.upcoming

    live = generation(1, "w0", rank=0)
    agent = SlowAgent(place(hosts, 2, 0))
    preparation = Preparation(live, 0, agent, hosts[0], JOB_ID, CPU)  # type: ignore[arg-type]
    assert preparation.taking(place(hosts, 2, 0), 0) is None  # nothing claimed: plainly
    released.set()
    preparation.thread.join(10)
    assert preparation.state is Readiness.DECLINED and preparation.claimed is None
    assert prepared_count(attempt_store(place(hosts, 2, 0), 0, JOB_ID, hosts[0])) == 0
