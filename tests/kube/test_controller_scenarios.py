"""Scheduling scenarios through the operator on a real API server; the test plays the
kubelet (``settle``: bound pods become Running, deleted pods go); workers run no process,
coordinators run for real (the controller drains victims through them).

Aspects tested:
- a low-priority elastic job fills the pool; a high-priority job arrives; the low one shrinks
  to what is needed through drains (victims annotated and named in a Preempted Event,
  deleted at the drain deadline) and the high one starts; when the high one is deleted, the
  low one grows back;
- GPUs used by pods of other workloads are never handed out;
- the workers of a deleted node are replaced on the others; those of a cordoned node drain
  and are replaced too;
- spec.suspend drains every worker (phase Suspended, Event Suspended); clearing it starts the
  job again (Event Resumed, phase Running or Resizing: played workers never join).
"""

from __future__ import annotations

from typing import Any

import kubernetes

from .controller_harness import (
    POOL,
    RUNNING_PHASES,
    Cluster,
    ControllerProcess,
    controller_fixtures,
    eventually,
    live_workers,
    settle,
    training_job,
)
from .nodes import create_node
from .testenv import KubeAPI

NS = "ctrl-scn"
cluster, controller = controller_fixtures(NS, "scn", "22000-22999", with_kubelet=False)


def job(name: str, pool: str, **kwargs: Any) -> dict[str, Any]:
    return training_job(name, NS, pool=pool, drain_seconds=2, **kwargs)


def test_high_priority_job_preempts_gracefully_and_low_grows_back(
    kube_api: KubeAPI, cluster: Cluster, controller: ControllerProcess
) -> None:
    for i in range(2):
        create_node(kube_api.api_client, f"scn-{i}", gpus=2, labels={POOL: "pre"})
    cluster.create_job(job("low", "pre", max_replicas=4, priority=10))

    def filled() -> bool:
        # Running, and its coordinator answering (its progress in the status): workers are
        # created beside a coordinator still starting, and a victim not yet Running when the
        # high job comes is deleted at once instead of drained.
        settle(cluster, NS)
        workers = live_workers(cluster, NS, "low")
        running = len(workers) == 4 and all(p.status.phase == "Running" for p in workers)
        return running and "progress" in cluster.job(NS, "low").get("status", {})

    eventually(filled, 30, "the low-priority job to fill the pool, its coordinator answering")
    cluster.create_job(job("high", "pre", min_replicas=2, max_replicas=2, priority=100))

    def drained() -> list[Any]:
        return [
            p for p in cluster.pods(NS, "low", "worker")
            if (p.metadata.annotations or {}).get("edl.dev/draining") == "true"
        ]  # fmt: skip

    found = eventually(lambda: len(drained()) >= 2 and drained(), 30, "two victims drained")
    victims = {p.metadata.name for p in found}
    assert len(victims) == 2

    def high_running() -> bool:
        settle(cluster, NS)
        return len(live_workers(cluster, NS, "high")) == 2

    eventually(high_running, 30, "the high-priority job to start")
    assert len(live_workers(cluster, NS, "low")) == 2
    preempted = [e for e in cluster.told(NS, "low", "Preempted") if e.reason == "Preempted"]
    assert all(v in preempted[0].message for v in victims)
    assert "ns" not in preempted[0].message or "high" in preempted[0].message
    cluster.delete_job(NS, "high")

    def grown_back() -> bool:
        settle(cluster, NS)
        return len(live_workers(cluster, NS, "low")) == 4

    eventually(grown_back, 60, "the low-priority job to grow back")
    cluster.told(NS, "low", "ScaledUp")
    cluster.delete_job(NS, "low")


def test_gpus_of_other_workloads_are_respected(
    kube_api: KubeAPI, cluster: Cluster, controller: ControllerProcess
) -> None:
    create_node(kube_api.api_client, "scn-other", gpus=4, labels={POOL: "other"})
    cluster.core.create_namespaced_pod(
        NS,
        {
            "metadata": {"name": "someone-else"},
            "spec": {
                "nodeName": "scn-other",
                "containers": [
                    {"name": "c", "image": "x",
                     "resources": {"limits": {"nvidia.com/gpu": "3"}}}
                ],
            },
        },
    )  # fmt: skip
    cluster.create_job(job("greedy", "other", max_replicas=4))

    def settled() -> bool:
        settle(cluster, NS)
        status = cluster.job(NS, "greedy").get("status", {})
        return status.get("phase") in RUNNING_PHASES

    eventually(settled, 30, "the job to run")
    assert len(live_workers(cluster, NS, "greedy")) == 1
    cluster.delete_job(NS, "greedy")


def test_workers_of_deleted_and_cordoned_nodes_are_replaced(
    kube_api: KubeAPI, cluster: Cluster, controller: ControllerProcess
) -> None:
    for i in range(3):
        create_node(kube_api.api_client, f"mv-{i}", gpus=1, labels={POOL: "move"})
    cluster.create_job(job("mover", "move", min_replicas=2, max_replicas=2))

    def running() -> list[Any]:
        settle(cluster, NS)
        workers = live_workers(cluster, NS, "mover")
        return workers if len(workers) == 2 else []

    first = eventually(running, 30, "two workers")
    gone = first[0].spec.node_name
    core = kubernetes.client.CoreV1Api(kube_api.api_client)
    core.delete_node(gone)

    def moved_off(node: str) -> list[Any]:
        workers = running()
        return workers if workers and all(w.spec.node_name != node for w in workers) else []

    second = eventually(lambda: moved_off(gone), 30, "the deleted node's worker replaced")
    cordoned = second[0].spec.node_name
    create_node(kube_api.api_client, "mv-spare", gpus=1, labels={POOL: "move"})
    core.patch_node(cordoned, {"spec": {"unschedulable": True}})
    eventually(lambda: moved_off(cordoned), 30, "the cordoned node's worker replaced")
    cluster.delete_job(NS, "mover")


def test_suspend_and_resume(
    kube_api: KubeAPI, cluster: Cluster, controller: ControllerProcess
) -> None:
    create_node(kube_api.api_client, "scn-sus", gpus=2, labels={POOL: "sus"})
    cluster.create_job(job("nap", "sus", max_replicas=2))

    def workers(n: int) -> bool:
        settle(cluster, NS)
        return len(live_workers(cluster, NS, "nap")) == n

    eventually(lambda: workers(2), 30, "two workers")
    cluster.custom.patch_namespaced_custom_object(
        "edl.dev", "v1alpha1", NS, "trainingjobs", "nap", {"spec": {"suspend": True}}
    )

    def suspended() -> bool:
        settle(cluster, NS)
        return workers(0) and cluster.job(NS, "nap")["status"]["phase"] == "Suspended"

    eventually(suspended, 30, "phase Suspended with no workers")
    cluster.custom.patch_namespaced_custom_object(
        "edl.dev", "v1alpha1", NS, "trainingjobs", "nap", {"spec": {"suspend": False}}
    )

    def resumed() -> bool:
        settle(cluster, NS)
        return workers(2) and cluster.job(NS, "nap")["status"]["phase"] in RUNNING_PHASES

    eventually(resumed, 30, "phase Running (or Resizing) again")
    cluster.told(NS, "nap", "Suspended", "Resumed")
    cluster.delete_job(NS, "nap")
