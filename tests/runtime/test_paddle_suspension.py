"""A PaddlePaddle allreduce job suspended to zero workers (every worker drained), then
resumed by fresh processes, under real processes on CPU (gloo).

Aspects:
- with `EDL_CHECKPOINT_DIR`, the drained rank 0 leaves a checkpoint, the fresh rank 0
  loads it, and the job ends with the parameters of an uninterrupted one-process run
  (Momentum state included, to 1e-6), training only the steps after the checkpoint, the
  ledger finished.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from trainer_runtime.checkpoints import stored_steps

from .harness import Cluster, waiting_for
from .test_paddle_elastic import STARTUP_S, coordinator_args, job_args, reference_parameters


@pytest.mark.slow
def test_suspended_paddle_job_resumes_from_its_checkpoint_as_if_uninterrupted(
    cluster: Cluster,
) -> None:
    samples, epochs, batch = 600, 1, 12
    cluster.starting_coordinator(*coordinator_args(samples, epochs))
    out = cluster.root / "out"
    checkpoints = cluster.root / "checkpoints"
    args = job_args("mlp", samples, out, batch=batch, sleep_s=0.05)
    extra = {"EDL_CHECKPOINT_DIR": str(checkpoints)}
    client = cluster.client()
    client.set_target(2)
    for name in ("w0", "w1"):
        cluster.starting_worker(name, args, extra)
    waiting_for(
        lambda: sorted(m.worker_id for m in client.progress().members) == ["w0", "w1"],
        STARTUP_S,
        "both workers to join",
    )
    waiting_for(lambda: client.progress().committed_step >= 10, STARTUP_S, "step 10")
    for name in ("w0", "w1"):
        client.drain(name)
    for name in ("w0", "w1"):
        assert cluster.waiting_exit(name, 60) == 0, cluster.log(name)[-3000:]
    progress = client.progress()
    assert not progress.members and not progress.finished
    saved = stored_steps(checkpoints)
    assert saved and saved[0] >= progress.committed_step, (saved, progress.committed_step)
    for name in ("w2", "w3"):  # fresh processes: no state of their own
        cluster.starting_worker(name, args, extra)
    for name in ("w2", "w3"):
        assert cluster.waiting_exit(name, STARTUP_S) == 0, cluster.log(name)[-3000:]
    progress = cluster.client().progress()
    steps = samples * epochs // batch
    assert progress.finished and progress.committed_step == steps
    trained = [json.loads((out / f"{n}.json").read_text())["steps"] for n in ("w2", "w3")]
    assert max(trained) == steps - saved[0], (trained, saved)
    expected = reference_parameters(samples, epochs, batch)
    for name in ("w2", "w3"):
        final = np.load(out / f"{name}.npz")
        assert sorted(final.files) == sorted(expected)
        for key, value in expected.items():
            np.testing.assert_allclose(final[key], value, rtol=1e-6, atol=1e-8)
