"""End to end on a real API server with the kubelet in miniature: real coordinators and
framework-free workers (``trainer_runtime.plain_worker``) as local processes.

Aspects tested:
- a job runs to Succeeded when its coordinator reports the last epoch committed; its status
  carries progress and measured throughput; its coordinator state is kept in a ConfigMap the
  job owns;
- preemption through the coordinator: a high-priority job arrives in a full pool, the
  low-priority job's victims are drained (they exit 0, no restart is charged), the high job
  runs and succeeds, the low job grows back and succeeds;
- a deleted coordinator is replaced from its saved state and the job still succeeds;
- the controller SIGKILLed at random points during a busy run, several times: every job
  succeeds, no worker is created twice for a slot (pods per job stay within maxReplicas), no
  node is ever over-committed, and nothing is left behind.
"""

from __future__ import annotations

import random
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

NS = "ctrl-e2e"
cluster, controller = controller_fixtures(NS, "e2e", "23000-23999")


def job(name: str, pool: str, **kwargs: Any) -> dict[str, Any]:
    return training_job(name, NS, pool=pool, drain_seconds=10, **kwargs)


def phase(cluster: Cluster, name: str) -> str:
    return str(cluster.job(NS, name).get("status", {}).get("phase", ""))


def test_job_runs_to_success_with_progress_and_saved_state(
    kube_api: KubeAPI, cluster: Cluster, controller: ControllerProcess, kubelet: MiniKubelet
) -> None:
    create_node(kube_api.api_client, "e2e-solo", gpus=2, labels={POOL: "solo"}, kubelet=True)
    cluster.create_job(job("solo", "solo", max_replicas=2, samples=3000))

    def progressing() -> dict[str, Any] | None:
        status = cluster.job(NS, "solo").get("status", {})
        done = status.get("progress", {}).get("samplesDone", 0)
        return status if done > 0 and status.get("throughput") else None

    status = eventually(progressing, 60, "progress and throughput in the status")
    assert status["phase"] in ("Running", "Resizing")
    assert status["throughput"][0]["samplesPerSecond"] > 0
    state = eventually(
        lambda: [c for c in cluster.core.list_namespaced_config_map(NS).items
                 if c.metadata.name == "solo-coordinator-state"],
        30, "the coordinator's state ConfigMap",
    )[0]  # fmt: skip
    assert state.metadata.owner_references[0].name == "solo"
    eventually(lambda: phase(cluster, "solo") == "Succeeded", 90, "Succeeded")
    final = cluster.job(NS, "solo")["status"]
    told = cluster.restarts_told(NS, "solo", kubelet)
    assert final["completionTime"] and final["restarts"] == 0, told
    cluster.told(NS, "solo", "Succeeded")


def test_graceful_preemption_through_the_coordinator(
    kube_api: KubeAPI, cluster: Cluster, controller: ControllerProcess
) -> None:
    for i in range(2):
        create_node(kube_api.api_client, f"e2e-pre-{i}", gpus=2, labels={POOL: "e2e-pre"},
                    kubelet=True)  # fmt: skip
    cluster.create_job(job("low", "e2e-pre", max_replicas=4, priority=10, samples=40000))
    eventually(lambda: len(live_workers(cluster, NS, "low")) == 4, 60, "low at 4 workers")
    started = time.monotonic()
    cluster.create_job(
        job("high", "e2e-pre", min_replicas=2, max_replicas=2, priority=100, samples=600)
    )

    def high_running() -> bool:
        pods = live_workers(cluster, NS, "high")
        return len(pods) == 2 and all(p.status.phase == "Running" for p in pods)

    eventually(high_running, 60, "the high-priority job's workers running")
    admitted_s = time.monotonic() - started
    preempted = [e for e in cluster.told(NS, "low", "Preempted") if e.reason == "Preempted"]
    assert "victims: low-worker-" in preempted[0].message
    eventually(lambda: phase(cluster, "high") == "Succeeded", 90, "high Succeeded")
    eventually(lambda: len(live_workers(cluster, NS, "low")) == 4, 60, "low grown back")
    eventually(lambda: phase(cluster, "low") == "Succeeded", 120, "low Succeeded")
    low = cluster.job(NS, "low")["status"]
    assert low["restarts"] == 0, "drained victims are not failures"
    print(f"high-priority job admitted in {admitted_s:.2f} s")


def test_deleted_coordinator_continues_from_its_saved_state(
    kube_api: KubeAPI, cluster: Cluster, controller: ControllerProcess
) -> None:
    create_node(kube_api.api_client, "e2e-co", gpus=1, labels={POOL: "co"}, kubelet=True)
    cluster.create_job(job("phoenix", "co", samples=3000))

    def half() -> int:
        status = cluster.job(NS, "phoenix").get("status", {})
        saved = [c for c in cluster.core.list_namespaced_config_map(NS).items
                 if c.metadata.name == "phoenix-coordinator-state"]  # fmt: skip
        done = int(status.get("progress", {}).get("samplesDone", 0))
        return done if done > 500 and saved else 0

    before = eventually(half, 90, "progress and a saved state")
    old = cluster.pods(NS, "phoenix", "coordinator")[0]
    cluster.core.delete_namespaced_pod(old.metadata.name, NS, grace_period_seconds=0)

    def replaced() -> bool:
        pods = cluster.pods(NS, "phoenix", "coordinator")
        return any(p.metadata.uid != old.metadata.uid and p.status.phase == "Running"
                   for p in pods)  # fmt: skip

    eventually(replaced, 60, "a new coordinator")
    eventually(lambda: phase(cluster, "phoenix") == "Succeeded", 120, "Succeeded")
    status = cluster.job(NS, "phoenix")["status"]
    assert status["progress"]["samplesDone"] >= before


def test_controller_killed_at_random_points_reconverges(
    kube_api: KubeAPI, cluster: Cluster, controller: ControllerProcess
) -> None:
    rng = random.Random(5)
    for i in range(3):
        create_node(kube_api.api_client, f"e2e-busy-{i}", gpus=2, labels={POOL: "busy"},
                    kubelet=True)  # fmt: skip
    names = [f"busy-{i}" for i in range(4)]
    for i, name in enumerate(names):
        cluster.create_job(
            job(name, "busy", max_replicas=3, priority=10 * i, samples=4000 + 1000 * i)
        )
    overcommitted: list[str] = []
    duplicates: list[str] = []
    watching = threading.Event()

    def watch() -> None:
        while not watching.is_set():
            used: dict[str, int] = {}
            for pod in cluster.core.list_namespaced_pod(
                NS, label_selector="edl.dev/role=worker"
            ).items:
                job_name = pod.metadata.labels["edl.dev/job"]
                if not job_name.startswith("busy-") or pod.status.phase in ("Succeeded", "Failed"):
                    continue
                used[pod.spec.node_name] = used.get(pod.spec.node_name, 0) + 1
            overcommitted.extend(f"{n}: {u}" for n, u in used.items() if u > 2)
            for name in names:
                live = live_workers(cluster, NS, name)
                if len(live) > 3:
                    duplicates.append(f"{name}: {len(live)}")
            time.sleep(0.2)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        for _ in range(4):
            time.sleep(rng.uniform(0.5, 3.0))
            controller.kill()
            time.sleep(rng.uniform(0.0, 1.0))
            controller.start()
        restarted = time.monotonic()
        eventually(controller.healthy, 30, "the restarted controller")
        for name in names:
            eventually(lambda n=name: phase(cluster, n) == "Succeeded", 180, f"{name} Succeeded")
        print(f"all jobs succeeded {time.monotonic() - restarted:.1f} s after the last restart")
    finally:
        watching.set()
        watcher.join(5)
    assert not overcommitted, overcommitted[:5]
    assert not duplicates, duplicates[:5]

    def nothing_left() -> bool:
        return not [p for n in names for p in cluster.pods(NS, n)
                    if p.status.phase not in ("Succeeded", "Failed")]  # fmt: skip

    eventually(nothing_left, 30, "no running pods of finished jobs")
