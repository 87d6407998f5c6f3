"""Whole-job preemption on a real API server, with the kubelet in miniature running real
coordinators and framework-free workers (``trainer_runtime.plain_worker``).

The planner's policy here is ``edl`` with ``preemption: shrink-then-suspend``: a rigid job
(minReplicas = maxReplicas) cannot shrink, so a higher-priority job that needs its GPUs takes
them whole.

Aspects tested:
- a rigid low-priority job runs; a high-priority rigid job that needs its GPUs arrives; the
  low job is preempted whole: an Event ``Preempted`` naming the high job and the victims,
  phase Suspended with the condition ``Suspended`` (reason ``Preempted``, the preemptor
  named), every worker drained through the coordinator and gone well before the drain
  deadline (they exit 0: no restart is charged); ``edl_preemptions_total`` counts it;
- its coordinator pod stays (the same pod, holding no GPU), so its ledger is kept;
- the high job runs and succeeds; the low job is admitted again (Event ``Resumed``, the
  condition cleared) and continues from the samples it had committed (never back to 0)
  and succeeds; the workers' ledger files show every sample trained exactly once.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .controller_harness import (
    Cluster,
    ControllerProcess,
    cluster_in,
    eventually,
    healthy_controller,
    training_job,
)
from .kubelet import MiniKubelet
from .nodes import create_node
from .testenv import KubeAPI

NS = "ctrl-preempt"
POOL = "edl.test/pool"
POLICY = "base: edl\npreemption: shrink-then-suspend\ncooldown_seconds: 0\nmin_run_seconds: 0\n"


def job(name: str, **kwargs: Any) -> dict[str, Any]:
    manifest = training_job(name, NS, **kwargs)
    manifest["spec"]["template"]["spec"]["nodeSelector"] = {POOL: "whole"}
    # Longer than any wait below: a victim gone within it left gracefully, through its
    # coordinator's drain, not at the deadline.
    manifest["spec"]["timeouts"] = {"drainSeconds": 300}
    container = manifest["spec"]["template"]["spec"]["containers"][0]
    container["env"] = [{"name": "EDL_TIMEOUT_S", "value": "120"}]
    return manifest


@pytest.fixture(scope="module")
def cluster(kube_api: KubeAPI, kubelet: MiniKubelet) -> Cluster:
    return cluster_in(kube_api, NS)


@pytest.fixture(scope="module")
def controller(
    kube_api: KubeAPI, cluster: Cluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ControllerProcess]:
    workdir: Path = tmp_path_factory.mktemp("ctrl-preempt")
    (workdir / "policy.yaml").write_text(POLICY)
    with healthy_controller(kube_api, workdir, "preempt", NS, ports="26000-26099") as proc:
        yield proc


def status(cluster: Cluster, name: str) -> dict[str, Any]:
    found: dict[str, Any] = cluster.job(NS, name).get("status", {})
    return found


def condition(cluster: Cluster, name: str, type_: str) -> dict[str, Any] | None:
    return next((c for c in status(cluster, name).get("conditions", []) if c["type"] == type_),
                None)  # fmt: skip


def done(cluster: Cluster, name: str) -> int:
    return int(status(cluster, name).get("progress", {}).get("samplesDone", 0))


def plain_worker(ledgers: Path, step_time_s: float = 0.05) -> list[str]:
    """The framework-free worker, appending what it trained to ``<ledgers>/<pod>.ledger``."""
    return [
        "python", "-m", "trainer_runtime.plain_worker", "--step-time-s", str(step_time_s),
        "--ledger-file", f"{ledgers}/$(EDL_WORKER_ID).ledger",
    ]  # fmt: skip


def trained(ledgers: Path) -> Counter[int]:
    """How often each sample was trained (one epoch), from the workers' ledger files: the
    commits the coordinator acknowledged, plus unacknowledged ones (a worker stopped between
    its commit and the answer) that no one trained again."""
    intents: dict[tuple[str, int], range] = {}
    acked: set[tuple[str, int]] = set()
    for path in ledgers.glob("*.ledger"):
        for line in path.read_text().splitlines():
            kind, lease, *rest = line.split()
            if kind == "intent":
                intents[(path.stem, int(lease))] = range(int(rest[1]), int(rest[2]))
            elif kind == "done":
                acked.add((path.stem, int(lease)))
    counts: Counter[int] = Counter()
    for key in acked:
        counts.update(intents[key])
    for key, samples in intents.items():
        if key not in acked and all(counts[i] == 0 for i in samples):
            counts.update(samples)
    return counts


def assert_exactly_once(ledgers: Path, samples: int) -> None:
    counts = trained(ledgers)
    assert set(counts) == set(range(samples)), f"{samples - len(counts)} samples never trained"
    assert max(counts.values()) == 1, "some samples were trained twice"


def test_rigid_job_is_preempted_whole_and_resumes_where_it_stopped(
    kube_api: KubeAPI, cluster: Cluster, controller: ControllerProcess, tmp_path: Path
) -> None:
    create_node(kube_api.api_client, "whole-0", gpus=2, labels={POOL: "whole"}, kubelet=True)
    samples = 4000
    (tmp_path / "low").mkdir()
    (tmp_path / "high").mkdir()
    cluster.create_job(job("low", min_replicas=2, max_replicas=2, priority=10, samples=samples,
                           command=plain_worker(tmp_path / "low")))  # fmt: skip
    eventually(lambda: done(cluster, "low") >= 500, 90, "the low job training")
    coordinator = cluster.pods(NS, "low", "coordinator")[0].metadata.uid
    cluster.create_job(job("high", min_replicas=2, max_replicas=2, priority=100, samples=2000,
                           command=plain_worker(tmp_path / "high")))  # fmt: skip

    def suspended() -> bool:
        return status(cluster, "low").get("phase") == "Suspended" and not cluster.pods(
            NS, "low", "worker"
        )

    eventually(suspended, 60, "the low job Suspended with no worker pod left")
    at_suspension = done(cluster, "low")
    assert 0 < at_suspension < samples, "the preemption was to land mid-run"
    preempted = [e for e in cluster.told(NS, "low", "Preempted") if e.reason == "Preempted"]
    assert f"{NS}/high" in preempted[0].message and "victims: low-worker-" in preempted[0].message
    held = condition(cluster, "low", "Suspended")
    assert held is not None and held["status"] == "True" and held["reason"] == "Preempted"
    assert f"{NS}/high" in held["message"]
    counted = [line for line in controller.metrics().splitlines()
               if line.startswith("edl_preemptions_total ")]  # fmt: skip
    assert counted and float(counted[0].split()[-1]) >= 1, "counted in edl_preemptions_total"
    kept = cluster.pods(NS, "low", "coordinator")
    assert [p.metadata.uid for p in kept] == [coordinator], "the coordinator pod is kept"
    assert "nvidia.com/gpu" not in (kept[0].spec.containers[0].resources.requests or {})

    eventually(lambda: status(cluster, "high").get("phase") == "Succeeded", 90, "high Succeeded")

    def resumed() -> bool:
        return status(cluster, "low").get("phase") in ("Running", "Resizing", "Succeeded")

    eventually(resumed, 60, "the low job admitted again")
    cluster.told(NS, "low", "Resumed")
    # Progress continues from the ledger the kept coordinator held: never back to 0.
    assert done(cluster, "low") >= at_suspension
    eventually(lambda: status(cluster, "low").get("phase") == "Succeeded", 120, "low Succeeded")
    final = status(cluster, "low")
    assert final["restarts"] == 0, "drained workers are not failures"
    assert_exactly_once(tmp_path / "low", samples)
    assert_exactly_once(tmp_path / "high", 2000)
    cleared = condition(cluster, "low", "Suspended")
    assert cleared is not None and cleared["status"] == "False"
