"""Shared fixtures for the TrainingJob API tests: small valid documents to start from.

Each fixture returns a fresh mapping, so a test may change it freely.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((REPO_ROOT / "manifests" / "examples").glob("*.yaml"))


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
