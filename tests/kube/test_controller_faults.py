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
from collections.abc import Iterator
from typing import Any

import pytest

from .controller_harness import (
    Cluster,
    ControllerProcess,
    cluster_in,
    eventually,
    healthy_controller,
    live_workers,
    training_job,
)
from .kubelet import MiniKubelet
from .nodes import create_node
from .testenv import KubeAPI

NS = "ctrl-faults"
POOL = "edl.test/pool"


@pytest.fixture(scope="module")
def cluster(kube_api: KubeAPI, kubelet: MiniKubelet) -> Cluster:
    return cluster_in(kube_api, NS)


@pytest.fixture(scope="module")
def controller(
    kube_api: KubeAPI, cluster: Cluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ControllerProcess]:
    workdir = tmp_path_factory.mktemp("ctrl-faults")
    extra = ("--inject-api-faults", "0.2", "--watch-timeout", "2")
    with healthy_controller(
        kube_api, workdir, "faulty", NS, ports="24000-24999", extra=extra, tail=40
    ) as proc:
        yield proc


def test_converges_under_api_faults_and_dropped_watches(
    kube_api: KubeAPI, cluster: Cluster, controller: ControllerProcess, kubelet: MiniKubelet
) -> None:
    for i in range(2):
        create_node(kube_api.api_client, f"flt-{i}", gpus=2, labels={POOL: "faults"},
                    kubelet=True)  # fmt: skip
    names = [f"flaky-{i}" for i in range(3)]
    for i, name in enumerate(names):
        manifest = training_job(name, NS, max_replicas=2, priority=10 * i, samples=2000)
        manifest["spec"]["template"]["spec"]["nodeSelector"] = {POOL: "faults"}
        cluster.create_job(manifest)
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
