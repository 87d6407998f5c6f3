"""Node objects for a cluster with no kubelets: what a kubelet would register.

The planner counts `status.allocatable` (GPUs as `nvidia.com/gpu`) of Ready, schedulable nodes.
On creation the API server's TaintNodesByCondition admission adds the
`node.kubernetes.io/not-ready` taint, which a kubelet's first Ready status would clear; with no
kubelet, `create_node` sets the taints itself. The node-lifecycle controller is off in the
test control plane (`testenv.CONTROLLERS`), so nothing marks these nodes unreachable later.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import kubernetes

GPU = "nvidia.com/gpu"


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
) -> kubernetes.client.V1Node:
    """Creates the node, then replaces the taints admission added by `taints` (none by
    default), as a kubelet reporting Ready would; returns the node as stored."""
    core = kubernetes.client.CoreV1Api(api_client)
    manifest = node_manifest(name, gpus=gpus, cpu=cpu, memory=memory, pods=pods, labels=labels)
    core.create_node(manifest)
    # A list without a merge key: the strategic merge patch replaces it whole.
    return core.patch_node(name, {"spec": {"taints": taints or []}})
