"""Node objects for a cluster with no kubelets: what a kubelet would register.

The planner counts `status.allocatable` (GPUs as `nvidia.com/gpu`) of Ready, schedulable nodes.
The kubelet in miniature (`kubelet.py`) keeps the nodes it serves alive with the two
heartbeats below: the node's Lease in kube-node-lease, and its Ready condition.
On creation the API server's TaintNodesByCondition admission adds the
`node.kubernetes.io/not-ready` taint, which a kubelet's first Ready status would clear; with no
kubelet, `create_node` sets the taints itself. The node-lifecycle controller is off in the
test control plane (`testenv.CONTROLLERS`), so nothing marks these nodes unreachable later.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import kubernetes
from kubernetes.client import ApiException

GPU = "nvidia.com/gpu"
NODE_LEASE_NAMESPACE = "kube-node-lease"
#: The label of the nodes that the session's kubelet in miniature (the `kubelet` fixture)
#: serves: `create_node(..., kubelet=True)`. Nodes without it are left to tests that play
#: the kubelet by hand, so the two never act on the same pod.
KUBELET_LABELS = {"edl.test/kubelet": "miniature"}
#: Taints that a kubelet's Ready status clears (admission and the node controller add them).
CLEARED_TAINTS = frozenset({"node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"})


def node_manifest(
    name: str,
    *,
    gpus: int = 8,
    cpu: str = "64",
    memory: str = "512Gi",
    pods: int = 110,
    labels: dict[str, str] | None = None,
) -> dict[str, Any]:
    """A Ready node with `gpus` GPUs; allocatable equals capacity."""
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    capacity = {"cpu": cpu, "memory": memory, "pods": str(pods), GPU: str(gpus)}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux"}
            | (labels or {}),
        },
        "spec": {},
        "status": {
            "capacity": capacity,
            "allocatable": dict(capacity),
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "KubeletReady",
                    "message": "played by the tests",
                    "lastHeartbeatTime": now,
                    "lastTransitionTime": now,
                }
            ],
            "addresses": [
                {"type": "InternalIP", "address": "127.0.0.1"},
                {"type": "Hostname", "address": name},
            ],
        },
    }


def create_node(
    api_client: kubernetes.client.ApiClient,
    name: str,
    *,
    gpus: int = 8,
    cpu: str = "64",
    memory: str = "512Gi",
    pods: int = 110,
    labels: dict[str, str] | None = None,
    taints: list[dict[str, str]] | None = None,
    kubelet: bool = False,
) -> kubernetes.client.V1Node:
    """Creates the node, then replaces the taints admission added by `taints` (none by
    default), as a kubelet reporting Ready would; returns the node as stored. With
    `kubelet=True` the node carries `KUBELET_LABELS`, so the `kubelet` fixture runs its pods."""
    core = kubernetes.client.CoreV1Api(api_client)
    labels = (labels or {}) | (KUBELET_LABELS if kubelet else {})
    manifest = node_manifest(name, gpus=gpus, cpu=cpu, memory=memory, pods=pods, labels=labels)
    core.create_node(manifest)
    # A list without a merge key: the strategic merge patch replaces it whole.
    return core.patch_node(name, {"spec": {"taints": taints or []}})


def renew_node_lease(
    coordination: kubernetes.client.CoordinationV1Api, name: str, uid: str, duration_s: int
) -> None:
    """Renews the node's Lease in kube-node-lease, creating it (owned by the node, so it goes
    with it) when it does not exist yet, as a kubelet's heartbeat does."""
    spec = {
        "holderIdentity": name,
        "leaseDurationSeconds": duration_s,
        "renewTime": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
    }
    try:
        coordination.patch_namespaced_lease(
            name, NODE_LEASE_NAMESPACE, {"spec": spec}, _content_type="application/merge-patch+json"
        )
    except ApiException as error:
        if error.status != 404:
            raise
        owner = {"apiVersion": "v1", "kind": "Node", "name": name, "uid": uid}
        coordination.create_namespaced_lease(
            NODE_LEASE_NAMESPACE,
            {"metadata": {"name": name, "ownerReferences": [owner]}, "spec": spec},
        )


def report_node_ready(core: kubernetes.client.CoreV1Api, name: str) -> None:
    """Posts the node's Ready condition with a fresh heartbeat (keeping its transition time
    while it stays Ready) and removes the taints that Ready clears."""
    stored = core.read_node(name)
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    ready = [c for c in stored.status.conditions or [] if c.type == "Ready"]
    since = ready[0].last_transition_time if ready and ready[0].status == "True" else None
    condition = {
        "type": "Ready",
        "status": "True",
        "reason": "KubeletReady",
        "message": "the kubelet in miniature is posting ready status",
        "lastHeartbeatTime": now,
        "lastTransitionTime": since.strftime("%Y-%m-%dT%H:%M:%SZ") if since else now,
    }
    # A strategic merge patch: conditions merge by type, so the other conditions stay.
    core.patch_node_status(name, {"status": {"conditions": [condition]}})
    taints = stored.spec.taints or []
    kept = [t for t in taints if t.key not in CLEARED_TAINTS]
    if len(kept) != len(taints):
        # A list without a merge key: the strategic merge patch replaces it whole.
        serialize = core.api_client.sanitize_for_serialization
        core.patch_node(name, {"spec": {"taints": [serialize(t) for t in kept]}})
