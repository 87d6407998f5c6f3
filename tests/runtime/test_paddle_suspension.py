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

import pytest

from trainer_runtime.checkpoints import stored_steps

from .harness import Cluster
from .test_paddle_elastic import STARTUP_S, coordinator_args, job_args, matching_reference
from .test_torch_suspension import suspending


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
    cluster.client().set_target(2)
    for name in ("w0", "w1"):
        cluster.starting_worker(name, args, extra)
    committed = suspending(cluster, ("w0", "w1"), at_step=10, startup_s=STARTUP_S)
    saved = stored_steps(checkpoints)
    assert saved and saved[0] >= committed, (saved, committed)
    for name in ("w2", "w3"):  # fresh processes: no state of their own
        cluster.starting_worker(name, args, extra)
    for name in ("w2", "w3"):
        assert cluster.waiting_exit(name, STARTUP_S) == 0, cluster.log(name)[-3000:]
    progress = cluster.client().progress()
    steps = samples * epochs // batch
    assert progress.finished and progress.committed_step == steps
    # the first rank 0 began at the checkpoint's step (the other there or later): the
    # checkpoint was loaded, not the job started over
    began = [json.loads((out / f"{n}.json").read_text())["began"] for n in ("w2", "w3")]
    assert min(began) == saved[0], (began, saved)
    matching_reference(out, ("w2", "w3"), (samples, epochs, batch), rtol=1e-6, atol=1e-8)
