"""The test control plane itself: a real Kubernetes 1.20 API server on 127.0.0.1.

Aspects tested:
- the session fixture starts; Namespaces and ConfigMaps round-trip through the python client;
- Debian's kubectl 1.20 works with the written kubeconfig;
- the controller manager collects garbage (a dependent goes with its owner);
- the project's CRD is accepted by the 1.20 server and becomes Established; every example job
  in manifests/examples is accepted; a job that breaks the schema is refused with 422;
- a Node made by `nodes.create_node` is Ready, untainted and shows its GPUs as allocatable;
- a control plane of its own with kube-scheduler binds a pod to a helper node, and stopping it
  ends every process it started and leaves no directory behind.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import kubernetes
import pytest
import yaml
from kubernetes.client import ApiException

from .controller_harness import ensure_namespace
from .nodes import GPU, create_node
from .testenv import REPO, KubeAPI, ensure_binaries, running_control_plane

CRD_FILE = REPO / "manifests" / "crd" / "trainingjobs.edl.dev.yaml"
EXAMPLES = sorted(
    path
    for path in (REPO / "manifests" / "examples").glob("*.yaml")
    if [doc.get("kind") for doc in yaml.safe_load_all(path.read_text())] == ["TrainingJob"]
)
GROUP, VERSION, PLURAL = "edl.dev", "v1alpha1", "trainingjobs"


def eventually(check: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.1)


@pytest.fixture(scope="module")
def crd(kube_api: KubeAPI) -> Iterator[None]:
    """The project's CRD, applied with kubectl and Established."""
    kube_api.kubectl("apply", "-f", str(CRD_FILE))
    ext = kubernetes.client.ApiextensionsV1Api(kube_api.api_client)

    def established() -> bool:
        found = ext.read_custom_resource_definition(f"{PLURAL}.{GROUP}")
        conditions = found.status.conditions or []
        return any(c.type == "Established" and c.status == "True" for c in conditions)

    eventually(established, 30, "the TrainingJob CRD to become Established")
    yield


def test_namespace_and_configmap_round_trip(kube_api: KubeAPI) -> None:
    core = kubernetes.client.CoreV1Api(kube_api.api_client)
    ensure_namespace(kube_api, "roundtrip")
    core.create_namespaced_config_map(
        "roundtrip", {"metadata": {"name": "settings"}, "data": {"answer": "42"}}
    )
    assert core.read_namespaced_config_map("settings", "roundtrip").data == {"answer": "42"}
    assert kube_api.server.startswith("https://127.0.0.1:")
    version = kubernetes.client.VersionApi(kube_api.api_client).get_code()
    assert (version.major, version.minor) == ("1", "20")


def test_kubectl_lists_namespaces(kube_api: KubeAPI) -> None:
    result = kube_api.kubectl("get", "ns", "-o", "name")
    assert "namespace/default" in result.stdout.split()
    assert "Client Version: v1.20" in kube_api.kubectl("version", "--short").stdout


def test_garbage_collector_removes_dependents(kube_api: KubeAPI) -> None:
    core = kubernetes.client.CoreV1Api(kube_api.api_client)
    ensure_namespace(kube_api, "gc")
    owner = core.create_namespaced_config_map("gc", {"metadata": {"name": "owner"}})
    reference = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "name": "owner",
        "uid": owner.metadata.uid,
    }
    core.create_namespaced_config_map(
        "gc", {"metadata": {"name": "dependent", "ownerReferences": [reference]}}
    )
    core.delete_namespaced_config_map("owner", "gc")

    def dependent_gone() -> bool:
        try:
            core.read_namespaced_config_map("dependent", "gc")
        except ApiException as error:
            return error.status == 404
        return False

    eventually(dependent_gone, 30, "the garbage collector to delete the dependent")


@pytest.mark.usefixtures("crd")
@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.stem)
def test_example_jobs_are_accepted(kube_api: KubeAPI, example: Path) -> None:
    job = yaml.safe_load(example.read_text())
    namespace = job["metadata"]["namespace"]
    ensure_namespace(kube_api, namespace)
    objects = kubernetes.client.CustomObjectsApi(kube_api.api_client)
    created = objects.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, job)
    assert created["spec"]["minReplicas"] == job["spec"]["minReplicas"]


@pytest.mark.usefixtures("crd")
@pytest.mark.parametrize(
    ("change", "field"),
    [
        (lambda job: job["spec"].update(minReplicas=0), "spec.minReplicas"),
        (lambda job: job["spec"].pop("maxReplicas"), "spec.maxReplicas"),
        (lambda job: job["spec"].update(minReplicas="two"), "spec.minReplicas"),
    ],
    ids=["below-minimum", "missing-required", "wrong-type"],
)
def test_schema_violations_are_refused(
    kube_api: KubeAPI, change: Callable[[dict[str, Any]], object], field: str
) -> None:
    job = yaml.safe_load((REPO / "manifests" / "examples" / "resnet50-allreduce.yaml").read_text())
    job["metadata"] = {"name": "broken", "namespace": "schema"}
    change(job)
    ensure_namespace(kube_api, "schema")
    objects = kubernetes.client.CustomObjectsApi(kube_api.api_client)
    with pytest.raises(ApiException) as refused:
        objects.create_namespaced_custom_object(GROUP, VERSION, "schema", PLURAL, job)
    assert refused.value.status == 422
    assert field in str(refused.value.body)


def test_helper_node_shows_its_gpus(kube_api: KubeAPI) -> None:
    node = create_node(kube_api.api_client, "gpu-node-1", gpus=4, cpu="32", memory="256Gi")
    assert node.status.allocatable[GPU] == "4"
    assert node.status.capacity[GPU] == "4"
    assert not node.spec.taints
    ready = [c for c in node.status.conditions if c.type == "Ready"]
    assert [c.status for c in ready] == ["True"]
    shown = kube_api.kubectl(
        "get", "node", "gpu-node-1", "-o", r"jsonpath={.status.allocatable.nvidia\.com/gpu}"
    )
    assert shown.stdout == "4"


def test_own_plane_schedules_then_stops_every_process() -> None:
    """A plane of its own, kube-scheduler included: it binds a pod to the only node; stopping
    it ends the four processes and removes its directory."""
    with running_control_plane(ensure_binaries(), scheduler=True) as api:
        core = kubernetes.client.CoreV1Api(api.api_client)
        create_node(api.api_client, "only-node", gpus=1)
        pod = {
            "metadata": {"name": "sleeper"},
            "spec": {
                "containers": [
                    {"name": "main", "image": "none", "resources": {"limits": {GPU: "1"}}}
                ]
            },
        }
        core.create_namespaced_pod("default", pod)
        eventually(
            lambda: core.read_namespaced_pod("sleeper", "default").spec.node_name == "only-node",
            30,
            "kube-scheduler to bind the pod",
        )
        workdir = api.kubeconfig.parent
        pids = [int(p) for p in _pids_under(workdir)]
        assert len(pids) == 4
    assert not workdir.exists()
    for pid in pids:
        assert not Path(f"/proc/{pid}").exists()


def _pids_under(workdir: Path) -> list[str]:
    """PIDs of the processes whose command line names `workdir` (etcd and the API server)."""
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes()
        except OSError:
            continue
        if str(workdir).encode() in cmdline:
            pids.append(proc.name)
    return pids
