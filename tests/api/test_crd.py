"""The generated CustomResourceDefinition.

Aspects tested:
- the committed manifests/crd file is exactly what the models generate (so a model change
  without `python -m edl_scheduler.api.crd` fails here), and `--check` exits 1 with a diff
  when it is stale, 0 when it is fresh;
- a small structural-schema checker (rules of apiextensions.k8s.io/v1 as Kubernetes 1.20
  applies them) passes the generated schema, and fails on each rule it enforces;
- `x-kubernetes-preserve-unknown-fields` appears exactly on the intended open blocks;
- nothing the examples or a full status write would be pruned by the API server;
- every spec and status field has a description (what `kubectl explain` shows);
- names, scope, subresources (status; scale on spec.maxReplicas / status.replicas) and
  printer columns, whose paths must exist in the schema with the declared types;
- the schema converter: bounds, enums, nullable, and refusal of shapes it cannot express.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import pytest
import yaml
from pydantic import BaseModel, Field

from edl_scheduler.api.crd import CRD_PATH, crd_manifest, main, render_crd
from edl_scheduler.api.schema import SchemaError, structural_schema

from .conftest import EXAMPLES, REPO_ROOT, STATUS, allreduce_document

Schema = dict[str, Any]
PRESERVE = "x-kubernetes-preserve-unknown-fields"
INT_OR_STRING = "x-kubernetes-int-or-string"
ALLOWED_KEYS = {
    "type",
    "format",
    "description",
    "properties",
    "items",
    "additionalProperties",
    "required",
    "enum",
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "minLength",
    "maxLength",
    "pattern",
    "minItems",
    "maxItems",
    "nullable",
    "default",
    "anyOf",
    PRESERVE,
    INT_OR_STRING,
}
TYPES = {"object", "array", "string", "integer", "number", "boolean"}
INT_OR_STRING_ANY_OF = [{"type": "integer"}, {"type": "string"}]
ENUM_TYPES: dict[str, type | tuple[type, ...]] = {
    "string": str,
    "integer": int,
    "number": (int, float),
}


def structural_problems(schema: Schema) -> tuple[list[str], set[str]]:
    """Check a root openAPIV3Schema; return (problems, paths marked preserve-unknown)."""
    problems: list[str] = []
    preserved: set[str] = set()
    if schema.get("type") != "object":
        problems.append("(root): must be type object")
    metadata = schema.get("properties", {}).get("metadata")
    if metadata is not None and metadata != {"type": "object"}:
        problems.append("metadata: may only be {type: object}")
    for name, child in schema.get("properties", {}).items():
        if name != "metadata":
            _check(child, name, False, problems, preserved)
    return problems, preserved


def _check(node: Any, path: str, open_: bool, problems: list[str], kept: set[str]) -> None:
    if not isinstance(node, dict):
        problems.append(f"{path}: a schema must be a mapping")
        return
    for key in node.keys() - ALLOWED_KEYS:
        problems.append(f"{path}: {key} is not allowed")
    kind = node.get("type")
    if node.get(INT_OR_STRING):
        if "type" in node or node.get("anyOf", INT_OR_STRING_ANY_OF) != INT_OR_STRING_ANY_OF:
            problems.append(f"{path}: int-or-string must have no type and the standard anyOf")
    elif "anyOf" in node:
        problems.append(f"{path}: anyOf outside int-or-string")
    elif kind not in TYPES:
        problems.append(f"{path}: missing or unknown type {kind!r}")
    for flag in ("nullable", PRESERVE, INT_OR_STRING, "exclusiveMinimum", "exclusiveMaximum"):
        if flag in node and not isinstance(node[flag], bool):
            problems.append(f"{path}: {flag} must be a boolean")
    if "default" in node and (open_ or node["default"] is None):
        problems.append(f"{path}: default inside a preserve-unknown subtree, or null")
    if node.get(PRESERVE):
        kept.add(path)
        open_ = True
    for value in node.get("enum", []):
        expected = ENUM_TYPES.get(kind or "")
        if expected is None or not isinstance(value, expected):
            problems.append(f"{path}: enum value {value!r} does not fit type {kind}")
    properties = node.get("properties")
    extra = node.get("additionalProperties")
    if kind == "object":
        if properties is not None and extra is not None:
            problems.append(f"{path}: properties and additionalProperties together")
        if properties is None and not isinstance(extra, dict) and not node.get(PRESERVE):
            problems.append(f"{path}: an object with no properties must preserve unknown fields")
        for name in node.get("required", []):
            if name not in (properties or {}):
                problems.append(f"{path}: required {name} is not a property")
        for name, child in (properties or {}).items():
            _check(child, f"{path}.{name}", open_, problems, kept)
        if extra is not None:
            _check(extra, f"{path}{{}}", open_, problems, kept)
    elif properties is not None or extra is not None or "required" in node:
        problems.append(f"{path}: properties on a {kind}")
    if kind == "array":
        _check(node.get("items"), f"{path}[]", open_, problems, kept)
    elif "items" in node:
        problems.append(f"{path}: items on a {kind}")


@functools.cache
def _manifest() -> Schema:
    return crd_manifest()


def _root_schema() -> Schema:
    schema: Schema = _manifest()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema


TEMPLATE = "spec.template"
REQUIRED_AFFINITY = (
    f"{TEMPLATE}.spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
)
INTENDED_OPEN = {
    TEMPLATE,
    f"{TEMPLATE}.metadata",
    f"{TEMPLATE}.spec",
    f"{TEMPLATE}.spec.containers[]",
    f"{TEMPLATE}.spec.affinity",
    f"{TEMPLATE}.spec.affinity.nodeAffinity",
    REQUIRED_AFFINITY,
    f"{REQUIRED_AFFINITY}.nodeSelectorTerms[]",
    "status.progress",
}


def test_committed_crd_is_the_generated_one() -> None:
    committed = (REPO_ROOT / CRD_PATH).read_text(encoding="utf-8")
    assert committed == render_crd(), "the CRD is stale: run python -m edl_scheduler.api.crd"


def test_check_flag_fails_with_a_diff_on_a_stale_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    output = tmp_path / "crd.yaml"
    output.write_text(render_crd().replace("minimum: 1\n", "minimum: 2\n", 1))
    assert main(["--check", "--output", str(output)]) == 1
    captured = capsys.readouterr()
    assert "-" in captured.out and "+" in captured.out and "minimum" in captured.out
    assert "stale" in captured.err
    assert main(["--output", str(output)]) == 0
    assert output.read_text() == render_crd()
    assert main(["--check", "--output", str(output)]) == 0


def test_check_flag_fails_when_the_file_is_missing(tmp_path: Path) -> None:
    assert main(["--check", "--output", str(tmp_path / "absent.yaml")]) == 1


def test_generation_is_deterministic() -> None:
    assert render_crd() == render_crd()
    assert yaml.safe_load(render_crd()) == crd_manifest()


def test_generated_schema_is_structural() -> None:
    problems, _ = structural_problems(_root_schema())
    assert problems == []


def test_preserve_unknown_fields_only_on_open_blocks() -> None:
    _, preserved = structural_problems(_root_schema())
    assert preserved == INTENDED_OPEN


def test_no_forbidden_keys_anywhere() -> None:
    text = render_crd()
    for word in ("$ref", "$defs", "allOf", "oneOf", "title:", "const:", "x-kubernetes-validations"):
        assert word not in text


BAD_SCHEMAS: list[tuple[str, Schema, str]] = [
    ("ref", {"$ref": "#/$defs/X"}, "$ref is not allowed"),
    ("no type", {"description": "x"}, "missing or unknown type"),
    ("anyOf", {"anyOf": [{"type": "string"}, {"type": "null"}]}, "anyOf outside"),
    ("allOf", {"type": "object", "allOf": [], PRESERVE: True}, "allOf is not allowed"),
    (
        "both",
        {"type": "object", "properties": {}, "additionalProperties": {"type": "string"}},
        "together",
    ),
    ("bare object", {"type": "object"}, "must preserve unknown fields"),
    (
        "default in open",
        {"type": "object", PRESERVE: True, "properties": {"a": {"type": "string", "default": "x"}}},
        "default inside",
    ),
    ("null default", {"type": "string", "default": None}, "or null"),
    ("required", {"type": "object", "properties": {}, "required": ["a"]}, "required a"),
    ("items", {"type": "string", "items": {"type": "string"}}, "items on a string"),
    ("enum", {"type": "integer", "enum": ["a"]}, "does not fit"),
    ("exclusive", {"type": "number", "exclusiveMinimum": 0}, "must be a boolean"),
    (
        "int-or-string with type",
        {"type": "string", INT_OR_STRING: True, "anyOf": INT_OR_STRING_ANY_OF},
        "int-or-string",
    ),
]


@pytest.mark.parametrize(
    ("node", "fragment"), [c[1:] for c in BAD_SCHEMAS], ids=[c[0] for c in BAD_SCHEMAS]
)
def test_checker_catches_each_rule(node: Schema, fragment: str) -> None:
    problems, _ = structural_problems({"type": "object", "properties": {"spec": node}})
    assert any(fragment in problem for problem in problems), problems


def test_checker_refuses_restricted_metadata() -> None:
    schema = {"type": "object", "properties": {"metadata": {"type": "object", "required": ["x"]}}}
    assert structural_problems(schema)[0] == ["metadata: may only be {type: object}"]


def _pruned(value: Any, schema: Schema, path: str) -> Iterator[str]:
    """Paths in `value` that the API server would prune under `schema`."""
    if schema.get(PRESERVE) and "properties" not in schema:
        return
    if isinstance(value, dict):
        properties = schema.get("properties")
        for key, child in value.items():
            if properties is not None and key in properties:
                yield from _pruned(child, properties[key], f"{path}.{key}")
            elif isinstance(schema.get("additionalProperties"), dict):
                yield from _pruned(child, schema["additionalProperties"], f"{path}.{key}")
            elif not schema.get(PRESERVE):
                yield f"{path}.{key}"
    elif isinstance(value, list):
        for index, child in enumerate(value):
            yield from _pruned(child, schema.get("items", {}), f"{path}[{index}]")


def _documents_to_store() -> list[Any]:
    documents = [yaml.safe_load(path.read_text()) for path in EXAMPLES]
    full = allreduce_document()
    full["status"] = STATUS
    return [*documents, full]


@pytest.mark.parametrize("document", _documents_to_store())
def test_nothing_users_or_the_controller_write_is_pruned(document: Any) -> None:
    document = {key: value for key, value in document.items() if key != "metadata"}
    assert list(_pruned(document, _root_schema(), "")) == []


def test_pruning_check_sees_unknown_fields() -> None:
    document = {"spec": {"minReplicas": 1, "mystery": 2}}
    assert list(_pruned(document, _root_schema(), "")) == [".spec.mystery"]


def test_names_scope_and_version() -> None:
    crd = _manifest()
    assert crd["apiVersion"] == "apiextensions.k8s.io/v1"
    assert crd["metadata"]["name"] == "trainingjobs.edl.dev"
    spec = crd["spec"]
    assert spec["group"] == "edl.dev"
    assert spec["scope"] == "Namespaced"
    names = spec["names"]
    assert (names["kind"], names["plural"], names["singular"]) == (
        "TrainingJob",
        "trainingjobs",
        "trainingjob",
    )
    assert names["shortNames"] == ["tj"]
    (version,) = spec["versions"]
    assert (version["name"], version["served"], version["storage"]) == ("v1alpha1", True, True)


def _schema_at(json_path: str) -> Schema:
    node = _root_schema()
    for part in json_path.strip(".").split("."):
        node = node["properties"][part]
    return node


def test_scale_subresource_points_at_max_and_current_replicas() -> None:
    subresources = _manifest()["spec"]["versions"][0]["subresources"]
    assert subresources["status"] == {}
    scale = subresources["scale"]
    assert scale["specReplicasPath"] == ".spec.maxReplicas"
    assert scale["statusReplicasPath"] == ".status.replicas"
    assert _schema_at(scale["specReplicasPath"])["type"] == "integer"
    assert _schema_at(scale["statusReplicasPath"])["type"] == "integer"
    assert _schema_at(scale["labelSelectorPath"])["type"] == "string"


def test_printer_columns_exist_in_the_schema_with_their_types() -> None:
    columns = _manifest()["spec"]["versions"][0]["additionalPrinterColumns"]
    names = [column["name"] for column in columns]
    assert names[:6] == ["Priority", "Min", "Max", "Replicas", "Phase", "Age"]
    for column in columns:
        if column["jsonPath"] == ".metadata.creationTimestamp":
            assert column["type"] == "date"
            continue
        assert _schema_at(column["jsonPath"])["type"] == column["type"], column


def test_quantities_are_int_or_string_with_the_quantity_pattern() -> None:
    cpu = _schema_at(".spec.resources.cpu")
    assert cpu[INT_OR_STRING] is True
    assert cpu["anyOf"] == INT_OR_STRING_ANY_OF
    assert cpu["pattern"].startswith("^")


def test_bounds_and_enums_are_carried_over() -> None:
    assert _schema_at(".spec.minReplicas")["minimum"] == 1
    assert _schema_at(".spec.priority")["maximum"] == 1_000_000_000
    assert _schema_at(".spec.priority")["nullable"] is True
    assert _schema_at(".spec.framework")["enum"] == ["torch", "paddle", "none"]
    assert _schema_at(".status.phase")["enum"][0] == "Pending"
    assert _schema_at(".spec.timeouts.joinSeconds")["default"] == 60
    containers = _schema_at(".spec.template.spec.containers")
    assert containers["minItems"] == 1
    assert set(_schema_at(".spec")["required"]) == {"minReplicas", "maxReplicas", "template"}


class _Toy(BaseModel):
    positive: float = Field(gt=0)
    count: int = Field(gt=0, lt=10)
    mode: Literal["a"] = "a"
    table: dict[str, int] = Field(default_factory=dict)


def test_converter_rewrites_exclusive_bounds_and_constants() -> None:
    schema = structural_schema(_Toy)
    properties = schema["properties"]
    assert properties["positive"] == {"type": "number", "minimum": 0, "exclusiveMinimum": True}
    assert properties["count"] == {"type": "integer", "minimum": 1, "maximum": 9}
    assert properties["mode"]["enum"] == ["a"]
    assert "const" not in properties["mode"]
    assert properties["table"] == {"type": "object", "additionalProperties": {"type": "integer"}}


class _Union(BaseModel):
    either: int | str


class _Untyped(BaseModel):
    anything: Any


@pytest.mark.parametrize(("model", "fragment"), [(_Union, "union of 2"), (_Untyped, "no type")])
def test_converter_refuses_what_kubernetes_cannot_express(
    model: type[BaseModel], fragment: str
) -> None:
    with pytest.raises(SchemaError, match=fragment):
        structural_schema(model)


def _properties(node: Schema, path: str) -> Iterator[tuple[str, Schema]]:
    for name, child in node.get("properties", {}).items():
        yield f"{path}.{name}", child
        yield from _properties(child, f"{path}.{name}")
    if isinstance(node.get("items"), dict):
        yield from _properties(node["items"], f"{path}[]")


def test_every_spec_and_status_field_is_described_for_kubectl_explain() -> None:
    root = _root_schema()["properties"]
    undescribed = [
        path
        for part in ("spec", "status")
        for path, node in _properties(root[part], part)
        if not node.get("description")
    ]
    assert undescribed == []
