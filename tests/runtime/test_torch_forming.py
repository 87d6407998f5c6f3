"""The PyTorch adapter retries a generation whose formation or step failed while nobody
left, instead of waiting for a newer generation the coordinator never opens.

Aspects:
- the session's loop: after failed attempts with no news it forms the same generation
  again at the next attempt; news of a newer generation sends it there;
- under real processes (gloo): a worker stopped (SIGSTOP) past the group's timeout makes
  its peer's step fail while the coordinator sees nobody leave; both form the same
  generation again and the job ends with every per-sample counter exact.
"""

from __future__ import annotations

import os
import signal
from typing import Any

import pytest
import torch
from torch import nn

from trainer_runtime.agent import Assignment, Outcome, Peer
from trainer_runtime.environment import WorkerContract
from trainer_runtime.torch import KeepGlobalBatch, session

from .harness import TOKEN, Cluster, waiting_for
from .test_torch_elastic import coordinator_args, job_args


def idle_session(monkeypatch: pytest.MonkeyPatch, news: list[bool]) -> tuple[Any, list[Any]]:
    """A session whose coordinator assigns generation 3 (then 4, ...) and whose formations
    fail twice before one succeeds; `news` is what `changed()` answers, in turn."""
    contract = WorkerContract("127.0.0.1:1", TOKEN, "job", "w0", "node", timeout_s=1.0)
    model = nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    s = session(model, optimizer, [torch.zeros(2)], KeepGlobalBatch(1), contract)
    asked: list[int] = []
    tries: list[tuple[int, int]] = []

    def awaiting() -> Assignment:
        asked.append(3 + len(asked))
        return Assignment(Outcome.MEMBER, asked[-1], 0, (Peer("w0", 0, "127.0.0.1:1"),))

    def forming_generation(given: Assignment, attempt: int) -> None:
        tries.append((given.generation, attempt))
        if len(tries) < 3:
            raise RuntimeError("a peer went silent")

    monkeypatch.setattr(s.agent, "awaiting_assignment", awaiting)
    monkeypatch.setattr(s.agent, "changed", lambda: news.pop(0) if news else False)
    monkeypatch.setattr(s, "forming_generation", forming_generation)
    return s, tries


def test_a_failed_formation_retries_the_same_generation_while_nobody_left(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    s, tries = idle_session(monkeypatch, news=[])
    assert s.reforming()
    assert tries == [(3, 0), (3, 1), (3, 2)]  # never waits for a generation 4 that won't come


def test_a_failed_formation_moves_on_when_a_newer_generation_opened(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    s, tries = idle_session(monkeypatch, news=[True])  # heard after the first failure
    assert s.reforming()
    assert tries == [(3, 0), (4, 0), (4, 1)]


@pytest.mark.slow
def test_a_step_that_timed_out_while_nobody_left_is_retried_in_the_same_generation(
    cluster: Cluster,
) -> None:
    samples, epochs = 200, 1
    cluster.starting_coordinator(*coordinator_args(samples, epochs))  # leases last 15 s
    out = cluster.root / "out"
    trace = cluster.root / "trace"
    args = [*job_args("ledger", samples, out, batch=4, sleep_s=0.05), "--trace", str(trace)]
    extra = {
        "EDL_TIMEOUT_S": "4",
        "EDL_TEST_LOG_LEVEL": "INFO",
    }  # the group's timeout, well below the lease timeout
    for name in ("w0", "w1"):
        cluster.starting_worker(name, args, extra)
    client = cluster.client()
    waiting_for(lambda: len(client.progress().members) == 2, 90, "both workers")
    w1 = cluster.processes["w1"].pid

    def steps_of_w1() -> int:
        """w1's steps in a group of both ('step TIME gGEN WORLD PID'): 'both workers' above
        counts members, and w1 may step alone in a generation that w0 has not joined yet,
        where stopping w1 would leave w0 no collective to time out."""
        lines = trace.read_text().splitlines()
        return sum(line.split()[3:] == ["2", str(w1)] for line in lines if line.startswith("step"))

    # past the group's first steps: DDP's forward rebuilds its buckets with a collective at
    # the second step, in the user's code, where the session cannot catch a failure (below)
    waiting_for(lambda: steps_of_w1() >= 4, 60, "w1's first steps beside w0")
    generation = client.progress().generation

    def w0_failures() -> int:
        log = cluster.log("w0")
        return log.count(" failed (") + log.count(") failed: ")

    failed_before = w0_failures()
    os.kill(w1, signal.SIGSTOP)
    try:
        # Until w0's step has failed on its 4 s collective timeout (a fixed pause could end
        # before a loaded machine lets w0 reach and time out its collective), and well short
        # of the 15 s lease, past which w1 would be gone and a new generation opened.
        waiting_for(
            lambda: w0_failures() > failed_before,
            10,
            "w0's step to fail while w1 is stopped",
        )
    finally:
        os.kill(w1, signal.SIGCONT)
    for name in ("w0", "w1"):
        assert cluster.waiting_exit(name, 90) == 0, cluster.log(name)[-3000:]
    assert client.progress().finished
    failures = cluster.log("w0") + cluster.log("w1")
    assert " failed (" in failures or ") failed: " in failures, "nothing failed: no retry shown"
    # nobody left: every step after the pause ran in the generation that was running
    generations = {line.split()[2] for line in trace.read_text().splitlines() if "step" in line}
    assert max(generations, key=lambda g: int(g[1:])) == f"g{generation}"
    for name in ("w0", "w1"):
        counts = torch.load(out / f"{name}.pt")["counts"]
        assert torch.equal(counts, torch.full((samples,), float(epochs), dtype=torch.float64))
