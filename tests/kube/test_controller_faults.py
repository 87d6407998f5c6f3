"""The operator under API faults, with the kubelet in miniature running real coordinators and
framework-free workers.

Aspects tested:
- with a fifth of its API requests failing (409 conflicts, 429 throttles, 503s, and writes
  whose answer is lost after the server applied them) and every watch ended by the server
  every 2 s, a busy run converges: every job succeeds, no job ever has more live workers than
  its maxReplicas (no duplicate), no node is over-committed, nothing is left running.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from .controller_harness import (
    POOL,
    Cluster,
    ControllerProcess,
    controller_fixtures,
    eventually,
    live_workers,
    training_job,
)
from .kubelet import MiniKubelet
from .nodes import create_node
from .testenv import KubeAPI

NS = "ctrl-faults"
cluster, controller = controller_fixtures(
    NS, "faulty", "24000-24999", extra=("--inject-api-faults", "0.2", "--watch-timeout", "2"),
    tail=40,
)  # fmt: skip


def test_converges_under_api_faults_and_dropped_watches(
    kube_api: KubeAPI, cluster: Cluster, controller: ControllerProcess, kubelet: MiniKubelet
) -> None:
    for i in range(2):
        create_node(kube_api.api_client, f"flt-{i}", gpus=2, labels={POOL: "faults"},
                    kubelet=True)  # fmt: skip
    names = [f"flaky-{i}" for i in range(3)]
    for i, name in enumerate(names):
        cluster.create_job(
            training_job(name, NS, max_replicas=2, priority=10 * i, samples=2000, pool="faults")
        )
    problems: list[str] = []
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            used: dict[str, int] = {}
            for pod in cluster.core.list_namespaced_pod(
                NS, label_selector="edl.dev/role=worker"
            ).items:
                if pod.status.phase not in ("Succeeded", "Failed"):
                    used[pod.spec.node_name] = used.get(pod.spec.node_name, 0) + 1
            problems.extend(f"node {n} holds {u}" for n, u in used.items() if u > 2)
            for name in names:
                running = [  # a worker that has exited (its pod not yet deleted) is no worker
                    p
                    for p in live_workers(cluster, NS, name)
                    if p.status.phase not in ("Succeeded", "Failed")
                ]
                if len(running) > 2:
                    problems.append(f"{name} has more than maxReplicas live workers")
            time.sleep(0.2)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        for name in names:
            eventually(
                lambda n=name: cluster.job(NS, n).get("status", {}).get("phase") == "Succeeded",
                180,
                f"{name} Succeeded",
            )
    finally:
        done.set()
        watcher.join(5)
    assert not problems, problems[:5]
    statuses: list[dict[str, Any]] = [cluster.job(NS, n)["status"] for n in names]
    told = [t for n in names for t in cluster.restarts_told(NS, n, kubelet)]
    assert all(s["restarts"] == 0 for s in statuses), told
    assert "injected" in controller.log_tail(10_000)
