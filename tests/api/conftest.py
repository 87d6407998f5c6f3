"""Shared fixtures for the TrainingJob API tests: small valid documents to start from.

Each fixture returns a fresh mapping, so a test may change it freely.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

REPO_ROOT = Path(__file__).resolve().parents[2]
#: The example TrainingJobs (the folder also holds their namespaces, PriorityClasses and a
#: kustomization, applied together with `kubectl apply -k`).
EXAMPLES = sorted(
    path
    for path in (REPO_ROOT / "manifests" / "examples").glob("*.yaml")
    if [doc.get("kind") for doc in yaml.safe_load_all(path.read_text())] == ["TrainingJob"]
)
assert len(EXAMPLES) >= 2, "the example TrainingJobs are missing from manifests/examples"


#: A full status as the controller would write it, every field set.
STATUS: dict[str, Any] = {
    "phase": "Resizing",
    "message": "growing 4 -> 6: 2 GPUs idle",
    "observedGeneration": 3,
    "priority": 10,
    "replicas": 4,
    "readyReplicas": 4,
    "pserverReplicas": 0,
    "selector": "edl.dev/job=bert,edl.dev/role=worker",
    "allocation": {"bert-worker-0": "node-1", "bert-worker-1": "node-1"},
    "generation": 7,
    "conditions": [
        {
            "type": "Admitted",
            "status": "True",
            "reason": "GangPlaced",
            "message": "4 workers placed",
            "lastTransitionTime": "2024-05-01T12:00:00Z",
            "observedGeneration": 3,
        }
    ],
    "lastResize": {"time": "2024-05-01T12:30:00Z", "from": 2, "to": 4, "reason": "idle GPUs"},
    "submitTime": "2024-05-01T11:59:00Z",
    "startTime": "2024-05-01T12:00:00Z",
    "attainedGpuSeconds": 7200.5,
    "throughput": [
        {"nodes": 1, "workers": 2, "samplesPerSecond": 410.0, "stepSeconds": 0.31, "batch": 64},
        {"nodes": 1, "workers": 4, "samplesPerSecond": 790.5},
    ],
    "batch": {"globalBatch": 128, "accumulation": 2, "goodput": 300.0},
    "progress": {"epoch": 3, "step": 1200, "committedStep": 1199},
    "restarts": 1,
}


def allreduce_document() -> dict[str, Any]:
    """The smallest valid allreduce job, with a few optional fields set."""
    return {
        "apiVersion": "edl.dev/v1alpha1",
        "kind": "TrainingJob",
        "metadata": {"name": "bert", "namespace": "nlp"},
        "spec": {
            "minReplicas": 4,
            "maxReplicas": 8,
            "priority": 10,
            "resources": {"nvidia.com/gpu": 1, "cpu": "4", "memory": "16Gi"},
            "template": {"spec": {"containers": [{"name": "worker", "image": "bert:1"}]}},
        },
    }


def ps_document() -> dict[str, Any]:
    """A valid parameter-server job."""
    document = allreduce_document()
    document["spec"]["strategy"] = "ps"
    document["spec"]["pserver"] = {"minReplicas": 1, "maxReplicas": 2}
    return document


@pytest.fixture
def document() -> dict[str, Any]:
    return allreduce_document()


@pytest.fixture
def ps_job_document() -> dict[str, Any]:
    return ps_document()
