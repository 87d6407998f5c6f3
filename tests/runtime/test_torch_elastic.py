"""The PyTorch adapter under real processes on CPU (gloo), re-forming its group in-process.

Aspects:
- the model is the ledger: through 4->3 graceful, SIGKILL 3->2, joins 2->3->4->5, a SIGKILL
  at world size 5 of a worker that is not a ring neighbour of rank 0, and the coordinator
  SIGKILLed and restarted mid-epoch, every per-sample counter ends at exactly the number of
  epochs, and the survivors keep their PIDs;
- with a fixed global batch, the final parameters equal those of a fixed-size run over the
  same sample sequence, through a join and a SIGKILL;
- with gradient accumulation (`--max-local`: 2 to 4 micro-batches a step), through a
  SIGKILL, the ledger is still exact, and an MLP ends with the parameters of the
  fixed-size run, within the same tolerance;
- with a batch that changes at every formation and every few steps inside a generation
  (an adaptive policy's own paths: the state sent with the model, the step's vote),
  through a join, a SIGKILL and a coordinator restart, the ledger is still exact;
- a survivor that hears of a new generation steps after its peer does still leaves with it
  at the same boundary (the ranks vote): the resize pauses for the group's re-forming, not
  for a collective's timeout (seen at the timeout, 20 s, without the vote);
- bad input: an empty dataset, a global batch larger than the dataset, more workers than
  shards (and than samples in a step), an unreachable coordinator: a clear error or a
  normal end, within the timeout.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from torch import nn

from trainer_runtime.client import CoordinatorUnreachable
from trainer_runtime.environment import WorkerContract
from trainer_runtime.sharding import DatasetPlan, Walk
from trainer_runtime.torch import KeepGlobalBatch, session

from .harness import REPO, TOKEN, TRUST, Cluster, changing_batch, cycle_windows, waiting_for
from .torch_job import mlp, mlp_data

JOB = str(Path(__file__).with_name("torch_job.py"))


def job_args(kind: str, samples: int, out: Path, batch: int, sleep_s: float) -> list[str]:
    return [
        JOB, "--kind", kind, "--samples", str(samples), "--global-batch", str(batch),
        "--step-sleep-s", str(sleep_s), "--out", str(out),
    ]  # fmt: skip


def coordinator_args(samples: int, epochs: int) -> list[str]:
    return [
        "--samples", str(samples), "--shard-size", "10", "--epochs", str(epochs),
        "--join-window-s", "0.3", "--lease-timeout-s", "15",
    ]  # fmt: skip


@pytest.mark.slow
def test_model_ledger_is_exact_through_resizes_and_coordinator_restart(
    cluster: Cluster,
) -> None:
    samples, epochs = 1200, 2
    cluster.starting_coordinator(*coordinator_args(samples, epochs))
    out = cluster.root / "out"
    args = job_args("ledger", samples, out, batch=8, sleep_s=0.12)
    client = cluster.client()

    def members() -> list[str]:
        return [m.worker_id for m in client.progress().members]

    def step() -> int:
        return int(client.progress().committed_step)

    def advancing(by: int) -> None:
        target = step() + by
        waiting_for(lambda: step() >= target, 90, f"step {target}")

    for name in ("w0", "w1", "w2", "w3"):
        cluster.starting_worker(name, args)
    waiting_for(lambda: len(members()) == 4, 90, "four workers")
    pid0 = cluster.processes["w0"].pid
    advancing(3)
    client.drain("w3")  # 4 -> 3, graceful
    assert cluster.waiting_exit("w3", 60) == 0
    advancing(3)
    cluster.killing("w2")  # 3 -> 2
    advancing(3)
    for name in ("w4", "w5", "w6"):  # 2 -> 3 -> 4 -> 5
        cluster.starting_worker(name, args)
        waiting_for(lambda n=name: n in members(), 90, f"{name} to join")  # type: ignore[misc]
    # Survivors keep the lowest ranks, oldest first (which of w0 and w1 registered first is
    # a race of process start-up); newcomers follow in the order they joined.
    now = members()
    assert sorted(now[:2]) == ["w0", "w1"] and now[2:] == ["w4", "w5", "w6"]
    advancing(3)
    cluster.killing("w5")  # rank 3 of 5: not a ring neighbour of rank 0
    advancing(3)
    assert not client.progress().finished, "the restart should land mid-job"
    cluster.killing("coordinator")
    time.sleep(0.5)
    cluster.starting_coordinator(*coordinator_args(samples, epochs))
    for name in ("w0", "w1", "w4", "w6"):
        assert cluster.waiting_exit(name, 120) == 0, cluster.log(name)[-3000:]
    assert json.loads((out / "w0.json").read_text())["pid"] == pid0
    for name in ("w0", "w1", "w4", "w6"):
        counts = torch.load(out / f"{name}.pt")["counts"]
        assert torch.equal(counts, torch.full((samples,), float(epochs), dtype=torch.float64))
    assert client.progress().finished


@pytest.mark.slow
def test_a_rank_that_hears_late_leaves_with_its_peers(cluster: Cluster) -> None:
    samples, epochs = 1200, 2
    cluster.starting_coordinator(*coordinator_args(samples, epochs))
    out, trace = cluster.root / "out", cluster.root / "trace"
    args = [*job_args("ledger", samples, out, batch=8, sleep_s=0.12), "--trace", str(trace)]
    client = cluster.client()

    def members() -> list[str]:
        return [m.worker_id for m in client.progress().members]

    cluster.starting_worker("w0", args)
    cluster.starting_worker("w1", [*args, "--deaf-steps", "3"])
    waiting_for(lambda: len(members()) == 2, 90, "two workers")
    target = int(client.progress().committed_step) + 5
    waiting_for(
        lambda: client.progress().committed_step >= target, 90, f"step {target}", cluster.tails
    )
    cluster.starting_worker("w2", args)  # 2 -> 3: w1 hears of it three steps late
    for name in ("w0", "w1", "w2"):
        assert cluster.waiting_exit(name, 180) == 0, cluster.log(name)[-3000:]
    steps = [line.split() for line in trace.read_text().splitlines() if line.startswith("step")]
    pid0 = json.loads((out / "w0.json").read_text())["pid"]
    mine = [(float(t), int(world)) for _, t, _, world, pid in steps if int(pid) == pid0]
    last_of_two = max(t for t, world in mine if world == 2)
    first_of_three = min(t for t, world in mine if world == 3)
    assert 0 < first_of_three - last_of_two < 10, (last_of_two, first_of_three)
    for name in ("w0", "w1", "w2"):
        counts = torch.load(out / f"{name}.pt")["counts"]
        assert torch.equal(counts, torch.full((samples,), float(epochs), dtype=torch.float64))


def reference_parameters(samples: int, epochs: int, batch: int) -> dict[str, torch.Tensor]:
    """One process, the same sample sequence, no elasticity."""
    model = mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    data = mlp_data(samples)
    plan = DatasetPlan(samples, 10, epochs)
    walk = Walk(plan, 0, 0, plan.epoch_order(0))
    while (window := walk.next_window(batch)) is not None:
        index = torch.tensor([i for r in window.ranges for i in r.indices()])
        loss = nn.functional.cross_entropy(model(data.tensors[0][index]), data.tensors[1][index])
        optimizer.zero_grad()
        torch.autograd.backward(loss)
        optimizer.step()
    return {k: v.detach() for k, v in model.state_dict().items()}


@pytest.mark.slow
def test_fixed_global_batch_matches_a_fixed_size_run(cluster: Cluster) -> None:
    samples, epochs, batch = 1200, 2, 12
    cluster.starting_coordinator(*coordinator_args(samples, epochs))
    out = cluster.root / "out"
    args = job_args("mlp", samples, out, batch=batch, sleep_s=0.1)
    client = cluster.client()
    for name in ("w0", "w1"):
        cluster.starting_worker(name, args)
    waiting_for(lambda: client.progress().committed_step >= 5, 90, "first steps")
    cluster.starting_worker("w2", args)
    waiting_for(lambda: len(client.progress().members) == 3, 90, "the join")
    target = client.progress().committed_step + 3
    waiting_for(lambda: client.progress().committed_step >= target, 90, "steps at 3")
    cluster.killing("w1")
    for name in ("w0", "w2"):
        assert cluster.waiting_exit(name, 120) == 0, cluster.log(name)[-3000:]
    expected = reference_parameters(samples, epochs, batch)
    for name in ("w0", "w2"):
        final = torch.load(out / f"{name}.pt")
        for key, value in expected.items():
            torch.testing.assert_close(final[key], value, rtol=1e-9, atol=1e-10)


def all_at_once(samples: int, epochs: int) -> list[str]:
    """A coordinator whose first generation waits for `set_target`'s workers, however
    late one of them starts."""
    return [*coordinator_args(samples, epochs), "--join-window-s", "120"]


@pytest.mark.slow
def test_accumulation_keeps_the_ledger_exact_through_a_sigkill(cluster: Cluster) -> None:
    samples, epochs = 200, 2  # 8 a step, at most 2 a rank at once: 2 micro-batches, then 4
    cluster.starting_coordinator(*all_at_once(samples, epochs))
    client = cluster.client()
    client.set_target(2)
    out = cluster.root / "out"
    args = [*job_args("ledger", samples, out, batch=8, sleep_s=0.05), "--max-local", "2"]
    for name in ("w0", "w1"):
        cluster.starting_worker(name, args)
    waiting_for(lambda: client.progress().committed_step >= 5, 90, "first steps")
    assert not client.progress().finished, "the SIGKILL should land mid-job"
    cluster.killing("w1")  # 2 -> 1, most likely between two micro-batches of a step
    assert cluster.waiting_exit("w0", 90) == 0, cluster.log("w0")[-3000:]
    assert client.progress().finished
    counts = torch.load(out / "w0.pt")["counts"]
    assert torch.equal(counts, torch.full((samples,), float(epochs), dtype=torch.float64))
    assert json.loads((out / "w0.json").read_text())["worlds"] == [1, 2]


@pytest.mark.slow
def test_accumulation_matches_a_fixed_size_run_through_a_sigkill(cluster: Cluster) -> None:
    samples, epochs, batch = 360, 1, 12  # at most 3 a rank at once: 2, then 4 micro-batches
    cluster.starting_coordinator(*all_at_once(samples, epochs))
    client = cluster.client()
    client.set_target(2)
    out = cluster.root / "out"
    args = [*job_args("mlp", samples, out, batch=batch, sleep_s=0.1), "--max-local", "3"]
    for name in ("w0", "w1"):
        cluster.starting_worker(name, args)
    # past step 8, which the noise meter measures: averaged once, after the last micro-batch
    waiting_for(lambda: client.progress().committed_step >= 10, 90, "ten steps")
    assert not client.progress().finished, "the SIGKILL should land mid-job"
    cluster.killing("w1")  # 2 -> 1
    assert cluster.waiting_exit("w0", 90) == 0, cluster.log("w0")[-3000:]
    assert json.loads((out / "w0.json").read_text())["worlds"] == [1, 2]
    noise = client.progress().noise  # measured over each rank's whole slice, at two ranks
    assert noise.init_batch == batch and noise.steps >= 1, noise
    assert noise.grad_var > 0 and math.isfinite(noise.grad_sqr + noise.grad_var), noise
    expected = reference_parameters(samples, epochs, batch)
    final = torch.load(out / "w0.pt")
    for key, value in expected.items():
        torch.testing.assert_close(final[key], value, rtol=1e-9, atol=1e-10)


def test_a_peer_lost_before_ddp_rebuilds_its_buckets_is_a_resize(cluster: Cluster) -> None:
    """DDP rebuilds its gradient buckets, with a broadcast from rank 0, at the first forward
    after a generation's first step. Rank 0 lost right then made that broadcast fail in the
    user's `s.model(...)` call, and its peer stopped with the error (seen in CI). The
    session rebuilds them in the step: the peer re-forms alone, and its parameters end as a
    fixed-size run's."""
    samples, epochs, batch = 240, 1, 12
    # Both workers in the first generation, however late the second one's start: alone, the
    # first trained the whole job (20 steps, about 1 s) and both exited 0.
    args = [*coordinator_args(samples, epochs), "--join-window-s", "120"]
    cluster.starting_coordinator(*args)
    cluster.client().set_target(2)
    out = cluster.root / "out"
    args = [*job_args("mlp", samples, out, batch=batch, sleep_s=0.05), "--lost-after-first-step"]
    for name in ("w0", "w1"):
        cluster.starting_worker(name, args)
    exits = {name: cluster.waiting_exit(name, 120) for name in ("w0", "w1")}
    assert sorted(exits.values()) == [0, 9], {n: cluster.log(n)[-3000:] for n in exits}
    survivor = next(name for name, code in exits.items() if code == 0)
    final = torch.load(out / f"{survivor}.pt")
    for key, value in reference_parameters(samples, epochs, batch).items():
        torch.testing.assert_close(final[key], value, rtol=1e-9, atol=1e-10)


def test_empty_dataset_is_refused_by_the_coordinator() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "trainer_runtime.coordinator", "--samples", "0"],
        env={**TRUST, "PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "--samples" in result.stderr and "at least 1" in result.stderr


def test_unreachable_coordinator_is_a_clear_error_within_the_timeout() -> None:
    contract = WorkerContract("127.0.0.1:1", TOKEN, "job", "w0", "node", timeout_s=1.5)
    model = nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    started = time.monotonic()
    with (
        pytest.raises(CoordinatorUnreachable),
        session(model, optimizer, [torch.zeros(2)], KeepGlobalBatch(1), contract),
    ):
        pass
    assert time.monotonic() - started < 15


@pytest.mark.slow
def test_global_batch_larger_than_the_dataset_trains_each_sample_once(
    cluster: Cluster,
) -> None:
    samples = 30
    cluster.starting_coordinator(*coordinator_args(samples, 1))
    out = cluster.root / "out"
    cluster.starting_worker("w0", job_args("ledger", samples, out, batch=100, sleep_s=0.0))
    assert cluster.waiting_exit("w0", 90) == 0, cluster.log("w0")
    counts = torch.load(out / "w0.pt")["counts"]
    assert torch.equal(counts, torch.ones(samples, dtype=torch.float64))


@pytest.mark.slow
def test_more_workers_than_shards_trains_each_sample_once_per_epoch(cluster: Cluster) -> None:
    samples, epochs = 20, 2  # two shards of 10; three workers, two samples a step
    # a join window shorter than the workers' 20 s timeout, closed early by the target
    cluster.starting_coordinator(*coordinator_args(samples, epochs), "--join-window-s", "12")
    cluster.client().set_target(3)
    out = cluster.root / "out"
    for name in ("w0", "w1", "w2"):
        cluster.starting_worker(name, job_args("ledger", samples, out, batch=2, sleep_s=0.2))
    for name in ("w0", "w1", "w2"):
        assert cluster.waiting_exit(name, 90) == 0, cluster.log(name)[-3000:]
    worlds = set()
    for name in ("w0", "w1", "w2"):
        counts = torch.load(out / f"{name}.pt")["counts"]
        assert torch.equal(counts, torch.full((samples,), float(epochs), dtype=torch.float64))
        worlds.update(json.loads((out / f"{name}.json").read_text())["worlds"])
    assert 3 in worlds, "a rank had no sample in some steps"


@pytest.mark.slow
def test_a_changing_batch_keeps_the_ledger_exact_through_join_kill_and_restart(
    cluster: Cluster,
) -> None:
    """An adaptive policy's batch changes at every formation and every few steps inside
    a generation (`elastic_job.cycling`: global batches 6, 20, 9, 14, at most 3 samples a
    rank at once, so 1 to 4 micro-batches); a join, a SIGKILL and a coordinator restart
    land among those changes, and every sample is still trained once per epoch."""
    samples, epochs = 1200, 2
    cluster.starting_coordinator(*all_at_once(samples, epochs))
    out = cluster.root / "out"
    args = job_args("ledger", samples, out, batch=8, sleep_s=0.05)
    survivors = changing_batch(cluster, args, coordinator_args(samples, epochs), 90)
    for name in survivors:
        counts = torch.load(out / f"{name}.pt")["counts"]
        assert torch.equal(counts, torch.full((samples,), float(epochs), dtype=torch.float64))
    windows = set(json.loads((out / f"{survivors[0]}.json").read_text())["windows"])
    full = windows & cycle_windows()  # (an epoch's short last window aside)
    assert len(full) >= 3, windows  # the batch did change, at and between resizes
