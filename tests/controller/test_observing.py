"""Kubernetes objects -> Snapshot.

Aspects:
- node allocatable, labels, taints; cordoned and not-Ready nodes are unschedulable;
- pods of other workloads take their requests (containers summed, init containers as a
  maximum, overhead added) from their node; finished pods take nothing;
- our replica pods become the job's replicas, oldest first; terminating or draining ones
  still occupy their node but do not count; replicas on a deleted node are left out;
- priorities resolve from spec.priority, else the named PriorityClass; an unknown class or
  an invalid spec or coordinator arguments the coordinator refuses leave the job out with
  a reason that names the field;
- the resulting snapshot plans: GPUs used by other pods are never handed out;
- a pod template that widens its pods (privileged, hostPath, host namespaces, added
  capabilities, a service account) makes the job invalid, naming the field and the
  controller option that allows it, unless the admin allowed it.
"""

from __future__ import annotations

from typing import Any

import pytest

from edl_scheduler.controller.observing import observe, pod_requests
from edl_scheduler.controller.vetting import PodField
from edl_scheduler.core import Resources, plan, preset


def k8s_node(
    name: str,
    gpus: int = 8,
    *,
    ready: bool = True,
    cordoned: bool = False,
    labels: dict[str, str] | None = None,
    taints: list[dict[str, str]] | None = None,
) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": labels or {}},
        "spec": {"unschedulable": cordoned, "taints": taints or []},
        "status": {
            "allocatable": {"cpu": "32", "memory": "256Gi", "nvidia.com/gpu": str(gpus)},
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


def k8s_pod(
    name: str,
    node: str,
    *,
    gpus: int = 0,
    cpu: str = "1",
    job: str | None = None,
    role: str = "worker",
    phase: str = "Running",
    created: str = "2026-01-01T00:00:00Z",
    terminating: bool = False,
    draining: bool = False,
) -> dict[str, Any]:
    labels = {"edl.dev/job": job, "edl.dev/role": role} if job else {"app": "other"}
    meta: dict[str, Any] = {
        "name": name,
        "namespace": "ns",
        "labels": labels,
        "creationTimestamp": created,
        "annotations": {"edl.dev/draining": "true"} if draining else {},
    }
    if terminating:
        meta["deletionTimestamp"] = "2026-01-01T01:00:00Z"
    return {
        "metadata": meta,
        "spec": {
            "nodeName": node,
            "containers": [
                {"name": "c", "resources": {"requests": {"cpu": cpu, "nvidia.com/gpu": gpus}}}
            ],
        },
        "status": {"phase": phase},
    }


def k8s_job(name: str, lo: int = 1, hi: int = 4, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "edl.dev/v1alpha1",
        "kind": "TrainingJob",
        "metadata": {
            "name": name,
            "namespace": "ns",
            "creationTimestamp": "2026-01-01T00:00:00Z",
            "annotations": {"edl.dev/coordinator-args": "--samples 1000"},
        },
        "spec": {
            "minReplicas": lo,
            "maxReplicas": hi,
            "resources": {"nvidia.com/gpu": 1, "cpu": "1"},
            "template": {"spec": {"containers": [{"name": "t", "image": "img"}]}},
            **spec,
        },
    }


def test_pod_requests_follow_kubernetes_rules() -> None:
    pod = k8s_pod("p", "n0", gpus=1, cpu="500m")
    pod["spec"]["containers"].append({"name": "side", "resources": {"requests": {"cpu": "250m"}}})
    pod["spec"]["initContainers"] = [{"name": "i", "resources": {"requests": {"cpu": "2"}}}]
    pod["spec"]["overhead"] = {"cpu": "100m"}
    assert pod_requests(pod) == Resources(1, 2100, 0)


def test_nodes_other_pods_and_our_replicas() -> None:
    obs = observe(
        nodes=[
            k8s_node("n0", labels={"zone": "a"}),
            k8s_node("n1", cordoned=True),
            k8s_node("n2", ready=False, taints=[{"key": "x", "effect": "NoSchedule"}]),
        ],
        pods=[
            k8s_pod("other", "n0", gpus=3, cpu="2"),
            k8s_pod("done", "n0", gpus=4, phase="Succeeded"),
            k8s_pod("j-w1", "n0", gpus=1, job="j", created="2026-01-01T00:00:05Z"),
            k8s_pod("j-w0", "n0", gpus=1, job="j"),
            k8s_pod("j-w2", "n0", gpus=1, job="j", terminating=True),
            k8s_pod("j-w3", "n0", gpus=1, job="j", draining=True),
            k8s_pod("j-w9", "gone", gpus=1, job="j"),
        ],
        training_jobs=[k8s_job("j")],
        priority_classes={},
    )
    n0, n1, n2 = obs.snapshot.nodes
    assert n0.allocatable == Resources(8, 32_000, 256 * 2**30)
    assert n0.used_by_others == Resources(3, 2000, 0)
    assert n0.labels == (("zone", "a"),) and n0.schedulable
    assert not n1.schedulable and not n2.schedulable and n2.taints[0].key == "x"
    (job,) = obs.snapshot.jobs
    assert job.name == "ns/j"
    assert [r.name for r in job.replicas] == ["j-w0", "j-w2", "j-w3", "j-w1"]
    assert [r.name for r in job.replicas if not r.draining] == ["j-w0", "j-w1"]


def test_priorities_and_rejected_jobs() -> None:
    lots = k8s_job("lots")
    lots["metadata"]["annotations"]["edl.dev/coordinator-args"] = "--samples lots"
    obs = observe(
        nodes=[k8s_node("n0")],
        pods=[],
        training_jobs=[
            k8s_job("plain"),
            k8s_job("direct", priority=7),
            k8s_job("classy", priorityClassName="high"),
            k8s_job("unknown-class", priorityClassName="nope"),
            k8s_job("bad", lo=4, hi=2),
            lots,
        ],
        priority_classes={"high": 1000},
    )
    got = {j.name: j.priority for j in obs.snapshot.jobs}
    assert got == {"ns/plain": 0, "ns/direct": 7, "ns/classy": 1000}
    assert "spec.priorityClassName" in obs.rejected["ns/unknown-class"]
    assert "spec.maxReplicas" in obs.rejected["ns/bad"]
    assert "'lots' is not a whole number of at least 1" in obs.rejected["ns/lots"]


def test_the_snapshot_plans_around_other_workloads() -> None:
    obs = observe(
        nodes=[k8s_node("n0", gpus=4), k8s_node("n1", gpus=4)],
        pods=[k8s_pod("other", "n0", gpus=4)],
        training_jobs=[k8s_job("j", lo=1, hi=8)],
        priority_classes={},
    )
    p = plan(obs.snapshot, preset("edl"), 0.0)
    assert p.decision("ns/j").workers.add_nodes == ("n1",) * 4


@pytest.mark.parametrize(
    ("pod_spec", "field", "path"),
    [
        ({"hostNetwork": True}, PodField.HOST_NETWORK, "hostNetwork"),
        ({"hostPID": True}, PodField.HOST_PID, "hostPID"),
        ({"hostIPC": True}, PodField.HOST_IPC, "hostIPC"),
        ({"serviceAccountName": "admin"}, PodField.SERVICE_ACCOUNT, "serviceAccountName"),
        ({"volumes": [{"name": "n", "hostPath": {"path": "/"}}]}, PodField.HOST_PATH,
         "volumes[0].hostPath"),
        ({"containers": [{"name": "t", "image": "i", "securityContext": {"privileged": True}}]},
         PodField.PRIVILEGED, "containers[0].securityContext.privileged"),
        ({"initContainers": [{"name": "i", "image": "i",
                              "securityContext": {"capabilities": {"add": ["SYS_ADMIN"]}}}]},
         PodField.CAPABILITIES, "initContainers[0].securityContext.capabilities.add"),
    ],
)  # fmt: skip
def test_a_template_that_widens_its_pods_is_refused_unless_allowed(
    pod_spec: dict[str, Any], field: PodField, path: str
) -> None:
    job = k8s_job("wide")
    job["spec"]["template"]["spec"].update(pod_spec)
    refused = observe([k8s_node("n0")], [], [job], {})
    assert not refused.snapshot.jobs
    reason = refused.rejected["ns/wide"]
    assert f"spec.template.spec.{path}" in reason and f"--allow-pod-field {field.value}" in reason
    allowed = observe([k8s_node("n0")], [], [job], {}, allowed=frozenset({field}))
    assert [j.name for j in allowed.snapshot.jobs] == ["ns/wide"]
