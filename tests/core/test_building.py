"""The seam between the API and the planner.

Aspects:
- a policy file picks a preset and overrides fields; bad values name the field;
- a TrainingJob's spec, template constraints and status become the planner's Job, and the
  planner honours the template's node selector, affinity and tolerations.
"""

from __future__ import annotations

import pytest

from edl_scheduler.api import TrainingJobError, load_training_job
from edl_scheduler.api.policy import load_policy_config
from edl_scheduler.core import EqualShrinking, Growth, Ordering, Preemption, Snapshot, plan, preset
from edl_scheduler.core.building import job_from_training_job, policy_from_config
from tests.core.builders import node

JOB = """
apiVersion: edl.dev/v1alpha1
kind: TrainingJob
metadata: {name: bert, namespace: research}
spec:
  minReplicas: 2
  maxReplicas: 6
  priority: 7
  resources: {nvidia.com/gpu: 1, cpu: 1500m, memory: 8Gi}
  template:
    spec:
      nodeSelector: {pool: gpu}
      tolerations: [{key: dedicated, operator: Exists, effect: NoSchedule}]
      affinity:
        nodeAffinity:
          requiredDuringSchedulingIgnoredDuringExecution:
            nodeSelectorTerms:
              - matchExpressions: [{key: zone, operator: In, values: [a, b]}]
      containers: [{name: trainer, image: example/bert:1}]
"""


def test_policy_file_overrides_a_preset() -> None:
    cfg = load_policy_config(
        "base: edl\ncooldownSeconds: 30\npreemption: shrink\ngrowth: fulfillment\n"
        "suspendEqualPriority: false\nlasRunningFirst: false\nordering: fifo\n"
        "suspendCostSeconds: 90\nrampSeconds: 45\n"
        "shrinkEqualPriority: never\nreclaimEqualPriority: true\n"
    )
    policy = policy_from_config(cfg)
    assert policy.shrink_equal_priority is EqualShrinking.NEVER
    assert policy.reclaims and not preset("edl").reclaims
    assert policy.ramp_s == 45 and preset("edl").ramp_s == 60
    assert policy.cooldown_s == 30
    assert policy.preemption is Preemption.SHRINK
    assert policy.growth is Growth.FULFILLMENT
    assert policy.ordering is Ordering.FIFO
    assert not policy.suspend_equal_priority and not policy.las_running_first
    assert policy.min_run_s == preset("edl").min_run_s
    assert policy.suspend_cost_s == 90 and policy.suspension_min_run_s == 900
    trusting = policy_from_config(load_policy_config("base: edl\nrampSeconds: null\n"))
    assert trusting.ramp_s is None  # growth on evidence turned off


def test_policy_file_errors_name_the_field() -> None:
    with pytest.raises(TrainingJobError, match="maxLoad"):
        load_policy_config("maxLoad: 1.5\n")
    with pytest.raises(TrainingJobError, match="base"):
        load_policy_config("base: fastest\n")
    with pytest.raises(TrainingJobError, match="suspendCostSeconds"):
        load_policy_config("suspendCostSeconds: -1\n")
    with pytest.raises(TrainingJobError, match="rampSeconds"):
        load_policy_config("rampSeconds: -5\n")
    with pytest.raises(TrainingJobError, match=r"shrinkEqualPriority.*after-minimum-run"):
        load_policy_config("shrinkEqualPriority: sometimes\n")


def test_training_job_becomes_a_planner_job_with_its_constraints() -> None:
    job = job_from_training_job(load_training_job(JOB), priority=7)
    assert job.name == "research/bert"
    assert (job.worker.min_replicas, job.worker.max_replicas) == (2, 6)
    assert job.requested is None
    asking = JOB.replace("maxReplicas: 6", "maxReplicas: 6\n  replicas: 4")
    assert job_from_training_job(load_training_job(asking), priority=7).requested == 4
    assert job.worker.resources.cpu_milli == 1500
    assert job.worker.resources.memory_bytes == 8 * 2**30
    cluster = (
        node("ok").labels(pool="gpu", zone="a").taint("dedicated").build(),
        node("wrong-zone").labels(pool="gpu", zone="c").build(),
        node("no-pool").labels(zone="a").build(),
        node("tainted").labels(pool="gpu", zone="b").taint("other").build(),
    )
    p = plan(Snapshot(cluster, (job,)), preset("edl"), 0.0)
    assert set(p.decision("research/bert").workers.add_nodes) == {"ok"}
