"""``spec.suspend`` on a running job, on a real API server with the kubelet in miniature
running a real coordinator and framework-free workers (``trainer_runtime.plain_worker``).

What a suspended job keeps: its coordinator pod (no GPU; it holds the ledger: the committed
samples, the shard queue, the generation) and the ConfigMap with the coordinator's saved
state. Its replicas all leave. The live coordinator is kept because the ConfigMap's copy
lags it by up to the snapshot period: only the coordinator holds the exact ledger, so a
resumed job neither repeats nor skips a sample.

Aspects tested:
- ``suspend: true`` on a running job: every worker drains through the coordinator (exits 0
  well before the drain deadline, no restart charged) and its pod goes; phase Suspended,
  Event ``Suspended``, condition ``Suspended`` (reason ``UserSuspended``); the same
  coordinator pod and the state ConfigMap remain; no sample is committed while suspended;
- ``suspend: false``: Event ``Resumed``, the condition turns False, the job runs again from
  the samples it had committed (never back to 0) and succeeds; the workers' ledger files show
  every sample trained exactly once;
- an allreduce PyTorch job naming ``edl.dev/checkpoints`` (a directory on a shared volume of
  its template): suspended, its drained rank 0 leaves a checkpoint in ``<dir>/<uid>``; resumed,
  fresh workers load it, train only the steps after it, and end with the parameters of an
  uninterrupted single-process run.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch

from trainer_runtime.torch.checkpointing import stored_steps

from ..runtime.test_torch_elastic import JOB, reference_parameters
from .controller_harness import (
    POOL,
    Cluster,
    ControllerProcess,
    controller_fixtures,
    eventually,
    training_job,
)
from .ledgers import acknowledged, assert_exactly_once, plain_worker
from .nodes import create_node
from .testenv import KubeAPI

NS = "ctrl-suspend"
cluster, controller = controller_fixtures(NS, "suspend", "26100-26199")


def test_suspend_keeps_the_ledger_and_resume_continues_from_it(
    kube_api: KubeAPI, cluster: Cluster, controller: ControllerProcess, tmp_path: Path
) -> None:
    create_node(kube_api.api_client, "susp-0", gpus=2, labels={POOL: "susp"}, kubelet=True)
    samples = 4000
    # The drain deadline is longer than any wait below: a worker gone within it left
    # gracefully, through its coordinator's drain, not at the deadline.
    manifest = training_job(
        "nap", NS, min_replicas=1, max_replicas=2, samples=samples,
        command=plain_worker(tmp_path), pool="susp", drain_seconds=300,
        env={"EDL_TIMEOUT_S": "120"},
    )  # fmt: skip
    cluster.create_job(manifest)
    eventually(lambda: cluster.samples_done(NS, "nap") >= 500, 90, "the job training")
    coordinator = cluster.pods(NS, "nap", "coordinator")[0].metadata.uid
    cluster.set_suspend(NS, "nap", True)

    def suspended() -> bool:
        return cluster.status(NS, "nap").get("phase") == "Suspended" and not cluster.pods(
            NS, "nap", "worker"
        )

    eventually(suspended, 60, "phase Suspended with no worker pod left")
    cluster.told(NS, "nap", "Suspended")
    held = cluster.condition(NS, "nap", "Suspended")
    assert held is not None and held["status"] == "True" and held["reason"] == "UserSuspended"
    kept = cluster.pods(NS, "nap", "coordinator")
    assert [p.metadata.uid for p in kept] == [coordinator], "the coordinator pod is kept"
    assert kept[0].status.phase == "Running"
    state = cluster.core.read_namespaced_config_map("nap-coordinator-state", NS)
    assert state.metadata.owner_references[0].name == "nap"

    # The status shows the coordinator's progress of up to a poll and a cycle ago: the last
    # shards the drained workers committed may show after their pods have gone. Their
    # processes have exited, so their ledgers hold every commit acknowledged to them (a
    # value that stayed put for a while told that apart only on an unloaded machine).
    done = acknowledged(tmp_path)
    eventually(
        lambda: cluster.samples_done(NS, "nap") >= done,
        30,
        f"the {done} samples the drained workers committed shown",
    )
    at_suspension = cluster.samples_done(NS, "nap")
    assert 0 < at_suspension < samples, "the suspension was to land mid-run"
    time.sleep(3)  # three more progress polls: nothing trains while suspended
    assert cluster.samples_done(NS, "nap") == at_suspension
    assert cluster.status(NS, "nap")["restarts"] == 0, "drained workers are not failures"

    cluster.set_suspend(NS, "nap", False)
    cluster.told(NS, "nap", "Resumed")
    eventually(lambda: cluster.samples_done(NS, "nap") > at_suspension, 90, "training again")
    eventually(lambda: cluster.status(NS, "nap").get("phase") == "Succeeded", 120, "Succeeded")
    assert cluster.status(NS, "nap")["restarts"] == 0
    assert_exactly_once(tmp_path, samples)
    cleared = cluster.condition(NS, "nap", "Suspended")
    assert cleared is not None and cleared["status"] == "False"


def test_allreduce_job_keeps_its_model_where_edl_dev_checkpoints_names(
    kube_api: KubeAPI, cluster: Cluster, controller: ControllerProcess, tmp_path: Path
) -> None:
    create_node(kube_api.api_client, "susp-ck-0", gpus=2, labels={POOL: "susp-ck"}, kubelet=True)
    samples, epochs, batch = 600, 2, 12
    shared, out = tmp_path / "shared", tmp_path / "out"
    command = [
        sys.executable, JOB, "--kind", "mlp", "--samples", str(samples),
        "--global-batch", str(batch), "--step-sleep-s", "0.1", "--out", str(out),
    ]  # fmt: skip
    manifest = training_job(
        "ckpt", NS, min_replicas=2, max_replicas=2, framework="torch", command=command,
        pool="susp-ck", drain_seconds=300, env={"EDL_TIMEOUT_S": "120"},
    )  # fmt: skip
    manifest["metadata"]["annotations"] = {
        "edl.dev/coordinator-args": (
            f"--samples {samples} --shard-size 10 --epochs {epochs} --join-window-s 0.3"
        ),
        "edl.dev/checkpoints": f"{shared}/ckpt",
    }
    spec = manifest["spec"]["template"]["spec"]
    spec["volumes"] = [{"name": "shared", "persistentVolumeClaim": {"claimName": "ckpt"}}]
    spec["containers"][0]["volumeMounts"] = [{"name": "shared", "mountPath": str(shared)}]
    cluster.create_job(manifest)
    directory = shared / "ckpt" / cluster.job(NS, "ckpt")["metadata"]["uid"]

    def step() -> int:
        return int(cluster.status(NS, "ckpt").get("progress", {}).get("committedStep", 0))

    eventually(lambda: step() >= 10, 120, "ten committed steps")
    first = {p.metadata.name for p in cluster.pods(NS, "ckpt", "worker")}
    assert all(
        env.value == str(directory)
        for p in cluster.pods(NS, "ckpt", "worker")
        for env in p.spec.containers[0].env
        if env.name == "EDL_CHECKPOINT_DIR"
    ), "each worker is told the job's own checkpoint directory"
    cluster.set_suspend(NS, "ckpt", True)
    eventually(
        lambda: (
            cluster.status(NS, "ckpt").get("phase") == "Suspended"
            and not cluster.pods(NS, "ckpt", "worker")
        ),
        90,
        "phase Suspended with no worker pod left",
    )
    saved = stored_steps(directory)
    assert saved, f"no checkpoint in {directory}"
    steps = samples * epochs // batch
    assert 0 < saved[0] < steps, "the suspension was to land mid-run"

    cluster.set_suspend(NS, "ckpt", False)
    eventually(lambda: cluster.status(NS, "ckpt").get("phase") == "Succeeded", 180, "Succeeded")
    assert cluster.status(NS, "ckpt")["restarts"] == 0
    resumed = {p.stem for p in out.glob("*.json")} - first
    assert len(resumed) == 2, resumed
    # The first of them began at the checkpoint's step, the other there or later, when it
    # joined (a start from scratch would give the same parameters: this is what shows the
    # checkpoint was loaded, and only the steps after it were trained again).
    results = [json.loads((out / f"{name}.json").read_text()) for name in resumed]
    assert min(r["began"] for r in results) == saved[0], (results, saved)
    assert all(r["step"] == steps for r in results), results
    expected = reference_parameters(samples, epochs, batch)
    for name in resumed:
        final = torch.load(out / f"{name}.pt")
        for key, value in expected.items():
            torch.testing.assert_close(final[key], value, rtol=1e-9, atol=1e-10)
