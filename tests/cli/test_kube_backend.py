"""edlctl --backend kube on a real Kubernetes 1.20 API server (no operator running).

Aspects tested:
- submit (-f and --command), ls, describe, why, scale, suspend, resume, delete and top act on
  TrainingJob custom objects, as kubectl would see them
- bad input: invalid YAML and min > max are refused before the API server is called; a
  duplicate name, an unknown job and a job without pods (logs) give the server's answer as
  a clear message and a non-zero exit code
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from kubernetes import client
from typer.testing import CliRunner, Result

from edl_scheduler.cli.main import app

from ..kube.testenv import KubeAPI
from ..local.jobs import plain_job

pytestmark = pytest.mark.slow

CRD = Path(__file__).resolve().parents[2] / "manifests" / "crd" / "trainingjobs.edl.dev.yaml"


@pytest.fixture(scope="module")
def namespace(kube_api: KubeAPI) -> str:
    kube_api.kubectl("apply", "-f", str(CRD))
    kube_api.kubectl(
        "wait", "--for", "condition=established", "--timeout=60s", "crd/trainingjobs.edl.dev"
    )
    name = f"edlctl-{uuid.uuid4().hex[:8]}"
    kube_api.kubectl("create", "namespace", name)
    return name


def edlctl(api: KubeAPI, namespace: str, *args: str) -> Result:
    return CliRunner().invoke(
        app,
        ["--backend", "kube", "--kubeconfig", str(api.kubeconfig), "-n", namespace, *args],
        env={"COLUMNS": "200"},
        catch_exceptions=False,
    )


def spec_of(api: KubeAPI, namespace: str, name: str) -> dict[str, object]:
    obj = client.CustomObjectsApi(api.api_client).get_namespaced_custom_object(
        "edl.dev", "v1alpha1", namespace, "trainingjobs", name
    )
    spec: dict[str, object] = obj["spec"]
    return spec


def test_every_verb_on_the_api_server(kube_api: KubeAPI, namespace: str, tmp_path: Path) -> None:
    job = tmp_path / "job.yaml"
    job.write_text(plain_job("kverbs", 1, 4, priority=50))
    submitted = edlctl(kube_api, namespace, "submit", "-f", str(job))
    assert submitted.exit_code == 0, submitted.output
    assert f"submitted {namespace}/kverbs" in submitted.output

    made = edlctl(
        kube_api, namespace, "submit", "--name", "kcmd", "--command", "python train.py",
        "--min", "2", "--max", "3", "--priority", "9", "--gpus", "1", "--samples", "100",
    )  # fmt: skip
    assert made.exit_code == 0, made.output
    spec = spec_of(kube_api, namespace, "kcmd")
    assert (spec["minReplicas"], spec["maxReplicas"], spec["priority"]) == (2, 3, 9)

    listed = edlctl(kube_api, namespace, "ls")
    assert listed.exit_code == 0
    assert "kverbs" in listed.output and "1/4" in listed.output and "kcmd" in listed.output
    assert "MIN/MAX" in listed.output

    described = edlctl(kube_api, namespace, "describe", "kverbs")
    assert described.exit_code == 0 and f"{namespace}/kverbs" in described.output
    assert edlctl(kube_api, namespace, "why", "kverbs").exit_code == 0

    assert edlctl(kube_api, namespace, "scale", "kverbs", "--min", "2", "--max", "3").exit_code == 0
    spec = spec_of(kube_api, namespace, "kverbs")
    assert (spec["minReplicas"], spec["maxReplicas"]) == (2, 3)

    assert edlctl(kube_api, namespace, "suspend", "kverbs").exit_code == 0
    assert spec_of(kube_api, namespace, "kverbs")["suspend"] is True
    assert edlctl(kube_api, namespace, "resume", "kverbs").exit_code == 0
    assert spec_of(kube_api, namespace, "kverbs")["suspend"] is False

    top = edlctl(kube_api, namespace, "top", "--once")
    assert top.exit_code == 0 and "kube:" in top.output and "kverbs" in top.output

    for name in ("kverbs", "kcmd"):
        assert edlctl(kube_api, namespace, "delete", name).exit_code == 0
    assert "kverbs" not in edlctl(kube_api, namespace, "ls").output


def test_bad_input_on_the_api_server(kube_api: KubeAPI, namespace: str, tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("kind: [oops\n")
    result = edlctl(kube_api, namespace, "submit", "-f", str(bad))
    assert result.exit_code == 2 and "not valid YAML" in result.output

    inverted = tmp_path / "inverted.yaml"
    inverted.write_text(plain_job("kinverted", 3, 2))
    result = edlctl(kube_api, namespace, "submit", "-f", str(inverted))
    assert result.exit_code == 2 and "maxReplicas" in result.output

    job = tmp_path / "job.yaml"
    job.write_text(plain_job("ktwice", 1, 2))
    assert edlctl(kube_api, namespace, "submit", "-f", str(job)).exit_code == 0
    result = edlctl(kube_api, namespace, "submit", "-f", str(job))
    assert result.exit_code == 4 and "already exists" in result.output

    result = edlctl(kube_api, namespace, "scale", "ktwice", "--min", "5")
    assert result.exit_code == 2 and "below min" in result.output
    result = edlctl(kube_api, namespace, "describe", "ghost")
    assert result.exit_code == 3 and "does not exist" in result.output
    result = edlctl(kube_api, namespace, "logs", "ktwice")
    assert result.exit_code == 3 and "no worker pods" in result.output
    assert edlctl(kube_api, namespace, "delete", "ktwice").exit_code == 0
