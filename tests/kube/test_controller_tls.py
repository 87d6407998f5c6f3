"""The operator deployed with ``--tls``, end to end on a real API server with the kubelet in
miniature (real coordinator and framework-free workers as local processes).

Aspects tested:
- a job runs to Succeeded with every call TLS: the controller's to its coordinator
  (progress, the planned size), the workers' to their coordinator;
- the job's TLS key is in a Secret the job owns, mounted by its coordinator only; its
  workers get the certificate alone; each worker's credential is in a Secret of its own;
- the coordinator answers no plaintext client.
"""

from __future__ import annotations

from typing import Any

import grpc

from trainer_runtime.protocol import METHODS, SERVICE, TOKEN_HEADER, pb

from .controller_harness import (
    POOL,
    Cluster,
    ControllerProcess,
    controller_fixtures,
    eventually,
    training_job,
)
from .kubelet import MiniKubelet
from .nodes import create_node
from .testenv import KubeAPI

NS = "ctrl-tls"
cluster, controller = controller_fixtures(NS, "tls", "26300-26399", extra=("--tls",))


def env_of(pod: Any) -> dict[str, Any]:
    return {e.name: e for e in pod.spec.containers[0].env}


def test_a_job_runs_to_success_over_tls(
    kube_api: KubeAPI, cluster: Cluster, controller: ControllerProcess, kubelet: MiniKubelet
) -> None:
    create_node(kube_api.api_client, "tls-0", gpus=2, labels={POOL: "tls"}, kubelet=True)
    cluster.create_job(
        training_job("secure", NS, pool="tls", max_replicas=2, samples=2000, drain_seconds=10)
    )

    def progressing() -> dict[str, Any] | None:
        status = cluster.job(NS, "secure").get("status", {})
        return status if status.get("progress", {}).get("samplesDone", 0) > 0 else None

    eventually(progressing, 60, "progress read over TLS by the controller")
    secret = cluster.core.read_namespaced_secret("secure-tls", NS)
    assert secret.metadata.owner_references[0].name == "secure"
    coordinator = cluster.pods(NS, "secure", "coordinator")[0]
    served = env_of(coordinator)
    assert served["EDL_TLS_KEY"].value_from.secret_key_ref.name == "secure-tls"
    certificate = served["EDL_TLS_CERT"].value
    for worker in cluster.pods(NS, "secure", "worker"):
        env = env_of(worker)
        assert env["EDL_TLS_CERT"].value == certificate and "EDL_TLS_KEY" not in env
        assert env["EDL_JOB_TOKEN"].value_from.secret_key_ref.name == (
            f"{worker.metadata.name}-credential"
        )
    port = int(coordinator.metadata.annotations["edl.dev/coordinator-port"])
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    progress = channel.unary_unary(
        f"/{SERVICE}/GetProgress",
        request_serializer=pb.Empty.SerializeToString,
        response_deserializer=METHODS["GetProgress"].reply.FromString,
    )
    try:
        progress(pb.Empty(), metadata=((TOKEN_HEADER, "x"),), timeout=2)
        raise AssertionError("a plaintext client was answered")
    except grpc.RpcError as error:
        assert error.code() is grpc.StatusCode.UNAVAILABLE
    finally:
        channel.close()
    eventually(
        lambda: cluster.job(NS, "secure").get("status", {}).get("phase") == "Succeeded",
        120,
        "Succeeded",
    )
    assert cluster.job(NS, "secure")["status"]["restarts"] == 0
