"""A TrainingJob that breaks the CRD's schema is refused by the API server itself (422).

Aspects tested:
- each kind of violation (below a minimum, above a maximum, a missing required field, a wrong
  type, a value outside an enum, a quantity that is not one, nested fields) is refused with
  422 and the field's path named in the response's causes; nothing is stored;
- several violations in one job are all named in one refusal;
- kubectl apply, the user's path, fails and prints the field;
- a change that would break a stored job is refused and the stored job stays as it was.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Iterator
from typing import Any

import kubernetes
import pytest
import yaml
from kubernetes.client import ApiException

from .testenv import REPO, KubeAPI

GROUP, VERSION, PLURAL = "edl.dev", "v1alpha1", "trainingjobs"
NAMESPACE = "schema-refusal"
VALID = yaml.safe_load((REPO / "manifests" / "examples" / "resnet50-allreduce.yaml").read_text())

Change = Callable[[dict[str, Any]], object]


def _set(path: str, value: object) -> Change:
    *parents, leaf = path.split(".")

    def change(job: dict[str, Any]) -> None:
        node = job
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = value

    return change


def _drop(path: str) -> Change:
    *parents, leaf = path.split(".")

    def change(job: dict[str, Any]) -> None:
        node = job
        for key in parents:
            node = node[key]
        del node[leaf]

    return change


def broken(name: str, *changes: Change) -> dict[str, Any]:
    job = copy.deepcopy(VALID)
    job["metadata"] = {"name": name, "namespace": NAMESPACE}
    for change in changes:
        change(job)
    return job


def refusal(api: KubeAPI, job: dict[str, Any]) -> tuple[int, set[str], str]:
    """Creates the job, expecting a refusal: (HTTP status, fields named in causes, message)."""
    objects = kubernetes.client.CustomObjectsApi(api.api_client)
    with pytest.raises(ApiException) as refused:
        objects.create_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, job)
    body = json.loads(refused.value.body)
    fields = {cause.get("field", "") for cause in body.get("details", {}).get("causes", [])}
    return refused.value.status, fields, body.get("message", "")


def stored(api: KubeAPI, name: str) -> dict[str, Any] | None:
    objects = kubernetes.client.CustomObjectsApi(api.api_client)
    try:
        found: dict[str, Any] = objects.get_namespaced_custom_object(
            GROUP, VERSION, NAMESPACE, PLURAL, name
        )
    except ApiException as error:
        if error.status == 404:
            return None
        raise
    return found


@pytest.fixture(scope="module")
def api(kube_api: KubeAPI) -> Iterator[KubeAPI]:
    """The session's API server with the CRD (applied idempotently) and a namespace."""
    kube_api.kubectl("apply", "-f", str(REPO / "manifests" / "crd" / "trainingjobs.edl.dev.yaml"))
    kube_api.kubectl(
        "wait", "--for=condition=Established", "--timeout=30s", "crd/trainingjobs.edl.dev"
    )
    core = kubernetes.client.CoreV1Api(kube_api.api_client)
    core.create_namespace({"metadata": {"name": NAMESPACE}})
    yield kube_api
    core.delete_namespace(NAMESPACE)


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (_set("spec.minReplicas", 0), "spec.minReplicas"),
        (_set("spec.maxReplicas", -1), "spec.maxReplicas"),
        (_drop("spec.minReplicas"), "spec.minReplicas"),
        (_set("spec.maxReplicas", "eight"), "spec.maxReplicas"),
        (_set("spec.framework", "jax"), "spec.framework"),
        (_set("spec.strategy", "ring"), "spec.strategy"),
        (_set("spec.priority", 2_000_000_000), "spec.priority"),
        (_set("spec.resources.cpu", "lots"), "spec.resources.cpu"),
        (_set("spec.failurePolicy.maxRestarts", -1), "spec.failurePolicy.maxRestarts"),
        (_set("spec.timeouts.drainSeconds", "soon"), "spec.timeouts.drainSeconds"),
        (_set("spec.batchPolicy.lrRule", "cubic"), "spec.batchPolicy.lrRule"),
        (_set("spec.coordinator.state.kind", "disk"), "spec.coordinator.state.kind"),
        (_drop("spec"), "spec"),
    ],
    ids=[
        "min-below-1",
        "max-negative",
        "missing-min",
        "max-not-integer",
        "unknown-framework",
        "unknown-strategy",
        "priority-too-high",
        "cpu-not-a-quantity",
        "negative-restarts",
        "drain-not-a-number",
        "unknown-lr-rule",
        "unknown-state-kind",
        "no-spec",
    ],
)
def test_violation_is_refused_naming_the_field(api: KubeAPI, change: Change, field: str) -> None:
    name = "broken-" + field.replace(".", "-").lower()
    status, fields, message = refusal(api, broken(name, change))
    assert status == 422
    assert field in fields, (fields, message)
    assert field in message
    assert stored(api, name) is None


def test_every_violation_is_named_at_once(api: KubeAPI) -> None:
    job = broken(
        "many-wrongs",
        _set("spec.minReplicas", 0),
        _set("spec.framework", "jax"),
        _set("spec.failurePolicy.maxRestarts", -1),
    )
    status, fields, _ = refusal(api, job)
    assert status == 422
    assert {"spec.minReplicas", "spec.framework", "spec.failurePolicy.maxRestarts"} <= fields


def test_kubectl_apply_fails_and_names_the_field(api: KubeAPI) -> None:
    job = broken("kubectl-broken", _set("spec.strategy", "ring"))
    result = api.kubectl("apply", "-f", "-", input=yaml.safe_dump(job), check=False)
    assert result.returncode != 0
    assert "spec.strategy" in result.stderr
    assert "Unsupported value" in result.stderr
    assert stored(api, "kubectl-broken") is None


def test_breaking_change_to_a_stored_job_is_refused_and_loses_nothing(api: KubeAPI) -> None:
    objects = kubernetes.client.CustomObjectsApi(api.api_client)
    objects.create_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, broken("kept"))
    before = stored(api, "kept")
    assert before is not None
    with pytest.raises(ApiException) as refused:
        objects.patch_namespaced_custom_object(
            GROUP, VERSION, NAMESPACE, PLURAL, "kept", {"spec": {"maxReplicas": 0}}
        )
    assert refused.value.status == 422
    assert "spec.maxReplicas" in refused.value.body
    after = stored(api, "kept")
    assert after is not None
    assert after["spec"] == before["spec"]
    assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]
