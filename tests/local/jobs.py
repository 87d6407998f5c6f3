"""TrainingJob YAML for the local backend's tests: framework-free workers, small datasets."""

from __future__ import annotations

import sys

import yaml


def plain_job(
    name: str,
    min_replicas: int = 1,
    max_replicas: int = 1,
    priority: int = 0,
    samples: int = 2000,
    step_time_s: float = 0.05,
    max_restarts: int = 3,
    command: list[str] | None = None,
    gpus: int = 0,
) -> str:
    """A ``framework: none`` job of ``trainer_runtime.plain_worker`` workers, as YAML."""
    argv = command or [
        sys.executable,
        "-m",
        "trainer_runtime.plain_worker",
        "--step-time-s",
        str(step_time_s),
    ]
    document = {
        "apiVersion": "edl.dev/v1alpha1",
        "kind": "TrainingJob",
        "metadata": {
            "name": name,
            "annotations": {"edl.dev/coordinator-args": f"--samples {samples} --shard-size 16"},
        },
        "spec": {
            "minReplicas": min_replicas,
            "maxReplicas": max_replicas,
            "priority": priority,
            "framework": "none",
            "resources": {"nvidia.com/gpu": gpus},
            "failurePolicy": {"maxRestarts": max_restarts},
            "timeouts": {"drainSeconds": 10},
            "template": {
                "spec": {"containers": [{"name": "worker", "image": "local", "command": argv}]}
            },
        },
    }
    return yaml.safe_dump(document, sort_keys=False)


def as_ps(text: str, servers: tuple[int, int] = (2, 2), framework: str = "torch") -> str:
    """A job of ``plain_job``'s YAML made a parameter-server job (``strategy: ps``) with
    ``servers`` (min, max) parameter servers."""
    document = yaml.safe_load(text)
    document["spec"] |= {
        "framework": framework,
        "strategy": "ps",
        "pserver": {"minReplicas": servers[0], "maxReplicas": servers[1]},
    }
    return yaml.safe_dump(document, sort_keys=False)
