"""The planner's reservations outlive the leader, on a real API server; the test plays the
kubelet (``settle``), no processes run.

Aspect tested: a high-priority job is admitted by draining two workers of a low one; the
leader is SIGKILLed after the shrink and before the high job's workers exist; a new
controller (another identity, so it must win the Lease) reads the stored hold before its
first plan, the high job starts on the freed GPUs once the victims are gone, and the stored
holds are then empty.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from kubernetes.client import ApiException

from .controller_harness import (
    POOL,
    Cluster,
    ControllerProcess,
    cluster_in,
    eventually,
    live_workers,
    running_controller,
    settle,
    training_job,
)
from .nodes import create_node
from .testenv import KubeAPI

NS = "ctrl-hold"
STORE = "edl-controller-reservations"


def job(name: str, **kwargs: Any) -> dict[str, Any]:
    # No coordinator runs here: victims leave at the drain deadline, which keeps the window
    # between the shrink and the high job's start open across the restart.
    return training_job(name, NS, pool="hold", drain_seconds=20, **kwargs)


def stored(cluster: Cluster) -> list[dict[str, Any]] | None:
    try:
        cm = cluster.core.read_namespaced_config_map(STORE, NS)
    except ApiException as error:
        if error.status == 404:
            return None
        raise
    found: list[dict[str, Any]] = json.loads((cm.data or {}).get("reservations.json", "[]"))
    return found


def cycles(proc: ControllerProcess) -> float:
    for line in proc.metrics().splitlines():
        if line.startswith("edl_planner_cycle_seconds_count"):
            return float(line.split()[-1])
    return 0.0


def test_reservations_survive_a_leader_restart(kube_api: KubeAPI, tmp_path: Path) -> None:
    cluster = cluster_in(kube_api, NS)
    create_node(kube_api.api_client, "hold-0", gpus=4, labels={POOL: "hold"})

    def leaving() -> list[Any]:
        """Victims the controller saw still Pending are deleted at once, the others drain;
        no kubelet removes either while the test does not settle."""
        return [
            p
            for p in cluster.pods(NS, "low", "worker")
            if p.metadata.deletion_timestamp
            or (p.metadata.annotations or {}).get("edl.dev/draining") == "true"
        ]

    # The planner keeps a hold only until a plan places its job, which the next cycle does
    # (the pods wait for the victims to go): cycles 3 s apart leave the test time to kill
    # the first leader while its last plan's hold is what it stored.
    slow = ("--min-period", "3", "--max-period", "6")
    first = running_controller(kube_api, tmp_path, "hold-a", NS, ports="24500-24599", extra=slow)
    with first as proc:
        try:
            eventually(proc.healthy, 30, "the first controller's /healthz")
            cluster.create_job(job("low", max_replicas=4, priority=10))

            def filled() -> bool:
                settle(cluster, NS)
                return len(live_workers(cluster, NS, "low")) == 4

            eventually(filled, 30, "the low-priority job to fill the node")
            # A new job is planned at once (not after --min-period): let the controller see
            # the low job's workers Running first, so that the shrink drains them.
            seen = cycles(proc)
            eventually(lambda: cycles(proc) >= seen + 2, 30, "two cycles after the fill")
            cluster.create_job(job("high", min_replicas=2, max_replicas=2, priority=100))

            def held() -> bool:
                return any(
                    r["job"] == f"{NS}/high" and r["node"] == "hold-0" and r["count"] == 2
                    for r in stored(cluster) or []
                )

            # The act writes the hold and marks each victim in writes of their own, in any
            # order (each waits only for what it depends on): wait for all of them.
            eventually(held, 30, "the reservation for the high job stored")
            eventually(lambda: len(leaving()) == 2, 30, "both victims marked")
            proc.kill()
        finally:
            print(proc.log_tail())
    assert len(leaving()) == 2, "the leader was to be killed after the shrink"
    assert cluster.pods(NS, "high", "worker") == [], "and before the high job's start"
    with running_controller(kube_api, tmp_path, "hold-b", NS, ports="24600-24699") as proc:
        try:
            eventually(proc.healthy, 30, "the second controller's /healthz")
            eventually(lambda: cycles(proc) >= 3, 30, "the new leader's first plans")
            # It read the hold before its first plan (the planner keeps a hold only while
            # its job has not been placed: here the first plan places the high job on it).
            assert "leading with 1 stored reservations" in proc.log_tail(400)

            def high_running() -> bool:
                settle(cluster, NS)
                return len(live_workers(cluster, NS, "high")) == 2

            eventually(high_running, 60, "the high job to start once the victims left")
            assert {p.spec.node_name for p in live_workers(cluster, NS, "high")} == {"hold-0"}
            eventually(lambda: stored(cluster) == [], 30, "the hold released")
            assert len(live_workers(cluster, NS, "low")) == 2
        finally:
            print(proc.log_tail())
    cluster.delete_job(NS, "high")
    cluster.delete_job(NS, "low")
