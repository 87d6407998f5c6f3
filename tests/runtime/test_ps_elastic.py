"""Parameter-server mode under real processes (coordinator, servers, workers) on CPU.

Aspects:
- the model is the ledger, sync mode: through a worker and a server joining together
  (partitions move, no rollback), a graceful worker drain, a worker SIGKILL, a server drain
  (its partition moves out, it exits 0) and a server SIGKILL (exactly one rollback to the
  last snapshot, with the ledger), every per-sample counter ends at exactly the number of
  epochs, on every surviving worker (so the parameters are consistent across workers);
- the same in async mode with bounded staleness, through a worker SIGKILL and a server
  SIGKILL;
- sync mode equals one process training with the same global batch and momentum, through
  a worker join and a server join;
- the counter as a row-sparse embedding table (`sparse=`: each step moves only its
  samples' rows) stays exact through a worker join, a server join and a worker SIGKILL.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from .harness import Cluster, waiting_for

JOB = str(Path(__file__).with_name("ps_job.py"))


def coordinator_args(samples: int, epochs: int) -> list[str]:
    return [
        "--samples", str(samples), "--shard-size", "10", "--epochs", str(epochs),
        "--join-window-s", "0.3", "--lease-timeout-s", "15",
    ]  # fmt: skip


def job_args(
    cluster: Cluster, kind: str, samples: int, job: str = JOB, **options: str
) -> list[str]:
    """A worker's command line: `job` (the PyTorch worker by default) with `options`."""
    args = [
        job, "--kind", kind, "--samples", str(samples), "--out", str(cluster.root / "out"),
        "--snapshot-dir", str(cluster.root / "snapshots"),
    ]  # fmt: skip
    for key, value in options.items():
        args += [f"--{key.replace('_', '-')}", value]
    return args


def server_args(cluster: Cluster) -> list[str]:
    return ["-m", "trainer_runtime.ps", "--snapshot-dir", str(cluster.root / "snapshots")]


def counts_of(cluster: Cluster, name: str) -> torch.Tensor:
    counts: torch.Tensor = torch.load(cluster.root / "out" / f"{name}.pt")["counts"]
    return counts


@pytest.mark.slow
def test_sync_ledger_is_exact_through_worker_and_server_resizes(cluster: Cluster) -> None:
    samples, epochs = 900, 2
    cluster.starting_coordinator(*coordinator_args(samples, epochs))
    client = cluster.client()
    args = job_args(cluster, "ledger", samples, global_batch="6", step_sleep_s="0.05")

    def step() -> int:
        return int(client.progress().committed_step)

    def advancing(by: int) -> None:
        target = step() + by
        waiting_for(lambda: step() >= target, 90, f"step {target}")

    def servers() -> list[str]:
        return [m.worker_id for m in client.progress().servers]

    for name in ("ps0", "ps1"):
        cluster.starting_worker(name, server_args(cluster))
    for name in ("w0", "w1", "w2"):
        cluster.starting_worker(name, args)
    waiting_for(lambda: len(client.progress().members) == 3, 90, "three workers")
    advancing(5)
    cluster.starting_worker("w3", args)  # a worker and a server join together
    cluster.starting_worker("ps2", server_args(cluster))  # partitions move, no rollback
    waiting_for(lambda: len(client.progress().members) == 4, 90, "w3 to join")
    waiting_for(lambda: "ps2" in servers(), 90, "ps2 to join")
    advancing(5)
    client.drain("w3")  # graceful worker shrink
    assert cluster.waiting_exit("w3", 60) == 0, cluster.log("w3")[-3000:]
    advancing(5)
    cluster.killing("w2")  # worker failure
    advancing(5)
    client.drain("ps0")  # graceful server removal: its partition moves out, it exits 0
    assert cluster.waiting_exit("ps0", 60) == 0, cluster.log("ps0")[-3000:]
    advancing(5)
    assert not client.progress().finished, "the server kill should land mid-job"
    cluster.killing("ps1")  # server failure: rollback to the last snapshot, with the ledger
    for name in ("w0", "w1"):
        assert cluster.waiting_exit(name, 120) == 0, cluster.log(name)[-3000:]
    expected = torch.full((samples,), float(epochs), dtype=torch.float64)
    for name in ("w0", "w1"):
        assert torch.equal(counts_of(cluster, name), expected), name
    assert client.progress().finished
    summaries = [json.loads((cluster.root / "out" / f"{n}.json").read_text()) for n in ("w0", "w1")]
    assert summaries[0]["rolled_back"] + summaries[1]["rolled_back"] == 1, summaries
    assert cluster.waiting_exit("ps2", 30) == 0


@pytest.mark.slow
def test_async_ledger_is_exact_through_worker_and_server_kills(cluster: Cluster) -> None:
    samples, epochs = 400, 2
    cluster.starting_coordinator(*coordinator_args(samples, epochs))
    client = cluster.client()
    args = job_args(
        cluster, "ledger", samples, global_batch="4", consistency="async", staleness="2",
        step_sleep_s="0.05",
    )  # fmt: skip

    def step() -> int:
        return int(client.progress().committed_step)

    def advancing(by: int) -> None:
        target = step() + by
        waiting_for(lambda: step() >= target, 90, f"step {target}")

    for name in ("ps0", "ps1"):
        cluster.starting_worker(name, server_args(cluster))
    for name in ("w0", "w1", "w2"):
        cluster.starting_worker(name, args)
    waiting_for(lambda: len(client.progress().members) == 3, 90, "three workers")
    advancing(10)
    cluster.killing("w2")
    advancing(10)
    cluster.killing("ps0")
    cluster.starting_worker("ps2", server_args(cluster))
    for name in ("w0", "w1"):
        assert cluster.waiting_exit(name, 120) == 0, cluster.log(name)[-3000:]
    expected = torch.full((samples,), float(epochs), dtype=torch.float64)
    for name in ("w0", "w1"):
        assert torch.equal(counts_of(cluster, name), expected), name
    assert client.progress().finished


def reference_parameters(samples: int, epochs: int, batch: int) -> dict[str, torch.Tensor]:
    """One process, the same sample sequence, the servers' update rule (torch's SGD)."""
    from trainer_runtime.ps.layout import total_steps, window_of
    from trainer_runtime.sharding import DatasetPlan

    from .ps_job import mlp, mlp_data

    model = mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    inputs, targets = mlp_data(samples).tensors
    plan = DatasetPlan(samples, 10, epochs)
    for step in range(1, total_steps(plan, batch) + 1):
        window = window_of(plan, batch, step)
        index = torch.tensor([i for r in window.ranges for i in r.indices()])
        loss = torch.nn.functional.cross_entropy(model(inputs[index]), targets[index])
        optimizer.zero_grad()
        torch.autograd.backward(loss)
        optimizer.step()
    return {k: v.detach() for k, v in model.state_dict().items()}


@pytest.mark.slow
def test_sync_mode_equals_one_process_with_the_same_global_batch(cluster: Cluster) -> None:
    samples, epochs, batch = 600, 2, 12
    cluster.starting_coordinator(*coordinator_args(samples, epochs))
    client = cluster.client()
    args = job_args(cluster, "mlp", samples, global_batch=str(batch), step_sleep_s="0.1")
    cluster.starting_worker("ps0", server_args(cluster))
    for name in ("w0", "w1"):
        cluster.starting_worker(name, args)
    waiting_for(lambda: client.progress().committed_step >= 5, 90, "first steps")
    cluster.starting_worker("w2", args)
    waiting_for(lambda: len(client.progress().members) == 3, 90, "w2 to join")
    cluster.starting_worker("ps1", server_args(cluster))
    waiting_for(lambda: len(client.progress().servers) == 2, 90, "ps1 to join")
    assert not client.progress().finished, "the joins should land mid-job"
    for name in ("w0", "w1", "w2"):
        assert cluster.waiting_exit(name, 120) == 0, cluster.log(name)[-3000:]
    expected = reference_parameters(samples, epochs, batch)
    for name in ("w0", "w1", "w2"):
        final = torch.load(cluster.root / "out" / f"{name}.pt")
        for key, value in expected.items():
            torch.testing.assert_close(final[key], value, rtol=1e-9, atol=1e-10)
    worlds = json.loads((cluster.root / "out" / "w0.json").read_text())["worlds"]
    # w2's join made a world of 3 after one of 2; under load w1 may start after w0's first
    # join window, which adds a world of 1 before them (the result must not differ).
    assert worlds[-2:] == [2, 3] and worlds[:-2] in ([], [1]), worlds
    # The leader's commits carry step times, so the job's throughput is measured.
    measured = {t.workers: t.samples_per_s for t in client.progress().throughput}
    assert measured.get(3, 0.0) > 0.0, measured


@pytest.mark.slow
def test_sparse_table_ledger_is_exact_through_joins_and_a_worker_kill(cluster: Cluster) -> None:
    samples, epochs = 400, 2
    cluster.starting_coordinator(*coordinator_args(samples, epochs))
    client = cluster.client()
    args = job_args(cluster, "sparse-ledger", samples, global_batch="6", step_sleep_s="0.05")

    def advancing(by: int) -> None:
        target = int(client.progress().committed_step) + by
        waiting_for(
            lambda: client.progress().committed_step >= target, 90, f"step {target}", cluster.tails
        )

    cluster.starting_worker("ps0", server_args(cluster))
    for name in ("w0", "w1"):
        cluster.starting_worker(name, args)
    waiting_for(lambda: len(client.progress().members) == 2, 90, "two workers")
    advancing(5)
    cluster.starting_worker("w2", args)
    cluster.starting_worker("ps1", server_args(cluster))  # the table straddles both now
    waiting_for(lambda: len(client.progress().members) == 3, 90, "w2 to join")
    waiting_for(lambda: len(client.progress().servers) == 2, 90, "ps1 to join")
    advancing(5)
    assert not client.progress().finished, "the kill should land mid-job"
    cluster.killing("w1")
    for name in ("w0", "w2"):
        assert cluster.waiting_exit(name, 120) == 0, cluster.log(name)[-3000:]
    expected = torch.full((samples,), float(epochs), dtype=torch.float64)
    for name in ("w0", "w2"):
        assert torch.equal(counts_of(cluster, name), expected), name
    assert client.progress().finished
