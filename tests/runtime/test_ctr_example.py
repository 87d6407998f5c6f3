"""The CTR example (`examples/07-ctr/train.py`, wide-and-deep in PaddlePaddle, two row-sparse
tables) under real processes: a coordinator, parameter servers and workers on CPU.

Aspects:
- 2 workers and 2 servers; a server SIGKILLed mid-run (the job rolls back to its last
  snapshot) and a replacement server started: the job finishes, every worker exits 0, the
  workers end with the same model, and that model learned: its held-out AUC is far above a
  constant predictor's (0.5) and its log loss below the constant's, the log loss of the
  training data's click rate, computed here from the data the script makes;
- (no processes) the script's AUC is 0.5 for a constant, 1 for a perfect ranking and 0 for
  a reversed one; its options refuse `--epochs` (the coordinator's) with the fix.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from types import ModuleType

import numpy as np
import pytest

from .harness import REPO, Cluster, waiting_for
from .test_ps_elastic import server_args

TRAIN = REPO / "examples" / "07-ctr" / "train.py"
SAMPLES, EPOCHS = 32768, 2
#: `wK: done, N steps, auc A (true model T), log loss L (constant C)`
SUMMARY = re.compile(
    r"(w\d+): done, (\d+) steps, auc ([\d.]+) \(true model ([\d.]+)\), "
    r"log loss ([\d.]+) \(constant ([\d.]+)\)"
)


def example() -> ModuleType:
    """train.py as a module (its data, model and metrics), without running it."""
    spec = importlib.util.spec_from_file_location("ctr_example", TRAIN)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def constant_log_loss(ctr: ModuleType) -> float:
    """The held-out log loss of the best constant: the training data's click rate."""
    truth = ctr.TrueModel(0, 2000, 20000)  # train.py's defaults
    train, held_out = truth.sampling(SAMPLES, 1, 0), truth.sampling(4096, 2, 0)
    rate = float(train.clicks.mean())
    clicks = held_out.clicks.astype(np.float64)
    return float(-np.mean(clicks * np.log(rate) + (1 - clicks) * np.log(1 - rate)))


@pytest.mark.slow
def test_ctr_example_learns_through_a_server_sigkill(cluster: Cluster) -> None:
    cluster.starting_coordinator(
        "--samples", str(SAMPLES), "--shard-size", "256", "--epochs", str(EPOCHS),
        "--join-window-s", "0.3", "--lease-timeout-s", "15",
    )  # fmt: skip
    client = cluster.client()
    snapshots = {"EDL_PS_SNAPSHOTS": str(cluster.root / "snapshots")}
    for name in ("ps0", "ps1"):
        cluster.starting_worker(name, server_args(cluster))
    workers = ("w0", "w1")
    for name in workers:
        cluster.starting_worker(name, [str(TRAIN), "--samples", str(SAMPLES)], snapshots)
    steps = SAMPLES * EPOCHS // 256
    waiting_for(lambda: client.progress().committed_step >= steps // 4, 180, "a quarter")
    cluster.killing("ps1")  # the job rolls back to its last snapshot
    assert not client.progress().finished, "the server kill should land mid-job"
    cluster.starting_worker("ps2", server_args(cluster))  # what a controller would do
    for name in workers:
        assert cluster.waiting_exit(name, 240) == 0, cluster.log(name)[-3000:]
    assert client.progress().finished
    for name in ("ps0", "ps2"):
        assert cluster.waiting_exit(name, 60) == 0, cluster.log(name)[-3000:]

    logs = {name: cluster.log(name) for name in workers}
    said = "".join(logs.values())
    rollbacks = [int(s) for s in re.findall(r"starts from the snapshot of step (\d+)", said)]
    assert any(0 < s < steps for s in rollbacks), f"no rollback mid-run: {rollbacks}"
    summaries = {}
    for name, log in logs.items():
        found = SUMMARY.search(log)
        assert found is not None, log[-3000:]
        summaries[name] = [float(v) for v in found.groups()[1:]]
    assert summaries["w0"][1:] == summaries["w1"][1:], summaries  # the same final model
    _, auc, true_auc, loss, constant = summaries["w0"]
    assert constant == pytest.approx(constant_log_loss(example()), abs=1e-4)
    assert auc >= 0.70 and auc < true_auc, summaries  # a constant scores 0.5
    assert loss < constant - 0.05, summaries
    assert "step 50 world 2 loss" in said  # rank 0's progress


def test_auc_of_constant_perfect_and_reversed_scores() -> None:
    ctr = example()
    labels = np.array([0, 1, 0, 1, 1, 0], dtype=np.float32)
    assert ctr.auc(np.zeros(6), labels) == 0.5
    assert ctr.auc(labels * 2.0 - 1.0, labels) == 1.0
    assert ctr.auc(1.0 - labels, labels) == 0.0
    scores = np.array([0.1, 0.4, 0.4, 0.8, 0.15, 0.2])  # a tie, and a click below a non-click
    assert ctr.auc(scores, labels) == pytest.approx(6.5 / 9)
    with pytest.raises(ValueError, match="--eval-samples"):
        ctr.auc(np.zeros(3), np.zeros(3))


def test_epochs_are_refused_with_the_coordinators_option() -> None:
    done = subprocess.run(
        [sys.executable, str(TRAIN), "--epochs", "3"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        timeout=60,
    )
    assert done.returncode == 2
    assert "--epochs is the coordinator's" in done.stderr
    assert "edl.dev/coordinator-args" in done.stderr
