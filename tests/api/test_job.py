"""Reading and writing whole TrainingJob documents.

Aspects tested:
- the example jobs under manifests/examples load, and come back as written
  (YAML -> model -> YAML), including quantities and unmodelled pod-template fields;
- a full dump (with defaults) loads back to an equal job, and dumping is stable;
- YAML text input: single and multi-document streams, empty documents, syntax errors with
  their line, a non-mapping document, several documents given to the single loader;
- problems from several documents are reported together, tagged with their position;
- metadata fields we do not model (resourceVersion, ownerReferences) are kept;
- input limits: YAML aliases (an expansion bomb), nesting deeper than 64 levels and objects
  over 1.5 MiB are refused at once, as text and as mappings (walked without recursion);
- property: random valid specs round-trip through YAML unchanged.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from benchmarks.bad_inputs import alias_bomb
from edl_scheduler.api import (
    Strategy,
    TrainingJob,
    TrainingJobError,
    load_training_job,
    load_training_jobs_yaml,
)

from .conftest import EXAMPLES, allreduce_document, ps_document


def test_there_are_two_examples_an_allreduce_and_a_ps_job() -> None:
    strategies = {load_training_job(path.read_text()).spec.strategy for path in EXAMPLES}
    assert strategies == {Strategy.ALLREDUCE, Strategy.PS}


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_examples_come_back_as_written(path: Path) -> None:
    text = path.read_text()
    job = load_training_job(text)
    assert job.to_dict(as_written=True) == yaml.safe_load(text)
    assert yaml.safe_load(job.to_yaml(as_written=True)) == yaml.safe_load(text)


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_full_dump_loads_back_equal_and_is_stable(path: Path) -> None:
    job = load_training_job(path.read_text())
    again = load_training_job(job.to_yaml())
    assert again == job
    assert again.to_yaml() == job.to_yaml()


def test_example_values_the_planner_reads() -> None:
    jobs = {job.metadata.name: job for job in map(_load_path, EXAMPLES)}
    resnet = jobs["resnet50-imagenet"].spec
    assert (resnet.min_replicas, resnet.max_replicas) == (2, 8)
    assert (resnet.resources.gpu, resnet.resources.cpu_milli) == (1, 6000)
    assert resnet.resources.memory_bytes == 48 * 2**30
    assert resnet.template.spec.selects_node({"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"})
    ctr = jobs["ctr-wide-deep"].spec
    assert ctr.pserver is not None and ctr.pserver.resources.cpu_milli == 8000
    assert ctr.resources.cpu_milli == 3500


def _load_path(path: Path) -> TrainingJob:
    return load_training_job(path.read_text())


def test_multi_document_stream_skips_empty_documents() -> None:
    text = "---\n" + yaml.safe_dump(allreduce_document()) + "---\n---\n"
    text += yaml.safe_dump(ps_document())
    jobs = load_training_jobs_yaml(text)
    assert [job.spec.strategy for job in jobs] == [Strategy.ALLREDUCE, Strategy.PS]


def test_problems_of_every_document_are_reported_together() -> None:
    bad = allreduce_document()
    bad["spec"]["maxReplicas"] = 1
    worse = ps_document()
    del worse["spec"]["pserver"]
    text = "\n---\n".join(yaml.safe_dump(d) for d in (allreduce_document(), bad, worse))
    with pytest.raises(TrainingJobError) as caught:
        load_training_jobs_yaml(text)
    problems = caught.value.problems
    assert [(p.document, p.path) for p in problems] == [
        (2, "spec.maxReplicas"),
        (3, "spec.pserver"),
    ]
    assert "document 2: spec.maxReplicas: 1 is below spec.minReplicas (4)" in str(caught.value)


def test_yaml_syntax_error_gives_its_line() -> None:
    with pytest.raises(TrainingJobError) as caught:
        load_training_job("metadata:\n  name: [unclosed\nspec: {}\n")
    (problem,) = caught.value.problems
    assert problem.path.startswith("line ")
    assert "not valid YAML" in problem.message


@pytest.mark.parametrize("text", ["- a\n- b\n", "just text\n", "42\n"])
def test_document_must_be_a_mapping(text: str) -> None:
    with pytest.raises(TrainingJobError, match=r"\(document\): must be a mapping"):
        load_training_job(text)


def test_single_loader_refuses_several_documents() -> None:
    text = yaml.safe_dump(allreduce_document()) + "---\n" + yaml.safe_dump(ps_document())
    with pytest.raises(TrainingJobError, match="holds 2 YAML documents"):
        load_training_job(text)
    with pytest.raises(TrainingJobError, match=r"holds no YAML document \(it is empty\)"):
        load_training_job("")


@pytest.mark.parametrize(
    ("text", "said"),
    [
        (alias_bomb(9), "aliases (*name) are not accepted"),
        ("[" * 5000 + "]" * 5000, "nests deeper than 64 levels"),
        ("a: " + "b" * 1_600_000, "more than the 1572864 (1.5 MiB) one object may hold"),
    ],
)
def test_yaml_that_would_hang_or_exhaust_the_reader_is_refused(text: str, said: str) -> None:
    started = time.monotonic()
    with pytest.raises(TrainingJobError) as caught:
        load_training_job(text)
    assert said in str(caught.value)
    assert time.monotonic() - started < 5  # refused, not expanded


@pytest.mark.parametrize(
    "text",
    ["a: " + "9" * 5000, "? !!timestamp 2001-12-14\n: 1\n", "a: !!binary 'no base64!'"],
)
def test_values_the_reader_cannot_take_are_a_clean_refusal(text: str) -> None:
    with pytest.raises(TrainingJobError):
        load_training_job(text)


def test_a_mapping_too_deep_or_too_large_is_refused_without_recursion() -> None:
    deep: dict[str, Any] = {}
    node = deep
    for _ in range(100_000):
        node["a"] = {}
        node = node["a"]
    with pytest.raises(TrainingJobError, match="nests deeper than 64 levels"):
        load_training_job(deep)
    document = allreduce_document()
    document["metadata"]["annotations"] = {"big": "x" * 2_000_000}
    with pytest.raises(TrainingJobError, match=r"1\.5 MiB"):
        load_training_job(document)


def test_kubernetes_metadata_is_kept() -> None:
    document = allreduce_document()
    document["metadata"].update(
        {
            "uid": "0b6c1f9e",
            "resourceVersion": "123",
            "generation": 2,
            "creationTimestamp": "2024-05-01T12:00:00Z",
            "ownerReferences": [{"kind": "Workflow", "name": "w"}],
            "labels": {"team": "nlp"},
        }
    )
    job = load_training_job(document)
    assert job.metadata.uid == "0b6c1f9e"
    assert job.metadata.generation == 2
    assert job.key == "nlp/bert"
    assert job.to_dict(as_written=True)["metadata"] == document["metadata"]


def test_namespace_defaults_to_default() -> None:
    document = allreduce_document()
    del document["metadata"]["namespace"]
    assert load_training_job(document).metadata.namespace == "default"


# Random valid specs: every field drawn within its allowed range and combination.
_quantity = st.one_of(
    st.integers(0, 10**6),
    st.builds(
        lambda n, s: f"{n}{s}",
        st.integers(0, 4096),
        st.sampled_from(["", "m", "k", "M", "G", "Ki", "Mi", "Gi", "e3"]),
    ),
)
_resources = st.fixed_dictionaries(
    {},
    optional={"nvidia.com/gpu": st.integers(0, 8), "cpu": _quantity, "memory": _quantity},
)
_label = st.builds(
    str.__add__,
    st.sampled_from("abcxyz"),
    st.text(alphabet="abcz019", max_size=8),
)


@st.composite
def _documents(draw: st.DrawFn) -> dict[str, Any]:
    low = draw(st.integers(1, 64))
    high = draw(st.integers(low, 128))
    spec: dict[str, Any] = {
        "minReplicas": low,
        "maxReplicas": high,
        "resources": draw(_resources),
        "template": {
            "spec": {
                "nodeSelector": draw(st.dictionaries(_label, _label, max_size=2)),
                "containers": [{"name": "w", "image": draw(_label) + ":1"}],
            }
        },
    }
    priority = draw(st.sampled_from(["none", "value", "class"]))
    if priority == "value":
        spec["priority"] = draw(st.integers(-1000, 10**9))
    elif priority == "class":
        spec["priorityClassName"] = draw(_label)
    for key, strategy in (
        ("preemptible", st.booleans()),
        ("framework", st.sampled_from(["torch", "paddle", "none"])),
        ("suspend", st.booleans()),
        ("timeouts", st.fixed_dictionaries({}, optional={"joinSeconds": st.integers(1, 999)})),
        ("failurePolicy", st.fixed_dictionaries({"maxRestarts": st.integers(0, 9)})),
    ):
        if draw(st.booleans()):
            spec[key] = draw(strategy)
    if draw(st.booleans()):
        spec["strategy"] = "ps"
        ps_low = draw(st.integers(1, 4))
        spec["pserver"] = {
            "minReplicas": ps_low,
            "maxReplicas": draw(st.integers(ps_low, 8)),
            "resources": draw(_resources),
        }
    mode = draw(st.sampled_from(["fixedGlobalBatch", "scaleWithWorkers", "none"]))
    if mode == "fixedGlobalBatch":
        spec["batchPolicy"] = {"mode": mode, "globalBatchSize": draw(st.integers(high, 4096))}
    elif mode == "scaleWithWorkers":
        spec["batchPolicy"] = {
            "mode": mode,
            "lrRule": draw(st.sampled_from(["linear", "sqrt"])),
            "warmupSteps": draw(st.integers(0, 1000)),
            "momentumCompensation": draw(st.booleans()),
        }
    return {
        "apiVersion": "edl.dev/v1alpha1",
        "kind": "TrainingJob",
        "metadata": {"name": draw(_label), "namespace": draw(_label)},
        "spec": spec,
    }


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(document=_documents())
def test_random_valid_specs_round_trip(document: dict[str, Any]) -> None:
    job = load_training_job(yaml.safe_dump(document))
    assert job.to_dict(as_written=True) == document
    assert load_training_job(job.to_yaml()) == job
    assert job.spec.min_replicas <= job.spec.max_replicas
    assert job.spec.resources.cpu_milli >= 0
