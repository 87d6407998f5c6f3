"""The operator against a real API server, with the tests playing the kubelet (``settle``:
workers run no process; coordinators run for real: the controller asks them for progress,
drains and the planned size).

Aspects tested:
- a TrainingJob gets its coordinator pod, Service and NetworkPolicy, and worker pods bound
  (by spec.nodeName) to the planned nodes, each with the Secret of its own credential, with
  owner references, labels, the job's priority class and the runtime's environment
  contract, created with the coordinator; the API server accepts the coordinator's health
  probes as the controller shapes them; the status subresource shows the phase, replicas
  and allocation; an Admitted Event is posted;
- a worker the kubelet refused at admission is replaced without charging the restart
  budget; a failed worker is replaced and charged once its coordinator has answered; past
  the budget the job Fails;
- a job whose spec makes no sense (minReplicas > maxReplicas) stays Pending with Valid=False
  and a Warning Event; a job asking more GPUs per worker than any node has waits with a reason;
  the controller keeps running;
- deleting a job removes everything it owns (garbage collection through owner references),
  its NetworkPolicy included, and the controller deletes its pods itself once a live read
  says the job is gone (one that no owner reference ties to it too);
- /metrics and /healthz answer; two controllers: exactly one acts (holds the Lease).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes
import pytest

from .controller_harness import (
    POOL,
    RUNNING_PHASES,
    Cluster,
    ControllerProcess,
    cluster_in,
    ensure_namespace,
    eventually,
    healthy_controller,
    played_coordinators,
    running_controller,
    settle,
    training_job,
)
from .nodes import create_node
from .testenv import KubeAPI

NS = "ctrl-act"


@pytest.fixture(scope="module")
def cluster(kube_api: KubeAPI) -> Cluster:
    cluster = cluster_in(kube_api, NS)
    for i in range(2):
        create_node(kube_api.api_client, f"act-{i}", gpus=4, labels={POOL: "act"})
    kubernetes.client.SchedulingV1Api(kube_api.api_client).create_priority_class(
        {"metadata": {"name": "act-high"}, "value": 1000}
    )
    return cluster


@pytest.fixture(scope="module")
def controller(
    kube_api: KubeAPI, cluster: Cluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ControllerProcess]:
    workdir = tmp_path_factory.mktemp("ctrl-act")
    with healthy_controller(kube_api, workdir, lease_namespace=NS) as proc:
        yield proc


def pooled(name: str, **kwargs: Any) -> dict[str, Any]:
    return training_job(name, NS, pool="act", **kwargs)


def workers_of(cluster: Cluster, job: str, count: int) -> list[Any]:
    """The job's worker pods once there are ``count``; the test plays the kubelet meanwhile
    (its coordinator runs for real; workers are created with it)."""
    settle(cluster, NS)
    found = cluster.pods(NS, job, "worker")
    return found if len(found) == count else []


def network_policy(cluster: Cluster, job: str) -> Any:
    """The job's NetworkPolicy, or None once there is none."""
    networking = kubernetes.client.NetworkingV1Api(cluster.api.api_client)
    try:
        return networking.read_namespaced_network_policy(f"{job}-servers", NS)
    except kubernetes.client.ApiException as error:
        if error.status != 404:
            raise
        return None


def answered(cluster: Cluster, job: str) -> bool:
    """Whether the job's coordinator has answered the controller (its progress is shown)."""
    settle(cluster, NS)
    return "progress" in cluster.job(NS, job).get("status", {})


def test_job_gets_coordinator_and_placed_workers(
    cluster: Cluster, controller: ControllerProcess
) -> None:
    cluster.create_job(pooled("place", min_replicas=2, max_replicas=3, priority_class="act-high"))
    workers = eventually(lambda: workers_of(cluster, "place", 3), 30, "three workers")
    job = cluster.job(NS, "place")
    uid = job["metadata"]["uid"]
    for pod in workers:
        assert pod.spec.node_name in ("act-0", "act-1")
        owner = pod.metadata.owner_references[0]
        assert (owner.kind, owner.name, owner.uid, owner.controller) == (
            "TrainingJob",
            "place",
            uid,
            True,
        )
        assert pod.metadata.labels["edl.dev/job"] == "place"
        assert pod.spec.priority_class_name == "act-high"
        assert pod.spec.priority == 1000
        env = {e.name: e for e in pod.spec.containers[0].env}
        assert env["EDL_WORKER_ID"].value == pod.metadata.name
        assert env["EDL_NODE_NAME"].value == pod.spec.node_name
        assert env["EDL_COORDINATOR"].value.startswith("127.0.0.1:")
        credential = env["EDL_JOB_TOKEN"].value_from.secret_key_ref.name
        assert credential == f"{pod.metadata.name}-credential"
        secret = cluster.core.read_namespaced_secret(credential, NS)
        assert secret.metadata.owner_references[0].uid == uid
        assert pod.spec.containers[0].resources.limits["nvidia.com/gpu"] == "1"
    coordinator = cluster.pods(NS, "place", "coordinator")
    assert len(coordinator) == 1 and coordinator[0].spec.node_name in ("act-0", "act-1")
    (container,) = coordinator[0].spec.containers
    for probe in (container.readiness_probe, container.liveness_probe):
        assert "trainer_runtime.protocol.health_probe" in probe._exec.command
    service = cluster.core.read_namespaced_service("place-coordinator", NS)
    assert service.metadata.owner_references[0].uid == uid
    policy = network_policy(cluster, "place")
    assert policy is not None and policy.metadata.owner_references[0].uid == uid
    assert policy.spec.pod_selector.match_labels == {"edl.dev/job": "place"}

    def running() -> dict[str, Any] | None:
        status = cluster.job(NS, "place").get("status", {})
        return status if status.get("phase") in RUNNING_PHASES else None

    status = eventually(running, 20, "phase Running (or Resizing: played workers never join)")
    assert status["replicas"] == 3
    assert sorted(status["allocation"]) == sorted(p.metadata.name for p in workers)
    assert status["priority"] == 1000
    cluster.told(NS, "place", "Admitted")


def test_refused_worker_is_replaced_without_charge_and_failures_are_charged(
    cluster: Cluster, controller: ControllerProcess
) -> None:
    cluster.create_job(pooled("fail", max_restarts=1))
    first = eventually(lambda: workers_of(cluster, "fail", 1), 30, "a worker")[0]
    # Workers are created with their coordinator; one failing before the coordinator has
    # answered is not charged, so the charged failures below come after its first answer.
    eventually(
        lambda: answered(cluster, "fail"),
        30,
        "the coordinator's first answer",
        lambda: f"{played_coordinators().report(NS, 'fail')}\n{controller.log_tail(40)}",
    )
    cluster.set_pod_phase(NS, first.metadata.name, "Failed", reason="OutOfnvidia.com/gpu")
    second = eventually(
        lambda: [p for p in cluster.pods(NS, "fail", "worker")
                 if p.metadata.name != first.metadata.name and not p.metadata.deletion_timestamp],
        30, "a replacement of the refused worker",
    )[0]  # fmt: skip
    assert cluster.job(NS, "fail").get("status", {}).get("restarts", 0) == 0
    cluster.set_pod_phase(NS, second.metadata.name, "Failed")
    eventually(
        lambda: cluster.job(NS, "fail").get("status", {}).get("restarts") == 1, 30, "one restart"
    )
    third = eventually(
        lambda: [p for p in cluster.pods(NS, "fail", "worker")
                 if p.metadata.name not in (first.metadata.name, second.metadata.name)
                 and not p.metadata.deletion_timestamp],
        30, "a replacement of the failed worker",
    )[0]  # fmt: skip
    cluster.set_pod_phase(NS, third.metadata.name, "Failed")
    eventually(
        lambda: cluster.job(NS, "fail").get("status", {}).get("phase") == "Failed",
        30,
        "phase Failed past maxRestarts",
    )
    cluster.told(NS, "fail", "RefusedAtAdmission", "ReplicaFailed", "Failed")


def test_nonsense_jobs_get_a_reason_and_the_controller_keeps_running(
    cluster: Cluster, controller: ControllerProcess
) -> None:
    bad = pooled("minmax", min_replicas=3, max_replicas=2)
    cluster.create_job(bad)
    huge = pooled("huge", gpus=16)
    cluster.create_job(huge)

    def invalid() -> bool:
        status = cluster.job(NS, "minmax").get("status", {})
        valid = [c for c in status.get("conditions", []) if c["type"] == "Valid"]
        return (
            bool(valid) and valid[0]["status"] == "False" and "maxReplicas" in valid[0]["message"]
        )

    eventually(invalid, 20, "Valid=False on minReplicas > maxReplicas")
    told = cluster.told(NS, "minmax", "Invalid")
    assert any(e.reason == "Invalid" and e.type == "Warning" for e in told)
    eventually(
        lambda: cluster.job(NS, "huge").get("status", {}).get("message"), 20, "a waiting reason"
    )
    status = cluster.job(NS, "huge")["status"]
    assert status["phase"] == "Pending"
    assert not cluster.pods(NS, "huge")
    assert controller.popen is not None and controller.popen.poll() is None
    assert controller.healthy()


def test_deleting_a_job_removes_what_it_owns(
    cluster: Cluster, controller: ControllerProcess
) -> None:
    """What it owns goes with it (the garbage collector), and its pods go sooner: the
    controller deletes them once a live read says the job is gone, even one that no owner
    reference ties to it."""
    cluster.create_job(pooled("gone"))
    (worker,) = eventually(lambda: workers_of(cluster, "gone", 1), 30, "a worker")
    assert network_policy(cluster, "gone") is not None
    cluster.delete_job(NS, "gone")
    # A pod of the job that no owner reference ties to it: the garbage collector never
    # removes it; the controller does, once it reads that the job is gone.
    stray = {
        "metadata": {"name": "gone-stray", "labels": {"edl.dev/job": "gone",
                                                      "edl.dev/role": "worker"}},
        "spec": {"nodeName": worker.spec.node_name,
                 "containers": [{"name": "w", "image": "example/none:1"}]},
    }  # fmt: skip
    cluster.core.create_namespaced_pod(NS, stray)

    def collected() -> bool:
        pods = cluster.pods(NS, "gone")
        # No kubelet confirms the deletion here: terminating is what garbage collection does.
        return all(p.metadata.deletion_timestamp for p in pods)

    eventually(collected, 60, "the job's pods to be collected")
    eventually(
        lambda: not [s for s in cluster.core.list_namespaced_service(NS).items
                     if s.metadata.name == "gone-coordinator"],
        60, "the job's Service to be collected",
    )  # fmt: skip
    eventually(lambda: network_policy(cluster, "gone") is None, 60, "the job's NetworkPolicy to go")


def test_metrics_and_liveness(controller: ControllerProcess) -> None:
    text = controller.metrics()
    for name in (
        "edl_planner_cycle_seconds_bucket",
        'edl_jobs{phase="Running"}',
        "edl_gpus_capacity",
        "edl_gpus_allocated",
        "edl_preemptions_total",
        "edl_job_wait_seconds_bucket",
        "edl_job_completion_seconds_bucket",
    ):
        assert name in text, name
    assert "edl_controller_leader 1.0" in text
    assert controller.healthy()


def test_two_controllers_exactly_one_acts(
    kube_api: KubeAPI, cluster: Cluster, tmp_path: Path
) -> None:
    ns = "ctrl-lease"
    ensure_namespace(kube_api, ns)
    with (
        running_controller(kube_api, tmp_path, "lease-a", ns) as a,
        running_controller(kube_api, tmp_path, "lease-b", ns) as b,
    ):
        eventually(lambda: a.healthy() and b.healthy(), 30, "both controllers")

        def leaders() -> list[ControllerProcess]:
            return [c for c in (a, b) if "edl_controller_leader 1.0" in c.metrics()]

        eventually(lambda: len(leaders()) == 1, 20, "one leader")
        time.sleep(2)
        assert len(leaders()) == 1
        lease = kubernetes.client.CoordinationV1Api(kube_api.api_client).read_namespaced_lease(
            "edl-controller", ns
        )
        leader = leaders()[0]
        assert lease.spec.holder_identity == leader.identity
        leader.kill()
        other = b if leader is a else a
        eventually(
            lambda: "edl_controller_leader 1.0" in other.metrics(), 20, "the standby to take over"
        )
        # A graceful stop (SIGTERM) gives the Lease up, so that a standby need not wait for
        # it to lapse.
        other.stop()
        assert other.popen is not None and other.popen.returncode == 0, other.log_tail()
        lease = kubernetes.client.CoordinationV1Api(kube_api.api_client).read_namespaced_lease(
            "edl-controller", ns
        )
        assert not lease.spec.holder_identity, (lease.spec, other.log_tail())
