"""Where the controller acts (``fencing``, ``config.ServedNamespaces``), without an API server.

Aspects:
- by default every namespace is served but kube-system; with ``--namespace`` only those
  named; kube-system can never be named (the command line refuses it, naming the option);
- a TrainingJob in a namespace not served is not admitted to the index, and one log line
  says which job, why and where the fix is, once per job;
- a pod labelled as one of ours in a namespace not served counts as another workload's
  (its labels of ours are dropped), one in a namespace served is left as it is;
- no request into a namespace not served leaves the controller (403 without sending), while
  requests into served namespaces, into the controller's own and to cluster-scoped paths
  go through.
"""

from __future__ import annotations

import logging
from typing import Any, cast

import kubernetes
import pytest
from click.testing import CliRunner

from edl_scheduler.controller.app import main as controller_main
from edl_scheduler.controller.config import ConfigError, ServedNamespaces
from edl_scheduler.controller.fencing import FencedKube, NamespaceFence
from edl_scheduler.controller.kubeapi import Kube, KubeError, namespaced


def job(namespace: str, name: str = "j", uid: str = "u1") -> dict[str, Any]:
    return {"metadata": {"namespace": namespace, "name": name, "uid": uid}}


def test_default_serves_every_namespace_but_kube_system() -> None:
    everywhere = ServedNamespaces()
    assert everywhere.serves("research") and everywhere.serves("default")
    assert not everywhere.serves("kube-system")
    assert "never acts in kube-system" in str(everywhere.refusal("kube-system"))


def test_named_namespaces_only_and_never_kube_system() -> None:
    named = ServedNamespaces.parse(["research", "ads"])
    assert named.serves("ads") and not named.serves("default")
    assert "--namespace ads --namespace research" in str(named.refusal("default"))
    assert "docs/deploy.md" in str(named.refusal("default"))
    with pytest.raises(ConfigError, match="--namespace kube-system"):
        ServedNamespaces.parse(["research", "kube-system"])


def test_command_line_refuses_kube_system(tmp_path: Any) -> None:
    key = tmp_path / "key"
    key.write_text("k" * 32)
    result = CliRunner().invoke(
        controller_main, ["--token-key-file", str(key), "--namespace", "kube-system"]
    )
    assert result.exit_code == 2, result.output
    assert "never acts in kube-system" in result.output


def test_jobs_not_served_are_refused_once_with_a_log_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    fence = NamespaceFence(ServedNamespaces.parse(["research"]))
    with caplog.at_level(logging.WARNING, logger="edl.controller.fencing"):
        assert fence.admits_job(job("research"))
        assert not fence.admits_job(job("kube-system", "sys"))
        assert not fence.admits_job(job("kube-system", "sys"))  # said once
        assert not fence.admits_job(job("other", "o"))
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2, lines
    assert "TrainingJob kube-system/sys" in lines[0] and "never acts in kube-system" in lines[0]
    assert "TrainingJob other/o" in lines[1] and "namespace other is not served" in lines[1]


def test_pods_of_ours_in_namespaces_not_served_are_other_workloads() -> None:
    fence = NamespaceFence(ServedNamespaces())
    labels = {"edl.dev/job": "j", "edl.dev/role": "worker", "edl.dev/managed": "true", "a": "b"}

    def pod(namespace: str) -> dict[str, Any]:
        return {"metadata": {"namespace": namespace, "name": "p", "labels": dict(labels)}}

    assert fence.pod(pod("research"))["metadata"]["labels"] == labels
    assert fence.pod(pod("kube-system"))["metadata"]["labels"] == {"a": "b"}
    bare = {"metadata": {"namespace": "kube-system", "name": "p"}}
    assert fence.pod(bare) == bare


class RecordingKube:
    """Answers every request with {} and records it."""

    def __init__(self) -> None:
        self.api_client = cast(kubernetes.client.ApiClient, None)
        self.timeout_s = 1.0
        self.sent: list[str] = []

    def request(self, method: str, path: str, body: Any = None, **_: Any) -> Any:
        self.sent.append(f"{method} {path}")
        return {}


def test_no_request_leaves_for_a_namespace_not_served() -> None:
    inner = RecordingKube()
    kube = FencedKube(cast(Kube, inner), ServedNamespaces.parse(["research"]), "edl-system")
    for path in (
        namespaced("kube-system", "pods"),
        namespaced("other", "secrets"),
        namespaced("kube-system", "trainingjobs", "j", group="edl.dev/v1alpha1") + "/status",
    ):
        with pytest.raises(KubeError) as refused:
            kube.request("POST", path, {})
        assert refused.value.status == 403 and "not sent" in str(refused.value)
    assert inner.sent == []
    kube.request("POST", namespaced("research", "pods"), {})
    kube.request("PUT", namespaced("edl-system", "leases", "edl-controller", group="x/v1"), {})
    kube.request("GET", "/api/v1/nodes")
    assert len(inner.sent) == 3
