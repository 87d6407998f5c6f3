"""Paddle workers in parameter-server mode, with a row-sparse embedding table, under real
processes (coordinator, servers, workers) on CPU.

Aspects:
- the model is the ledger, an embedding table with a row per sample pushed and pulled by
  row, sync mode: through 2 -> 4 workers (two gated newcomers), a server added (partitions
  move, no rollback), a worker SIGKILL and a server drain (its partition moves out, it
  exits 0), every row ends at exactly the number of epochs on every surviving worker;
- a small CTR model (sparse embedding, dense layers, lazy momentum) trained through a worker
  join, a worker SIGKILL, a server join and a server SIGKILL (a rollback to the last
  snapshot, with the ledger) ends with the parameters of the same job run without faults.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from .harness import Cluster, gated, waiting_for
from .test_ps_elastic import coordinator_args, job_args, server_args

JOB = str(Path(__file__).with_name("paddle_ps_job.py"))


def final(cluster: Cluster, name: str) -> dict[str, np.ndarray]:
    with np.load(cluster.root / "out" / f"{name}.npz") as arrays:
        return {key: arrays[key] for key in arrays.files}


@pytest.mark.slow
def test_sparse_ledger_is_exact_through_worker_and_server_resizes(cluster: Cluster) -> None:
    samples, epochs = 600, 2
    cluster.starting_coordinator(*coordinator_args(samples, epochs))
    client = cluster.client()
    args = job_args(cluster, "ledger", samples, JOB, global_batch="6", step_sleep_s="0.05")
    gate = cluster.root / "newcomers-join"

    def step() -> int:
        return int(client.progress().committed_step)

    def advancing(by: int) -> None:
        target = step() + by
        waiting_for(lambda: step() >= target, 120, f"step {target}")

    for name in ("ps0", "ps1"):
        cluster.starting_worker(name, server_args(cluster))
    for name in ("w0", "w1"):
        cluster.starting_worker(name, args)
    for name in ("w2", "w3"):
        cluster.starting_worker(name, gated(args, gate))
    waiting_for(lambda: len(client.progress().members) == 2, 120, "two workers")
    advancing(5)
    gate.touch()  # 2 -> 4 workers
    waiting_for(lambda: len(client.progress().members) == 4, 120, "four workers")
    advancing(5)
    cluster.starting_worker("ps2", server_args(cluster))  # partitions move, no rollback
    waiting_for(lambda: len(client.progress().servers) == 3, 120, "ps2 to join")
    advancing(5)
    cluster.killing("w3")  # worker failure
    advancing(5)
    client.drain("ps0")  # its partition moves out, it exits 0
    assert cluster.waiting_exit("ps0", 90) == 0, cluster.log("ps0")[-3000:]
    assert not client.progress().finished, "the server drain should land mid-job"
    survivors = ("w0", "w1", "w2")
    for name in survivors:
        assert cluster.waiting_exit(name, 180) == 0, cluster.log(name)[-3000:]
    expected = np.full((samples, 1), float(epochs), dtype=np.float32)
    for name in survivors:
        np.testing.assert_array_equal(final(cluster, name)["counts.weight"], expected, name)
    assert client.progress().finished
    summaries = [json.loads((cluster.root / "out" / f"{n}.json").read_text()) for n in survivors]
    assert all(s["rolled_back"] == 0 for s in summaries), summaries
    assert 4 in summaries[0]["worlds"], summaries[0]


def running_ctr(cluster: Cluster, samples: int, epochs: int, faults: bool) -> list[str]:
    """The CTR job, with or without faults; the workers that finished it."""
    cluster.starting_coordinator(*coordinator_args(samples, epochs))
    client = cluster.client()
    args = job_args(cluster, "ctr", samples, JOB, global_batch="12", step_sleep_s="0.05")
    cluster.starting_worker("ps0", server_args(cluster))
    cluster.starting_worker("w0", args)
    if not faults:
        assert cluster.waiting_exit("w0", 180) == 0, cluster.log("w0")[-3000:]
        return ["w0"]
    gate = cluster.root / "w1-joins"
    cluster.starting_worker("w1", args)
    cluster.starting_worker("w2", gated(args, gate))

    def advancing(by: int) -> None:
        target = int(client.progress().committed_step) + by
        waiting_for(
            lambda: client.progress().committed_step >= target, 120, f"step {target}", cluster.tails
        )

    waiting_for(lambda: len(client.progress().members) == 2, 120, "two workers")
    advancing(4)
    gate.touch()
    waiting_for(lambda: len(client.progress().members) == 3, 120, "w2 to join")
    advancing(4)
    cluster.killing("w1")
    cluster.starting_worker("ps1", server_args(cluster))
    waiting_for(lambda: len(client.progress().servers) == 2, 120, "ps1 to join")
    advancing(8)
    assert not client.progress().finished, "the server kill should land mid-job"
    cluster.killing("ps0")  # rollback to the last snapshot, with the ledger
    cluster.starting_worker("ps2", server_args(cluster))
    for name in ("w0", "w2"):
        assert cluster.waiting_exit(name, 180) == 0, cluster.log(name)[-3000:]
    assert client.progress().finished
    summary = json.loads((cluster.root / "out" / "w0.json").read_text())
    assert summary["rolled_back"] == 1, summary
    return ["w0", "w2"]


@pytest.mark.slow
def test_sparse_ctr_model_through_faults_equals_the_fault_free_run(tmp_path: Path) -> None:
    samples, epochs = 360, 2
    runs = {}
    for faults in (False, True):
        cluster = Cluster(tmp_path / ("faulted" if faults else "clean"))
        cluster.root.mkdir()
        try:
            runs[faults] = [
                final(cluster, n) for n in running_ctr(cluster, samples, epochs, faults)
            ]
        finally:
            cluster.stopping_all()
    reference = runs[False][0]
    assert set(reference) == {
        "embedding.weight",
        "hidden.weight",
        "hidden.bias",
        "out.weight",
        "out.bias",
    }
    for parameters in runs[True]:
        for key, value in reference.items():
            np.testing.assert_allclose(parameters[key], value, rtol=1e-9, atol=1e-11, err_msg=key)
    from .paddle_ps_job import ctr

    initial = {key: value.numpy() for key, value in ctr().state_dict().items()}
    for key, value in initial.items():  # the job trained every parameter
        assert not np.allclose(reference[key], value), key
