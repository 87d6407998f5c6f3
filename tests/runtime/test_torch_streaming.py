"""Rank 0's state streamed to the members without it over a generation's first steps
(`trainer_runtime.torch.streaming`).

Aspects:
- the state's units keep each parameter with its optimizer state, and the chunks keep
  units whole, at most the stream's steps of them, at least the smallest chunk each;
- in one process (threads, gloo): two members that hold the state and one that does not
  (its weights hold a NaN) step together while the state streams in several chunks; the
  one without it contributes exact zeros to every average until the last chunk landed,
  then computes again, and its parameters and optimizer state equal the holders' bit for
  bit; a step's window is split among the holders meanwhile; the one without the state
  lost while a chunk is in flight costs the others no timeout;
- a member whose group broke leaves the stream without waiting for a chunk rank 0 never
  sends (rank 0 gave up on its broadcast and moved on, its old connections still open):
  the chunk is left behind, and let go once its broadcast ended;
- under real processes: a worker that joins two running ones takes their state over
  several steps (the formation says STREAMED), and all three end with the same parameters
  bit for bit, those of one process training the same samples.
"""

from __future__ import annotations

import datetime
import json
import math
import threading
import time
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch._C._distributed_c10d import PrefixStore, TCPStore

from trainer_runtime.generations import Share
from trainer_runtime.torch import streaming
from trainer_runtime.torch.grouping import Holding
from trainer_runtime.torch.groups import Group, building
from trainer_runtime.torch.streaming import Stream, chunking, units_of

from .harness import Cluster, waiting_for
from .test_torch_elastic import coordinator_args, job_args, reference_parameters

CPU = torch.device("cpu")


def adam_after_a_step(seed: int) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 3))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    model(torch.randn(5, 4)).sum().backward()
    optimizer.step()
    optimizer.zero_grad()
    return model, optimizer


def test_units_keep_each_parameter_with_its_optimizer_state() -> None:
    model, optimizer = adam_after_a_step(0)
    frozen = nn.Parameter(torch.zeros(2), requires_grad=False)
    model.register_parameter("frozen", frozen)
    units = units_of(model, optimizer)
    weight = model[0].weight
    state = optimizer.state[weight]
    expected = [weight, state["exp_avg"], state["exp_avg_sq"], state["step"]]
    assert all(a is b for a, b in zip(units[0], expected, strict=True))
    assert len(units) == 5 and units[-1] == [frozen]  # four stepped, then the frozen one


def test_chunks_keep_units_whole_and_number_at_most_the_steps() -> None:
    units = [[torch.zeros(n), torch.zeros(n)] for n in (100, 5, 300, 7, 50, 50, 1)]
    chunks = chunking(units, 3, 1)
    assert len(chunks) <= 3
    flat = [t for chunk in chunks for t in chunk]
    assert [id(t) for t in flat] == [id(t) for unit in units for t in unit]
    for unit in units:  # both tensors of a unit in one chunk
        assert sum(any(t is unit[0] for t in c) and any(t is unit[1] for t in c) for c in chunks)
    assert len(chunking(units, 8, 1 << 30)) == 1  # the smallest chunk holds all


def stepping_together(
    rank: int, store: Any, results: dict[int, dict[str, Any]], seeds: list[int]
) -> None:
    """One member of three: build the group, stream, and step until the stream is done,
    averaging the gradients by hand (what DDP does); record what the test checks."""
    timeout = datetime.timedelta(seconds=20)
    group: Group = building(PrefixStore("g1/", store), rank, 3, CPU, timeout, "g1")
    model, optimizer = adam_after_a_step(seeds[rank])
    if rank == 2:
        with torch.no_grad():
            model[0].weight[0, 0] = math.nan  # a model part-way through computes anything
    stream = Stream(group, model, optimizer, [0, 1], (7, 0), min_bytes=1, steps=4)
    torch.manual_seed(100 + rank)
    contributed, shares, steps = [], [], 0
    while not stream.done:
        stream.issuing()
        shares.append(stream.share)
        model(torch.randn(6, 4)).sum().backward()
        contributed.append([p.grad.clone() for p in model.parameters()])
        for parameter in model.parameters():
            dist.all_reduce(parameter.grad, group=group.pg)
            parameter.grad.div_(3)
        stream.landing()
        optimizer.step()
        optimizer.zero_grad()
        steps += 1
    model(torch.randn(6, 4)).sum().backward()  # standing by no more
    after = [p.grad.clone() for p in model.parameters()]
    results[rank] = {
        "model": model,
        "optimizer": optimizer,
        "contributed": contributed,
        "after": after,
        "shares": shares,
        "steps": steps,
    }


def test_a_member_without_the_state_stands_by_until_it_holds_it_bit_for_bit() -> None:
    server = TCPStore(
        "127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=datetime.timedelta(20)
    )
    results: dict[int, dict[str, Any]] = {}
    seeds = [1, 1, 2]  # ranks 0 and 1 hold the same state; rank 2 another
    threads = []
    for rank in (1, 2):
        client = TCPStore("127.0.0.1", server.port, is_master=False)
        threads.append(
            threading.Thread(target=stepping_together, args=(rank, client, results, seeds))
        )
    for thread in threads:
        thread.start()
    stepping_together(0, server, results, seeds)
    for thread in threads:
        thread.join(30)
    assert sorted(results) == [0, 1, 2]
    assert results[0]["steps"] == results[2]["steps"] >= 3  # in several chunks
    assert results[2]["shares"][0] == Share(None, 2) and results[1]["shares"][0] == Share(1, 2)
    for grads in results[2]["contributed"]:
        assert all(torch.equal(g, torch.zeros_like(g)) for g in grads)
    assert any(g.abs().sum() > 0 for g in results[2]["after"])
    holder, newcomer = results[0], results[2]
    for a, b in zip(holder["model"].parameters(), newcomer["model"].parameters(), strict=True):
        assert torch.equal(a, b)
    for a, b in zip(
        units_of(holder["model"], holder["optimizer"]),
        units_of(newcomer["model"], newcomer["optimizer"]),
        strict=True,
    ):
        assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def test_a_member_lost_mid_stream_costs_the_others_no_timeout() -> None:
    """The member without the state goes (its group destroyed, as a killed process's
    sockets close) while a chunk is in flight: the others leave the stream and let their
    group go at once, not at the group's 20 s timeout."""
    server = TCPStore(
        "127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=datetime.timedelta(20)
    )
    left_after: dict[int, float] = {}

    def member(rank: int) -> None:
        store = server if rank == 0 else TCPStore("127.0.0.1", server.port, is_master=False)
        timeout = datetime.timedelta(seconds=20)
        group = building(PrefixStore("g1/", store), rank, 3, CPU, timeout, "g1")
        torch.manual_seed(0)
        model = nn.Sequential(*[nn.Linear(500, 500) for _ in range(4)])  # 4 MB of weights
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        stream = Stream(group, model, optimizer, [0, 1], (3, 0), min_bytes=1)
        live = Holding(group)
        del group
        if rank != 2:
            time.sleep(0.3)  # (the receiver is gone by now)
        stream.issuing()
        started = time.monotonic()
        if rank != 2:
            stream.abandoning()
        live.letting_go()
        left_after[rank] = time.monotonic() - started

    threads = [threading.Thread(target=member, args=(rank,)) for rank in (1, 2)]
    for thread in threads:
        thread.start()
    member(0)
    for thread in threads:
        thread.join(30)
    assert sorted(left_after) == [0, 1, 2]
    assert max(left_after.values()) < 5, left_after


def test_a_member_of_a_broken_group_leaves_the_stream_without_waiting_for_rank_0() -> None:
    """Rank 0 never issues the chunk and keeps its group (as gloo works in flight kept a
    killed newcomer's rank 0's connections open); the member that lacks the state leaves
    the stream of its broken group, and lets the group go, at once, not at the group's
    20 s timeout; the chunk and the group go once the broadcast ended."""
    server = TCPStore(
        "127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=datetime.timedelta(20)
    )
    timeout = datetime.timedelta(seconds=20)
    release = threading.Event()
    groups: dict[int, Group] = {}

    def rank_0() -> None:
        groups[0] = building(PrefixStore("g1/", server), 0, 2, CPU, timeout, "g1")
        release.wait(30)  # holds its group, issues nothing: moved on to its next roll call
        Holding(groups.pop(0)).letting_go()

    thread = threading.Thread(target=rank_0)
    thread.start()
    try:
        store = TCPStore("127.0.0.1", server.port, is_master=False)
        group = building(PrefixStore("g1/", store), 1, 2, CPU, timeout, "g1")
        model = nn.Sequential(*[nn.Linear(500, 500) for _ in range(4)])
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        stream = Stream(group, model, optimizer, [0], (3, 0), min_bytes=1)
        stream.issuing()
        started = time.monotonic()
        stream.abandoning(broken=True)
        assert stream.pending is None and not stream.hooks
        Holding(group).letting_go()  # (destroying the group would wait for the broadcast)
        del group, stream
        assert time.monotonic() - started < 2
        assert len(streaming._left_behind) == 1  # gloo still receives into its buffer
    finally:
        release.set()
        thread.join(30)
    waiting_for(lambda: streaming._left_behind[0][1].is_completed(), 25, "the broadcast's end")
    streaming.pruning()
    assert streaming._left_behind == []


@pytest.mark.slow
def test_a_joining_worker_takes_the_state_in_steps_and_ends_equal(cluster: Cluster) -> None:
    samples, epochs, batch = 1200, 2, 12  # 200 steps of at least 0.1 s: the join lands
    cluster.starting_coordinator(*coordinator_args(samples, epochs))
    out = cluster.root / "out"
    args = [*job_args("mlp", samples, out, batch=batch, sleep_s=0.1), "--stream-chunk-bytes", "1"]
    client = cluster.client()
    for name in ("w0", "w1"):
        cluster.starting_worker(name, args)
    waiting_for(lambda: len(client.progress().members) == 2, 90, "two workers")
    target = int(client.progress().committed_step) + 5
    waiting_for(
        lambda: client.progress().committed_step >= target, 90, f"step {target}", cluster.tails
    )
    assert not client.progress().finished, "the join should land mid-job"
    cluster.starting_worker("w2", args)
    for name in ("w0", "w1", "w2"):
        assert cluster.waiting_exit(name, 120) == 0, cluster.log(name)[-3000:]
    joined = json.loads((out / "w2.json").read_text())["deliveries"]
    assert list(joined.values()) == ["streamed"], joined  # its one formation
    generation = next(iter(joined))
    assert json.loads((out / "w0.json").read_text())["deliveries"][generation] == "streamed"
    finals = [torch.load(out / f"{name}.pt") for name in ("w0", "w1", "w2")]
    for key, value in reference_parameters(samples, epochs, batch).items():
        assert torch.equal(finals[0][key], finals[1][key]), key
        assert torch.equal(finals[0][key], finals[2][key]), key
        torch.testing.assert_close(finals[0][key], value, rtol=1e-9, atol=1e-10)
