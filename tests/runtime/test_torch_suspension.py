"""An allreduce job suspended to zero workers (every worker drained), then resumed by fresh
processes, under real processes on CPU (gloo).

Aspects:
- with `EDL_CHECKPOINT_DIR`, the drained rank 0 leaves a checkpoint, the fresh rank 0
  loads it, and the job ends with the parameters of an uninterrupted fixed-size run (so no
  step was lost or trained twice) and the ledger finished;
- without it, the rollback is explicit and exact: the fresh workers start over from the
  initial model, even past what the ledger's history can revert, and every per-sample
  counter ends at exactly the number of epochs; workers and coordinator say so in their logs.
"""

from __future__ import annotations

import json

import pytest
import torch

from trainer_runtime.coordinator.ledger import HISTORY_STEPS
from trainer_runtime.torch.checkpointing import stored_steps

from .harness import Cluster, waiting_for
from .test_torch_elastic import coordinator_args, job_args, reference_parameters


def suspending(
    cluster: Cluster, workers: tuple[str, ...], at_step: int, startup_s: float = 90
) -> int:
    """Let the job reach `at_step` (its workers started within `startup_s`), drain every
    worker, and return the committed step."""
    client = cluster.client()
    everyone = sorted(workers)
    waiting_for(
        lambda: sorted(m.worker_id for m in client.progress().members) == everyone,
        startup_s,
        "every worker to join",
    )
    waiting_for(lambda: client.progress().committed_step >= at_step, startup_s, f"step {at_step}")
    for name in workers:
        client.drain(name)
    for name in workers:
        assert cluster.waiting_exit(name, 60) == 0, cluster.log(name)[-3000:]
    progress = client.progress()
    assert not progress.members and not progress.finished
    return int(progress.committed_step)


@pytest.mark.slow
def test_suspended_job_resumes_from_its_checkpoint_as_if_uninterrupted(cluster: Cluster) -> None:
    samples, epochs, batch = 600, 2, 12
    cluster.starting_coordinator(*coordinator_args(samples, epochs))
    out = cluster.root / "out"
    checkpoints = cluster.root / "checkpoints"
    args = job_args("mlp", samples, out, batch=batch, sleep_s=0.05)
    extra = {"EDL_CHECKPOINT_DIR": str(checkpoints)}
    for name in ("w0", "w1"):
        cluster.starting_worker(name, args, extra)
    committed = suspending(cluster, ("w0", "w1"), at_step=10)
    saved = stored_steps(checkpoints)
    assert saved and saved[0] >= committed, (saved, committed)
    for name in ("w2", "w3"):  # fresh processes: no state of their own
        cluster.starting_worker(name, args, extra)
    for name in ("w2", "w3"):
        assert cluster.waiting_exit(name, 120) == 0, cluster.log(name)[-3000:]
    progress = cluster.client().progress()
    steps = samples * epochs // batch
    assert progress.finished and progress.committed_step == steps
    # the fresh workers trained only the steps after the checkpoint (a start from scratch
    # would give the same parameters, so this is what shows the checkpoint was taken): the
    # first rank 0 began at its step; the other there too, or later if it joined later
    began = [json.loads((out / f"{n}.json").read_text())["began"] for n in ("w2", "w3")]
    assert min(began) == saved[0], (began, saved)
    expected = reference_parameters(samples, epochs, batch)
    for name in ("w2", "w3"):
        final = torch.load(out / f"{name}.pt")
        for key, value in expected.items():
            torch.testing.assert_close(final[key], value, rtol=1e-9, atol=1e-10)


@pytest.mark.slow
def test_suspension_without_a_checkpoint_location_starts_over_loudly(cluster: Cluster) -> None:
    samples, epochs = 500, 1
    cluster.starting_coordinator(*coordinator_args(samples, epochs))
    out = cluster.root / "out"
    args = job_args("ledger", samples, out, batch=1, sleep_s=0.01)
    cluster.starting_worker("w0", args)
    committed = suspending(cluster, ("w0",), at_step=HISTORY_STEPS + 10)
    assert committed > HISTORY_STEPS  # more than the ledger's history could revert
    assert "no EDL_CHECKPOINT_DIR" in cluster.log("w0")
    cluster.starting_worker("w1", args)
    assert cluster.waiting_exit("w1", 120) == 0, cluster.log("w1")[-3000:]
    assert "EDL_CHECKPOINT_DIR is not set" in cluster.log("w1")
    assert "rolls back from step" in cluster.log("coordinator")
    counts = torch.load(out / "w1.pt")["counts"]
    assert torch.equal(counts, torch.full((samples,), float(epochs), dtype=torch.float64))
    assert cluster.client().progress().finished
