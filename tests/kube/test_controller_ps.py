"""A parameter-server job (``strategy: ps``) through the operator, on a real API server with
the kubelet in miniature running the real coordinator, parameter servers
(``python -m trainer_runtime.ps``) and PyTorch PS workers (``tests/runtime/ps_job.py``).

The model is the ledger (``ps_job.py --kind ledger``): a counter per sample that SGD with
rate 1 on the servers raises by exactly 1 each time the sample is trained, so after the job
every counter must equal the number of epochs.

Aspects tested:
- the controller creates the servers with the runtime's environment contract (role
  ``pserver``, the pod IP as the address they serve on) and the snapshot directory the job
  names (``edl.dev/ps-snapshots``, on a volume of its template, plus the job's uid), which
  the workers are told too (``EDL_PS_SNAPSHOTS``); the servers carry the pserver resources;
- a server pod deleted mid-run: the job rolls back to the last snapshot and the controller
  creates a replacement server; then the whole job is suspended (every server and worker
  leaves, the coordinator stays) and resumed (new servers restore the partitions from the
  snapshots); it succeeds with no restart charged, and the resumed workers' final
  parameters count every sample exactly ``epochs`` times;
- whole-job preemption: a rigid higher-priority job that needs the PS job's GPUs takes them
  (policy ``shrink-then-suspend``): the PS job is Suspended with reason Preempted, its
  servers drained with its workers (no restart charged), the coordinator kept; once the
  other job has succeeded it is admitted again, new servers restore the snapshots, and the
  final parameters count every sample exactly ``epochs`` times;
- a ``ps`` job that names no shared snapshot storage is refused with ``Valid=False`` and an
  Event saying which annotation to set; it gets no pod;
- the example ``examples/05-parameter-server/trainingjob.yaml`` (a claim and the job) is
  accepted by the API server (a server-side dry run) and names usable snapshot storage;
- (no API server) each way of naming unusable snapshot storage (no annotation, a relative
  path, a path on no mount, a mount without its volume, a volume each pod sees alone, a
  read-only mount) is an error naming the field and the fix.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from edl_scheduler.api import load_training_job
from edl_scheduler.controller.shaping import ShapingError, ps_snapshot_dir

from .controller_harness import (
    POOL,
    Cluster,
    ControllerProcess,
    controller_fixtures,
    eventually,
    training_job,
)
from .nodes import create_node
from .testenv import REPO, KubeAPI

NS = "ctrl-ps"
JOB = str(REPO / "tests" / "runtime" / "ps_job.py")
SAMPLES, EPOCHS = 480, 2
# Whole-job preemption for the preemption test; nothing else here competes for GPUs.
POLICY = (
    "base: edl\npreemption: shrink-then-suspend\ncooldown_seconds: 0\nmin_run_seconds: 0\n"
    "suspend_cost_seconds: 0\n"
)


cluster, controller = controller_fixtures(NS, "ps", "26200-26299", policy=POLICY)


def ps_job(
    name: str, shared: Path, out: Path, *, snapshots: bool = True, pool: str = "ps"
) -> dict[str, Any]:
    # The workers write their final parameters (what the test reads) after the job
    # finished: the controller lets them exit on their own before it clears the job's pods.
    worker = [
        sys.executable, JOB, "--kind", "ledger", "--samples", str(SAMPLES),
        "--global-batch", "6", "--snapshot-dir", "$(EDL_PS_SNAPSHOTS)", "--snapshot-every", "5",
        "--step-sleep-s", "0.05", "--out", str(out),
    ]  # fmt: skip
    manifest = training_job(
        name, NS, min_replicas=2, max_replicas=2, framework="torch", command=worker,
        extra_spec={
            "strategy": "ps",
            "pserver": {"minReplicas": 2, "maxReplicas": 2,
                        "resources": {"cpu": "500m", "memory": "512Mi"}},
        },
        pool=pool, drain_seconds=20, env={"EDL_TIMEOUT_S": "120"},
    )  # fmt: skip
    manifest["metadata"]["annotations"] |= {
        "edl.dev/coordinator-args": (
            f"--samples {SAMPLES} --shard-size 10 --epochs {EPOCHS} --lease-timeout-s 15"
        ),
    }
    if snapshots:
        manifest["metadata"]["annotations"]["edl.dev/ps-snapshots"] = f"{shared}/ps"
    spec = manifest["spec"]["template"]["spec"]
    spec["volumes"] = [{"name": "shared", "persistentVolumeClaim": {"claimName": "ps-shared"}}]
    spec["containers"][0]["volumeMounts"] = [{"name": "shared", "mountPath": str(shared)}]
    return manifest


def env_of(pod: Any) -> dict[str, str]:
    return {e.name: e.value for e in pod.spec.containers[0].env if e.value is not None}


def step(cluster: Cluster, name: str = "ctr") -> int:
    return int(cluster.status(NS, name).get("progress", {}).get("committedStep", 0))


def live(pods: list[Any]) -> list[Any]:
    return [p for p in pods if not p.metadata.deletion_timestamp and p.status.phase == "Running"]


def test_ps_job_survives_a_deleted_server_and_a_suspension_with_an_exact_ledger(
    kube_api: KubeAPI, cluster: Cluster, controller: ControllerProcess, tmp_path: Path
) -> None:
    create_node(kube_api.api_client, "ps-0", gpus=2, labels={POOL: "ps"}, kubelet=True)
    shared, out = tmp_path / "shared", tmp_path / "out"
    cluster.create_job(ps_job("ctr", shared, out))
    uid = cluster.job(NS, "ctr")["metadata"]["uid"]

    def running() -> bool:
        servers = live(cluster.pods(NS, "ctr", "pserver"))
        workers = live(cluster.pods(NS, "ctr", "worker"))
        step = cluster.status(NS, "ctr").get("progress", {}).get("committedStep", 0)
        return len(servers) == 2 and len(workers) == 2 and step >= 25

    eventually(running, 120, "two servers, two workers and 25 committed steps")
    servers = cluster.pods(NS, "ctr", "pserver")
    expected_dir = f"{shared}/ps/{uid}"
    for pod in servers:
        env = env_of(pod)
        assert env["EDL_ROLE"] == "pserver" and env["EDL_PS_SNAPSHOTS"] == expected_dir
        assert pod.spec.containers[0].command[:3] == ["python", "-m", "trainer_runtime.ps"]
        assert "$(EDL_WORKER_HOST)" in pod.spec.containers[0].command
        assert pod.spec.containers[0].resources.requests["cpu"] == "500m"
        assert "nvidia.com/gpu" not in pod.spec.containers[0].resources.requests
        assert pod.spec.volumes[0].persistent_volume_claim.claim_name == "ps-shared"
    for pod in cluster.pods(NS, "ctr", "worker"):
        assert env_of(pod)["EDL_PS_SNAPSHOTS"] == expected_dir
    assert any(Path(expected_dir).glob("step-*")), "the servers write their snapshots there"

    victim = servers[0].metadata.name
    cluster.core.delete_namespaced_pod(victim, NS)

    def replaced() -> bool:
        names = {p.metadata.name for p in live(cluster.pods(NS, "ctr", "pserver"))}
        return len(names) == 2 and victim not in names

    eventually(replaced, 60, "a replacement server")
    eventually(lambda: step(cluster) >= 45, 90, "training on after the rollback")

    # The whole job suspended and resumed: the servers leave too; the new ones restore the
    # partitions from the snapshots, the coordinator (kept) the ledger.
    coordinator = cluster.pods(NS, "ctr", "coordinator")[0].metadata.uid
    cluster.set_suspend(NS, "ctr", True)

    def suspended() -> bool:
        replicas = [p for p in cluster.pods(NS, "ctr")
                    if p.metadata.labels["edl.dev/role"] != "coordinator"]  # fmt: skip
        return cluster.status(NS, "ctr").get("phase") == "Suspended" and not replicas

    eventually(suspended, 60, "Suspended with no server or worker left")
    assert not cluster.status(NS, "ctr")["progress"]["finished"], "suspended mid-run"
    assert [p.metadata.uid for p in cluster.pods(NS, "ctr", "coordinator")] == [coordinator]
    cluster.set_suspend(NS, "ctr", False)
    eventually(lambda: cluster.status(NS, "ctr").get("phase") == "Succeeded", 150, "Succeeded")
    assert cluster.status(NS, "ctr")["restarts"] == 0, "deleted and drained servers are no failures"

    expected = torch.full((SAMPLES,), float(EPOCHS), dtype=torch.float64)
    for name, counts in final_counts(out).items():
        assert torch.equal(counts, expected), f"{name}: {counts.unique(return_counts=True)}"
    summaries = [json.loads(p.read_text()) for p in out.glob("*.json")]
    assert any(s["rolled_back"] >= 1 for s in summaries), summaries


def final_counts(out: Path) -> dict[str, torch.Tensor]:
    """The parameters of the workers that pulled the last step (those that ran to the end),
    once two have written them: each sample's counter."""
    steps = SAMPLES * EPOCHS // 6
    summaries: dict[str, dict[str, Any]] = {}

    def finals() -> list[str]:
        summaries.update({p.stem: json.loads(p.read_text()) for p in out.glob("*.json")})
        final = [name for name, s in summaries.items() if s["pulled"] == steps]
        return final if len(final) == 2 else []

    names = eventually(finals, 60, "the final workers' parameters")
    return {name: torch.load(out / f"{name}.pt")["counts"] for name in names}


def test_ps_job_preempted_whole_resumes_with_an_exact_ledger(
    kube_api: KubeAPI, cluster: Cluster, controller: ControllerProcess, tmp_path: Path
) -> None:
    create_node(kube_api.api_client, "ps-pre-0", gpus=2, labels={POOL: "ps-pre"}, kubelet=True)
    shared, out = tmp_path / "shared", tmp_path / "out"
    low = ps_job("low", shared, out, pool="ps-pre")
    low["spec"]["priority"] = 10
    cluster.create_job(low)
    eventually(lambda: step(cluster, "low") >= 25, 120, "the PS job 25 steps in")
    coordinator = cluster.pods(NS, "low", "coordinator")[0].metadata.uid
    slow = [sys.executable, "-m", "trainer_runtime.plain_worker", "--step-time-s", "0.1"]
    high = training_job(  # about 10 s of training: long enough to see the PS job suspended
        "high", NS, min_replicas=2, max_replicas=2, priority=100, samples=2000, command=slow,
        pool="ps-pre",
    )  # fmt: skip
    cluster.create_job(high)

    def suspended() -> bool:
        # Its servers retire (marked draining) but stay until the drain deadline or the
        # job's next generation: no worker is left to lead the move of their partitions,
        # and a re-admission in time takes their parameters over without a rollback.
        servers = [p for p in cluster.pods(NS, "low", "pserver")
                   if not p.metadata.deletion_timestamp]  # fmt: skip
        draining = all(
            (p.metadata.annotations or {}).get("edl.dev/draining") == "true" for p in servers
        )
        workers = cluster.pods(NS, "low", "worker")
        return cluster.status(NS, "low").get("phase") == "Suspended" and not workers and draining

    eventually(suspended, 60, "the PS job Suspended, no worker left and its servers retiring")
    assert not cluster.status(NS, "low")["progress"]["finished"], "preempted mid-run"
    preempted = [e for e in cluster.told(NS, "low", "Preempted") if e.reason == "Preempted"]
    assert f"{NS}/high" in preempted[0].message and "low-pserver-" in preempted[0].message
    held = next(c for c in cluster.status(NS, "low")["conditions"] if c["type"] == "Suspended")
    assert held["status"] == "True" and held["reason"] == "Preempted"
    assert [p.metadata.uid for p in cluster.pods(NS, "low", "coordinator")] == [coordinator]

    eventually(lambda: cluster.status(NS, "high").get("phase") == "Succeeded", 90, "high Succeeded")
    cluster.told(NS, "low", "Resumed")
    eventually(lambda: cluster.status(NS, "low").get("phase") == "Succeeded", 150, "low Succeeded")
    assert cluster.status(NS, "low")["restarts"] == 0, (
        "preempted servers and workers are no failures"
    )
    expected = torch.full((SAMPLES,), float(EPOCHS), dtype=torch.float64)
    for name, counts in final_counts(out).items():
        assert torch.equal(counts, expected), f"{name}: {counts.unique(return_counts=True)}"


def test_ps_job_without_shared_snapshots_is_refused(
    cluster: Cluster, controller: ControllerProcess, tmp_path: Path
) -> None:
    cluster.create_job(ps_job("bare", tmp_path / "shared", tmp_path / "out", snapshots=False))

    def refused() -> dict[str, Any] | None:
        found = cluster.status(NS, "bare").get("conditions", [])
        return next((c for c in found if c["type"] == "Valid" and c["status"] == "False"), None)

    valid = eventually(refused, 30, "Valid=False")
    assert "edl.dev/ps-snapshots" in valid["message"]
    events = [e for e in cluster.told(NS, "bare", "Invalid") if e.reason == "Invalid"]
    assert "ReadWriteMany" in events[0].message
    assert cluster.pods(NS, "bare") == []
    cluster.delete_job(NS, "bare")


def _broken(change: str) -> dict[str, Any]:
    manifest = ps_job("odd", Path("/shared"), Path("/out"))
    manifest["metadata"]["uid"] = "u-1"
    spec = manifest["spec"]["template"]["spec"]
    mount = spec["containers"][0]["volumeMounts"][0]
    annotations = manifest["metadata"]["annotations"]
    if change == "missing":
        del annotations["edl.dev/ps-snapshots"]
    elif change == "relative":
        annotations["edl.dev/ps-snapshots"] = "shared/ps"
    elif change == "unmounted":
        annotations["edl.dev/ps-snapshots"] = "/elsewhere/ps"
    elif change == "no-volume":
        spec["volumes"] = []
    elif change == "per-pod":
        spec["volumes"] = [{"name": "shared", "emptyDir": {}}]
    elif change == "read-only":
        mount["readOnly"] = True
    return manifest


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ("missing", "is missing"),
        ("relative", "absolute path"),
        ("unmounted", "lies on no volume"),
        ("no-volume", "has no volume 'shared'"),
        ("per-pod", "emptyDir"),
        ("read-only", "read-only"),
    ],
)
def test_unusable_snapshot_storage_is_named_with_the_fix(change: str, says: str) -> None:
    with pytest.raises(ShapingError, match=says):
        ps_snapshot_dir(load_training_job(_broken(change)))


def test_snapshot_dir_is_the_named_directory_plus_the_uid() -> None:
    tj = load_training_job(_broken("none"))
    assert ps_snapshot_dir(tj) == "/shared/ps/u-1"
    manifest = training_job("plain", NS)
    assert ps_snapshot_dir(load_training_job(manifest)) is None


def test_the_example_job_is_accepted_and_names_usable_storage(cluster: Cluster) -> None:
    path = REPO / "examples" / "05-parameter-server" / "trainingjob.yaml"
    claim, manifest = list(yaml.safe_load_all(path.read_text()))
    for doc in (claim, manifest):
        doc["metadata"]["namespace"] = NS
    manifest["spec"].pop("priorityClassName")  # the example's PriorityClass is not here
    manifest["spec"]["priority"] = 10
    cluster.core.create_namespaced_persistent_volume_claim(NS, claim, dry_run="All")
    created = cluster.custom.create_namespaced_custom_object(
        "edl.dev", "v1alpha1", NS, "trainingjobs", manifest, dry_run="All"
    )
    tj = load_training_job(created | {"metadata": created["metadata"] | {"uid": "u-2"}})
    assert ps_snapshot_dir(tj) == "/snapshots/u-2"
