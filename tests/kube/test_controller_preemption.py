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

from pathlib import Path
from typing import Any

from .controller_harness import (
    POOL,
    Cluster,
    ControllerProcess,
    controller_fixtures,
    eventually,
    training_job,
)
from .ledgers import assert_exactly_once, plain_worker
from .nodes import create_node
from .testenv import KubeAPI

NS = "ctrl-preempt"
POLICY = (
    "base: edl\npreemption: shrink-then-suspend\ncooldown_seconds: 0\nmin_run_seconds: 0\n"
    "suspend_cost_seconds: 0\n"
)
cluster, controller = controller_fixtures(NS, "preempt", "26000-26099", policy=POLICY)


def job(name: str, **kwargs: Any) -> dict[str, Any]:
    # The drain deadline is longer than any wait below: a victim gone within it left
    # gracefully, through its coordinator's drain, not at the deadline.
    return training_job(
        name, NS, pool="whole", drain_seconds=300, env={"EDL_TIMEOUT_S": "120"}, **kwargs
    )


def test_rigid_job_is_preempted_whole_and_resumes_where_it_stopped(
    kube_api: KubeAPI, cluster: Cluster, controller: ControllerProcess, tmp_path: Path
) -> None:
    create_node(kube_api.api_client, "whole-0", gpus=2, labels={POOL: "whole"}, kubelet=True)
    samples = 4000
    (tmp_path / "low").mkdir()
    (tmp_path / "high").mkdir()
    cluster.create_job(job("low", min_replicas=2, max_replicas=2, priority=10, samples=samples,
                           command=plain_worker(tmp_path / "low")))  # fmt: skip
    eventually(lambda: cluster.samples_done(NS, "low") >= 500, 90, "the low job training")
    coordinator = cluster.pods(NS, "low", "coordinator")[0].metadata.uid
    cluster.create_job(job("high", min_replicas=2, max_replicas=2, priority=100, samples=2000,
                           command=plain_worker(tmp_path / "high")))  # fmt: skip

    def suspended() -> bool:
        return cluster.status(NS, "low").get("phase") == "Suspended" and not cluster.pods(
            NS, "low", "worker"
        )

    eventually(suspended, 60, "the low job Suspended with no worker pod left")
    at_suspension = cluster.samples_done(NS, "low")
    assert 0 < at_suspension < samples, "the preemption was to land mid-run"
    preempted = [e for e in cluster.told(NS, "low", "Preempted") if e.reason == "Preempted"]
    assert f"{NS}/high" in preempted[0].message and "victims: low-worker-" in preempted[0].message
    held = cluster.condition(NS, "low", "Suspended")
    assert held is not None and held["status"] == "True" and held["reason"] == "Preempted"
    assert f"{NS}/high" in held["message"]
    counted = [line for line in controller.metrics().splitlines()
               if line.startswith("edl_preemptions_total ")]  # fmt: skip
    assert counted and float(counted[0].split()[-1]) >= 1, "counted in edl_preemptions_total"
    kept = cluster.pods(NS, "low", "coordinator")
    assert [p.metadata.uid for p in kept] == [coordinator], "the coordinator pod is kept"
    assert "nvidia.com/gpu" not in (kept[0].spec.containers[0].resources.requests or {})

    eventually(lambda: cluster.status(NS, "high").get("phase") == "Succeeded", 90, "high Succeeded")

    def resumed() -> bool:
        return cluster.status(NS, "low").get("phase") in ("Running", "Resizing", "Succeeded")

    eventually(resumed, 60, "the low job admitted again")
    cluster.told(NS, "low", "Resumed")
    # Progress continues from the ledger the kept coordinator held: never back to 0.
    assert cluster.samples_done(NS, "low") >= at_suspension
    eventually(lambda: cluster.status(NS, "low").get("phase") == "Succeeded", 120, "low Succeeded")
    final = cluster.status(NS, "low")
    assert final["restarts"] == 0, "drained workers are not failures"
    assert_exactly_once(tmp_path / "low", samples)
    assert_exactly_once(tmp_path / "high", 2000)
    cleared = cluster.condition(NS, "low", "Suspended")
    assert cleared is not None and cleared["status"] == "False"
