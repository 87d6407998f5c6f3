"""The example CTR job, ``manifests/examples/ctr-parameter-server.yaml``, through the operator
on a real API server with the kubelet in miniature running the real coordinator, parameter
servers (``python -m trainer_runtime.ps``) and the example's PaddlePaddle workers
(``examples/07-ctr/train.py``, wide-and-deep with two row-sparse tables).

The manifest is loaded as written and keeps its structure (``strategy: ps``, the
``pserver`` block, ``framework: paddle``, the ``edl.dev/ps-snapshots`` annotation, the
snapshot volume and its mount, the node affinity, the resources); only what a test cluster
must differ is substituted: the container's command (``/app`` is this repository, the
interpreter this test's), small sizes in its arguments and the coordinator's (the two
``--samples`` equal), 2 workers and 2 servers, the namespace, the snapshot mount on the
test's directory, and the coordinator's state in a snapshot (no volume here). The test's
node carries the instance type the affinity asks for.

Aspects tested:
- the job runs with the servers the pserver block asks for, told the snapshot directory the
  annotation names plus the job's uid, as the workers are;
- a server pod deleted mid-run: the controller creates a replacement, a worker rolls back
  to the last snapshot, and the job Succeeds with no restart charged;
- the workers that ran to the end hold the same model, which learned: its held-out AUC is
  far above a constant predictor's (0.5) and its log loss below the constant's (the
  training click rate's, which the example prints beside it).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import yaml

from .controller_harness import Cluster, ControllerProcess, controller_fixtures, eventually
from .kubelet import MiniKubelet
from .nodes import create_node
from .testenv import REPO, KubeAPI

NS = "ctrl-ctr"
MANIFEST = REPO / "manifests" / "examples" / "ctr-parameter-server.yaml"
TRAIN = REPO / "examples" / "07-ctr" / "train.py"
SAMPLES, EPOCHS, BATCH = 8192, 2, 64
STEPS = SAMPLES * EPOCHS // BATCH
#: `wK: done, N steps, auc A (true model T), log loss L (constant C)` (train.py's last line)
SUMMARY = re.compile(
    r"done, \d+ steps, auc ([\d.]+) \(true model [\d.]+\), log loss ([\d.]+) \(constant ([\d.]+)\)"
)

cluster, controller = controller_fixtures(NS, "ctr", "26400-26499")


def example_job(snapshots: Path) -> dict[str, Any]:
    """The example manifest with a test cluster's substitutions (see the module docstring)."""
    manifest: dict[str, Any] = yaml.safe_load(MANIFEST.read_text())
    spec, annotations = manifest["spec"], manifest["metadata"]["annotations"]
    pod = spec["template"]["spec"]
    (container,) = pod["containers"]
    (mount,) = container["volumeMounts"]
    assert (spec["strategy"], spec["framework"]) == ("ps", "paddle")
    assert container["command"] == ["python", "/app/examples/07-ctr/train.py"]
    assert annotations["edl.dev/ps-snapshots"].startswith(mount["mountPath"] + "/")
    assert pod["volumes"][0]["name"] == mount["name"]

    manifest["metadata"]["namespace"] = NS
    container["command"] = [sys.executable, str(TRAIN)]
    sizes = {"--samples": SAMPLES, "--vocabulary": 5000, "--cardinality": 500,
             "--global-batch": BATCH}  # fmt: skip
    args = list(container["args"])
    for option, value in sizes.items():
        args[args.index(option) + 1] = str(value)
    container["args"] = [*args, "--snapshot-every", "5"]
    container["env"] = [{"name": "OMP_NUM_THREADS", "value": "1"}]
    annotations["edl.dev/coordinator-args"] = (
        f"--samples {SAMPLES} --shard-size 64 --epochs {EPOCHS} --lease-timeout-s 15"
    )
    inside = annotations["edl.dev/ps-snapshots"].removeprefix(mount["mountPath"])
    mount["mountPath"] = str(snapshots)
    annotations["edl.dev/ps-snapshots"] = f"{snapshots}{inside}"
    spec["minReplicas"] = spec["maxReplicas"] = 2
    spec["pserver"]["minReplicas"] = spec["pserver"]["maxReplicas"] = 2
    spec["coordinator"]["state"] = {"kind": "snapshot"}  # the test cluster has no volumes
    return manifest


def affinity_labels() -> dict[str, str]:
    """Labels of a node the manifest's node affinity selects (its first value of each `In`)."""
    manifest = yaml.safe_load(MANIFEST.read_text())
    affinity = manifest["spec"]["template"]["spec"]["affinity"]["nodeAffinity"]
    (term,) = affinity["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    found = {e["key"]: e["values"][0] for e in term["matchExpressions"] if e["operator"] == "In"}
    return {str(k): str(v) for k, v in found.items()}


def env_of(pod: Any) -> dict[str, str]:
    return {e.name: e.value for e in pod.spec.containers[0].env if e.value is not None}


def live(pods: list[Any]) -> list[Any]:
    return [p for p in pods if not p.metadata.deletion_timestamp and p.status.phase == "Running"]


def test_the_example_ctr_job_survives_a_deleted_server_and_learns(
    kube_api: KubeAPI,
    cluster: Cluster,
    controller: ControllerProcess,
    kubelet: MiniKubelet,
    tmp_path: Path,
) -> None:
    create_node(kube_api.api_client, "ctr-0", gpus=0, labels=affinity_labels(), kubelet=True)
    manifest = example_job(tmp_path / "snapshots")
    name = manifest["metadata"]["name"]
    cluster.create_job(manifest)
    uid = cluster.job(NS, name)["metadata"]["uid"]
    workers: set[str] = set()

    def progress() -> dict[str, Any]:
        found: dict[str, Any] = cluster.status(NS, name).get("progress", {})
        return found

    def running(at_least: int) -> bool:
        servers = live(cluster.pods(NS, name, "pserver"))
        found = live(cluster.pods(NS, name, "worker"))
        workers.update(p.metadata.name for p in found)
        return (
            len(servers) == 2 and len(found) == 2 and progress().get("committedStep", 0) >= at_least
        )

    eventually(lambda: running(STEPS // 4), 180, f"2 servers, 2 workers, {STEPS // 4} steps")
    servers = cluster.pods(NS, name, "pserver")
    expected_dir = f"{manifest['metadata']['annotations']['edl.dev/ps-snapshots']}/{uid}"
    for pod in [*servers, *cluster.pods(NS, name, "worker")]:
        assert env_of(pod)["EDL_PS_SNAPSHOTS"] == expected_dir
    for pod in servers:
        assert pod.spec.containers[0].command[:3] == ["python", "-m", "trainer_runtime.ps"]
        assert pod.spec.containers[0].resources.requests["cpu"] == "8"
    assert any(Path(expected_dir).glob("step-*")), "the servers write their snapshots there"

    victim = servers[0].metadata.name
    assert not progress().get("finished"), "the server deletion should land mid-run"
    cluster.core.delete_namespaced_pod(victim, NS)

    def replaced() -> bool:
        names = {p.metadata.name for p in live(cluster.pods(NS, name, "pserver"))}
        return len(names) == 2 and victim not in names

    eventually(replaced, 90, "a replacement server")
    eventually(
        lambda: cluster.status(NS, name).get("phase") == "Succeeded",
        240,
        "Succeeded",
        lambda: controller.log_tail(30),
    )
    assert cluster.status(NS, name)["restarts"] == 0, "a deleted server is no failure"

    def summaries() -> dict[str, list[float]]:
        found = {w: SUMMARY.search(kubelet.logs(NS, w)) for w in workers}
        return {w: [float(v) for v in m.groups()] for w, m in found.items() if m is not None}

    finals = eventually(lambda: len(summaries()) == 2 and summaries(), 60, "workers' summaries")
    logs = "".join(kubelet.logs(NS, w) for w in workers)
    rollbacks = [int(s) for s in re.findall(r"starts from the snapshot of step (\d+)", logs)]
    assert any(0 < s < STEPS for s in rollbacks), f"no rollback mid-run: {rollbacks}"
    first, second = finals.values()
    assert first == second, finals  # the same final model
    auc, loss, constant = first
    assert auc >= 0.7, finals  # a constant scores 0.5
    assert loss < constant - 0.05, finals
