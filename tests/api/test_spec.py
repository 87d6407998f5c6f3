"""The TrainingJob spec: defaults, accepted shapes, and every validation error.

Aspects tested:
- defaults (preemptible, framework, strategy, timeouts, failure policy, batch policy,
  suspend) and the derived values the planner reads (`coordinator_image`, `elastic`);
- a table of invalid documents: each yields exactly one problem, at the full camelCase path,
  whose message says what is wrong and how to fix it;
- strategy ps requires a pserver block, and any other strategy forbids it;
- batch policy rules (global batch for fixedGlobalBatch, lrRule only when scaling, global
  batch at least maxReplicas);
- several problems in one document are all reported;
- models built in Python with snake_case names follow the same rules.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
from pydantic import ValidationError

from edl_scheduler.api import (
    BatchMode,
    Framework,
    PodTemplate,
    StateKind,
    Strategy,
    TrainingJobError,
    TrainingJobSpec,
    load_training_job,
)

from .conftest import allreduce_document, ps_document

Document = dict[str, Any]


def test_defaults(document: Document) -> None:
    spec = load_training_job(document).spec
    assert spec.preemptible is True
    assert spec.framework is Framework.TORCH
    assert spec.strategy is Strategy.ALLREDUCE
    assert spec.pserver is None
    assert spec.priority_class_name is None
    assert (spec.timeouts.join_seconds, spec.timeouts.drain_seconds) == (60, 30)
    assert spec.failure_policy.max_restarts == 3
    assert spec.batch_policy.mode is BatchMode.NONE
    assert spec.batch_policy.global_batch_size is None
    assert spec.coordinator.state.kind is StateKind.SNAPSHOT
    assert spec.suspend is False


def test_coordinator_image_defaults_to_the_first_worker_image(document: Document) -> None:
    document["spec"]["template"]["spec"]["containers"].append({"name": "side", "image": "x:2"})
    spec = load_training_job(document).spec
    assert spec.coordinator_image == "bert:1"
    document["spec"]["coordinator"] = {"image": "coordinator:3"}
    assert load_training_job(document).spec.coordinator_image == "coordinator:3"


def test_elastic_means_more_than_one_size(document: Document) -> None:
    assert load_training_job(document).spec.elastic
    document["spec"]["maxReplicas"] = 4
    assert not load_training_job(document).spec.elastic


def test_requested_replicas_stay_within_the_bounds(document: Document) -> None:
    spec = load_training_job(document).spec
    assert spec.replicas is None and spec.requested_replicas is None
    document["spec"]["replicas"] = 6
    assert load_training_job(document).spec.requested_replicas == 6
    # `kubectl scale` moves one bound alone: the job stays valid, asking for the nearer one
    document["spec"]["maxReplicas"] = 5
    assert load_training_job(document).spec.requested_replicas == 5
    document["spec"]["replicas"] = 2  # below minReplicas (4)
    assert load_training_job(document).spec.requested_replicas == 4


def test_ps_job_loads_with_its_pserver(ps_job_document: Document) -> None:
    spec = load_training_job(ps_job_document).spec
    assert spec.strategy is Strategy.PS
    assert spec.pserver is not None
    assert (spec.pserver.min_replicas, spec.pserver.max_replicas) == (1, 2)


def test_priority_class_instead_of_priority(document: Document) -> None:
    del document["spec"]["priority"]
    document["spec"]["priorityClassName"] = "high"
    spec = load_training_job(document).spec
    assert (spec.priority, spec.priority_class_name) == (None, "high")


def test_neither_priority_nor_class_is_allowed(document: Document) -> None:
    del document["spec"]["priority"]
    assert load_training_job(document).spec.priority is None


def test_fixed_global_batch_equal_to_max_replicas_is_enough(document: Document) -> None:
    document["spec"]["batchPolicy"] = {"mode": "fixedGlobalBatch", "globalBatchSize": 8}
    assert load_training_job(document).spec.batch_policy.global_batch_size == 8


def _parent(document: Document, path: str | tuple[str, ...]) -> tuple[Any, Any]:
    """The container holding the last part of a dotted path (or tuple of keys), and its key."""
    *parents, last = path.split(".") if isinstance(path, str) else path
    node: Any = document
    for part in parents:
        node = node[int(part)] if part.isdigit() else node[part]
    return node, int(last) if last.isdigit() else last


def _set(path: str | tuple[str, ...], value: Any) -> Callable[[Document], None]:
    """A change that sets a path (list indices as numbers) in a document."""

    def change(document: Document) -> None:
        node, key = _parent(document, path)
        node[key] = value

    return change


def _delete(path: str) -> Callable[[Document], None]:
    def change(document: Document) -> None:
        node, key = _parent(document, path)
        del node[key]

    return change


CONTAINER = "spec.template.spec.containers"
TOLERATION = "spec.template.spec.tolerations"
TERM = "spec.template.spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"


def _affinity(requirement: dict[str, Any]) -> Callable[[Document], None]:
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [requirement]}]
            }
        }
    }
    return _set("spec.template.spec.affinity", affinity)


# (id, change, expected path, fragments the message must contain: the problem, then the fix)
INVALID: list[tuple[str, Callable[[Document], None], str, tuple[str, ...]]] = [
    (
        "max below min",
        _set("spec.maxReplicas", 2),
        "spec.maxReplicas",
        ("2 is below spec.minReplicas (4)", "raise spec.maxReplicas or lower spec.minReplicas"),
    ),
    ("replicas zero", _set("spec.replicas", 0), "spec.replicas", ("at least 1", "use 1")),
    ("min zero", _set("spec.minReplicas", 0), "spec.minReplicas", ("at least 1", "use 1")),
    ("min missing", _delete("spec.minReplicas"), "spec.minReplicas", ("is required", "add it")),
    ("min text", _set("spec.minReplicas", "four"), "spec.minReplicas", ("whole number",)),
    (
        "both priorities",
        _set("spec.priorityClassName", "high"),
        "spec.priorityClassName",
        ("together with spec.priority", "keep one"),
    ),
    (
        "priority above user range",
        _set("spec.priority", 2_000_000_000),
        "spec.priority",
        ("at most 1000000000", "use 1000000000 or less"),
    ),
    (
        "empty priority class",
        _set("spec.priorityClassName", ""),
        "spec.priorityClassName",
        ("must not be empty",),
    ),
    (
        "unknown framework",
        _set("spec.framework", "jax"),
        "spec.framework",
        ("one of 'torch', 'paddle' or 'none'", "'jax'"),
    ),
    (
        "ps without pserver",
        _set("spec.strategy", "ps"),
        "spec.pserver",
        ("is required when strategy is ps", "add a pserver block"),
    ),
    (
        "pserver on allreduce",
        _set("spec.pserver", {"minReplicas": 1, "maxReplicas": 1}),
        "spec.pserver",
        ("only applies when strategy is ps", "remove pserver or set strategy: ps"),
    ),
    ("cpu junk", _set("spec.resources.cpu", "lots"), "spec.resources.cpu", ("not a quantity",)),
    (
        "memory negative",
        _set("spec.resources.memory", "-1Gi"),
        "spec.resources.memory",
        ("must not be negative", "0 or more"),
    ),
    (
        "gpu negative",
        _set(("spec", "resources", "nvidia.com/gpu"), -1),
        'spec.resources["nvidia.com/gpu"]',
        ("at least 0",),
    ),
    (
        "resources typo",
        _set("spec.resources.gpus", 1),
        "spec.resources.gpus",
        ("not a known field",),
    ),
    ("no template", _delete("spec.template"), "spec.template", ("is required", "add it")),
    ("no containers", _set(f"{CONTAINER}", []), CONTAINER, ("at least 1 item",)),
    (
        "container without image",
        _set(f"{CONTAINER}.0", {"name": "worker"}),
        f"{CONTAINER}[0].image",
        ("is required", "give the container image"),
    ),
    (
        "GPUs on the container",
        _set(f"{CONTAINER}.0.resources", {"limits": {"nvidia.com/gpu": -1}}),
        f"{CONTAINER}[0].resources.limits.nvidia.com/gpu",
        ("GPUs go in the job's spec.resources", "move the request there"),
    ),
    (
        "volume without claim",
        _set("spec.coordinator", {"state": {"kind": "volume"}}),
        "spec.coordinator.state.claimName",
        ("is required when kind is volume", "name a PersistentVolumeClaim"),
    ),
    (
        "claim with snapshot",
        _set("spec.coordinator", {"state": {"claimName": "c"}}),
        "spec.coordinator.state.claimName",
        ("only applies when kind is volume",),
    ),
    (
        "join zero",
        _set("spec.timeouts", {"joinSeconds": 0}),
        "spec.timeouts.joinSeconds",
        ("at least 1",),
    ),
    (
        "drain negative",
        _set("spec.timeouts", {"drainSeconds": -3}),
        "spec.timeouts.drainSeconds",
        ("at least 1",),
    ),
    (
        "restarts negative",
        _set("spec.failurePolicy", {"maxRestarts": -1}),
        "spec.failurePolicy.maxRestarts",
        ("at least 0",),
    ),
    (
        "fixed batch without size",
        _set("spec.batchPolicy", {"mode": "fixedGlobalBatch"}),
        "spec.batchPolicy.globalBatchSize",
        ("is required when mode is fixedGlobalBatch", "give the global batch size"),
    ),
    (
        "global batch below max replicas",
        _set("spec.batchPolicy", {"mode": "fixedGlobalBatch", "globalBatchSize": 6}),
        "spec.batchPolicy.globalBatchSize",
        ("6 is below spec.maxReplicas (8)", "raise spec.batchPolicy.globalBatchSize"),
    ),
    (
        "global batch without fixed mode",
        _set("spec.batchPolicy", {"globalBatchSize": 64}),
        "spec.batchPolicy.globalBatchSize",
        ("only applies when mode is fixedGlobalBatch",),
    ),
    (
        "lr rule without scaling",
        _set("spec.batchPolicy", {"lrRule": "linear"}),
        "spec.batchPolicy.lrRule",
        ("linear only applies when mode is scaleWithWorkers", "lrRule: none"),
    ),
    (
        "warmup without lr rule",
        _set("spec.batchPolicy", {"mode": "scaleWithWorkers", "warmupSteps": 10}),
        "spec.batchPolicy.warmupSteps",
        ("needs an lrRule", "warmupSteps: 0"),
    ),
    (
        "momentum compensation without lr rule",
        _set("spec.batchPolicy", {"momentumCompensation": True}),
        "spec.batchPolicy.momentumCompensation",
        ("needs an lrRule",),
    ),
    (
        "unknown batch mode",
        _set("spec.batchPolicy", {"mode": "grow"}),
        "spec.batchPolicy.mode",
        ("'fixedGlobalBatch', 'scaleWithWorkers' or 'none'",),
    ),
    (
        "typo suggests the field",
        _set("spec.maxReplica", 3),
        "spec.maxReplica",
        ("did you mean maxReplicas?",),
    ),
    ("suspend not a bool", _set("spec.suspend", "maybe"), "spec.suspend", ("true or false",)),
    (
        "toleration value with Exists",
        _set(TOLERATION, [{"key": "gpu", "operator": "Exists", "value": "a"}]),
        f"{TOLERATION}[0].value",
        ("must be empty when operator is Exists",),
    ),
    (
        "toleration seconds without NoExecute",
        _set(
            TOLERATION, [{"key": "a", "value": "b", "effect": "NoSchedule", "tolerationSeconds": 5}]
        ),
        f"{TOLERATION}[0].tolerationSeconds",
        ("only applies to effect NoExecute",),
    ),
    (
        "toleration without key must be Exists",
        _set(TOLERATION, [{"value": "b"}]),
        f"{TOLERATION}[0].operator",
        ("without a key must use operator Exists",),
    ),
    (
        "toleration bad effect",
        _set(TOLERATION, [{"key": "a", "operator": "Exists", "effect": "Never"}]),
        f"{TOLERATION}[0].effect",
        ("must be one of",),
    ),
    (
        "In without values",
        _affinity({"key": "zone", "operator": "In"}),
        f"{TERM}.nodeSelectorTerms[0].matchExpressions[0].values",
        ("operator In needs at least one value",),
    ),
    (
        "Exists with values",
        _affinity({"key": "zone", "operator": "Exists", "values": ["a"]}),
        f"{TERM}.nodeSelectorTerms[0].matchExpressions[0].values",
        ("operator Exists takes no values", "remove values"),
    ),
    (
        "Gt with text",
        _affinity({"key": "cores", "operator": "Gt", "values": ["many"]}),
        f"{TERM}.nodeSelectorTerms[0].matchExpressions[0].values",
        ("exactly one integer value",),
    ),
    (
        "unknown operator",
        _affinity({"key": "zone", "operator": "Near", "values": ["a"]}),
        f"{TERM}.nodeSelectorTerms[0].matchExpressions[0].operator",
        ("'In', 'NotIn', 'Exists', 'DoesNotExist', 'Gt' or 'Lt'",),
    ),
    (
        "empty term list",
        _set(
            "spec.template.spec.affinity",
            {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {}}},
        ),
        f"{TERM}.nodeSelectorTerms",
        ("is required",),
    ),
    (
        "wrong api version",
        _set("apiVersion", "edl.dev/v2"),
        "apiVersion",
        ("'edl.dev/v2'", "set apiVersion: edl.dev/v1alpha1"),
    ),
    ("wrong kind", _set("kind", "Job"), "kind", ("not a TrainingJob", "set kind: TrainingJob")),
    (
        "bad job name",
        _set("metadata.name", "BERT_large"),
        "metadata.name",
        ("not a valid job name", "lowercase letters"),
    ),
    ("long job name", _set("metadata.name", "a" * 49), "metadata.name", ("at most 48",)),
    ("bad namespace", _set("metadata.namespace", "NLP"), "metadata.namespace", ("namespace",)),
    (
        "spec not a mapping",
        _set("spec", ["minReplicas"]),
        "spec",
        ("must be a mapping of fields",),
    ),
]


@pytest.mark.parametrize(
    ("change", "path", "fragments"),
    [case[1:] for case in INVALID],
    ids=[case[0] for case in INVALID],
)
def test_each_problem_names_its_field_and_fix(
    change: Callable[[Document], None], path: str, fragments: tuple[str, ...]
) -> None:
    document = allreduce_document()
    change(document)
    with pytest.raises(TrainingJobError) as caught:
        load_training_job(document)
    problems = caught.value.problems
    assert [p.path for p in problems] == [path], str(caught.value)
    message = problems[0].message
    for fragment in fragments:
        assert fragment in message
    assert f"  {path}: {message}" in str(caught.value)


def test_pserver_range_is_checked_with_its_own_path() -> None:
    document = ps_document()
    document["spec"]["pserver"] = {"minReplicas": 3, "maxReplicas": 2}
    with pytest.raises(TrainingJobError) as caught:
        load_training_job(document)
    (problem,) = caught.value.problems
    assert problem.path == "spec.pserver.maxReplicas"
    assert "below spec.pserver.minReplicas (3)" in problem.message


def test_pserver_needs_its_own_range() -> None:
    document = ps_document()
    document["spec"]["pserver"] = {"maxReplicas": 2}
    with pytest.raises(TrainingJobError) as caught:
        load_training_job(document)
    assert [p.path for p in caught.value.problems] == ["spec.pserver.minReplicas"]


def test_all_field_problems_are_reported_at_once(document: Document) -> None:
    document["spec"]["minReplicas"] = 0
    document["spec"]["resources"]["cpu"] = "x"
    document["spec"]["framework"] = "jax"
    document["metadata"]["name"] = "Bad"
    with pytest.raises(TrainingJobError) as caught:
        load_training_job(document)
    paths = {p.path for p in caught.value.problems}
    assert paths == {"metadata.name", "spec.minReplicas", "spec.resources.cpu", "spec.framework"}
    assert "(4 problems)" in str(caught.value)
    assert "'Bad'" in str(caught.value)


def test_errors_are_value_errors_and_hide_pydantic(document: Document) -> None:
    document["spec"]["maxReplicas"] = 1
    with pytest.raises(ValueError) as caught:
        load_training_job(document)
    assert isinstance(caught.value, TrainingJobError)
    assert not isinstance(caught.value, ValidationError)
    assert caught.value.__cause__ is None
    assert caught.value.__suppress_context__


def test_python_construction_follows_the_same_rules() -> None:
    template = PodTemplate.model_validate({"spec": {"containers": [{"image": "x"}]}})
    spec = TrainingJobSpec(min_replicas=2, max_replicas=4, priority=5, template=template)
    assert spec.max_replicas == 4
    with pytest.raises(ValidationError, match="maxReplicas: 1 is below minReplicas"):
        TrainingJobSpec(min_replicas=2, max_replicas=1, template=template)


def test_documents_are_not_changed_by_loading(document: Document) -> None:
    before = copy.deepcopy(document)
    load_training_job(document)
    assert document == before
