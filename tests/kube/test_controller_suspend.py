"""``spec.suspend`` on a running job, on a real API server with the kubelet in miniature
running a real coordinator and framework-free workers (``trainer_runtime.plain_worker``).

What a suspended job keeps: its coordinator pod (no GPU; it holds the ledger: the committed
samples, the shard queue, the generation) and the ConfigMap with the coordinator's saved
state. Its replicas all leave. The live coordinator is kept because the ConfigMap's copy
lags it by up to the snapshot period: only the coordinator holds the exact ledger, so a
resumed job neither repeats nor skips a sample.

Aspects tested:
- ``suspend: true`` on a running job: every worker drains through the coordinator (exits 0
  well before the drain deadline, no restart charged) and its pod goes; phase Suspended,
  Event ``Suspended``, condition ``Suspended`` (reason ``UserSuspended``); the same
  coordinator pod and the state ConfigMap remain; no sample is committed while suspended;
- ``suspend: false``: Event ``Resumed``, the condition turns False, the job runs again from
  the samples it had committed (never back to 0) and succeeds; the workers' ledger files show
  every sample trained exactly once.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .controller_harness import (
    GROUP,
    PLURAL,
    VERSION,
    Cluster,
    ControllerProcess,
    cluster_in,
    eventually,
    healthy_controller,
    training_job,
)
from .kubelet import MiniKubelet
from .nodes import create_node
from .test_controller_preemption import assert_exactly_once, plain_worker
from .testenv import KubeAPI

NS = "ctrl-suspend"
POOL = "edl.test/pool"


@pytest.fixture(scope="module")
def cluster(kube_api: KubeAPI, kubelet: MiniKubelet) -> Cluster:
    return cluster_in(kube_api, NS)


@pytest.fixture(scope="module")
def controller(
    kube_api: KubeAPI, cluster: Cluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ControllerProcess]:
    workdir: Path = tmp_path_factory.mktemp("ctrl-suspend")
    with healthy_controller(kube_api, workdir, "suspend", NS, ports="26100-26199") as proc:
        yield proc


def status(cluster: Cluster, name: str) -> dict[str, Any]:
    found: dict[str, Any] = cluster.job(NS, name).get("status", {})
    return found


def suspended_condition(cluster: Cluster, name: str) -> dict[str, Any] | None:
    return next(
        (c for c in status(cluster, name).get("conditions", []) if c["type"] == "Suspended"),
        None,
    )


def done(cluster: Cluster, name: str) -> int:
    return int(status(cluster, name).get("progress", {}).get("samplesDone", 0))


def set_suspend(cluster: Cluster, name: str, value: bool) -> None:
    cluster.custom.patch_namespaced_custom_object(
        GROUP, VERSION, NS, PLURAL, name, {"spec": {"suspend": value}}
    )


def test_suspend_keeps_the_ledger_and_resume_continues_from_it(
    kube_api: KubeAPI, cluster: Cluster, controller: ControllerProcess, tmp_path: Path
) -> None:
    create_node(kube_api.api_client, "susp-0", gpus=2, labels={POOL: "susp"}, kubelet=True)
    samples = 4000
    manifest = training_job(
        "nap", NS, min_replicas=1, max_replicas=2, samples=samples,
        command=plain_worker(tmp_path),
    )  # fmt: skip
    manifest["spec"]["template"]["spec"]["nodeSelector"] = {POOL: "susp"}
    manifest["spec"]["template"]["spec"]["containers"][0]["env"] = [
        {"name": "EDL_TIMEOUT_S", "value": "120"}
    ]
    # Longer than any wait below: a worker gone within it left gracefully, through its
    # coordinator's drain, not at the deadline.
    manifest["spec"]["timeouts"] = {"drainSeconds": 300}
    cluster.create_job(manifest)
    eventually(lambda: done(cluster, "nap") >= 500, 90, "the job training")
    coordinator = cluster.pods(NS, "nap", "coordinator")[0].metadata.uid
    set_suspend(cluster, "nap", True)

    def suspended() -> bool:
        return status(cluster, "nap").get("phase") == "Suspended" and not cluster.pods(
            NS, "nap", "worker"
        )

    eventually(suspended, 60, "phase Suspended with no worker pod left")
    cluster.told(NS, "nap", "Suspended")
    held = suspended_condition(cluster, "nap")
    assert held is not None and held["status"] == "True" and held["reason"] == "UserSuspended"
    kept = cluster.pods(NS, "nap", "coordinator")
    assert [p.metadata.uid for p in kept] == [coordinator], "the coordinator pod is kept"
    assert kept[0].status.phase == "Running"
    state = cluster.core.read_namespaced_config_map("nap-coordinator-state", NS)
    assert state.metadata.owner_references[0].name == "nap"

    def settled() -> int | None:
        # The status shows the coordinator's progress of up to a poll (1 s) ago: the last
        # shards the drained workers committed may show after their pods have gone.
        before = done(cluster, "nap")
        time.sleep(1.5)
        return before if done(cluster, "nap") == before else None

    at_suspension = eventually(settled, 30, "the progress of the drained workers shown")
    assert 0 < at_suspension < samples, "the suspension was to land mid-run"
    time.sleep(3)  # three more progress polls: nothing trains while suspended
    assert done(cluster, "nap") == at_suspension
    assert status(cluster, "nap")["restarts"] == 0, "drained workers are not failures"

    set_suspend(cluster, "nap", False)
    cluster.told(NS, "nap", "Resumed")
    eventually(lambda: done(cluster, "nap") > at_suspension, 90, "training again")
    eventually(lambda: status(cluster, "nap").get("phase") == "Succeeded", 120, "Succeeded")
    assert status(cluster, "nap")["restarts"] == 0
    assert_exactly_once(tmp_path, samples)
    cleared = suspended_condition(cluster, "nap")
    assert cleared is not None and cleared["status"] == "False"
