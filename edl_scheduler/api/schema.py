"""From pydantic's JSON Schema to a Kubernetes structural OpenAPI v3 schema.

Why this exists: the CRD's schema must say what the models say, or the API server and the
controller would disagree about which jobs are valid. Writing it by hand would drift, so it
is derived: pydantic produces JSON Schema (draft 2020-12), and this module rewrites it into
the subset Kubernetes calls *structural*, as the API server of Kubernetes 1.20 checks it.

What must stay true (each rule is checked by `tests/api/test_crd.py`):
- No `$ref`, `$defs`, `allOf`, `oneOf`, `not`, `const` or `title`; `anyOf` appears only in
  the form Kubernetes prescribes for `x-kubernetes-int-or-string` (resource quantities).
- Every node has a `type`, except int-or-string nodes; `Optional[X]` becomes `X` with
  `nullable: true`.
- Open blocks (models that keep unknown fields, `dict[str, Any]`) become
  `x-kubernetes-preserve-unknown-fields: true`; closed models list their properties and are
  pruned by the API server; `additionalProperties` never sits beside `properties`.
- `default` appears only as a non-null scalar and never inside a preserve-unknown subtree;
  never as the empty string, which the 1.20 API server's validator takes for null and
  refuses on a non-nullable string (the models' own default still fills it in; the real
  server checks this rule, in tests/kube).
- Bounds (`minimum`, `maximum`, lengths, patterns, `minItems`) are carried over; JSON
  Schema's numeric `exclusiveMinimum` becomes OpenAPI v3's boolean form.
- No CEL (`x-kubernetes-validations`): cross-field rules are enforced in Python.
"""

from __future__ import annotations

import copy
from typing import Any, Final

from pydantic import BaseModel

__all__ = ["SchemaError", "structural_schema"]

Schema = dict[str, Any]

_DROPPED: Final = frozenset({"title", "examples", "readOnly", "writeOnly", "$schema"})
_FORBIDDEN: Final = frozenset({"allOf", "oneOf", "not", "discriminator", "if", "then", "else"})
_PRESERVE: Final = "x-kubernetes-preserve-unknown-fields"
_INT_OR_STRING: Final = "x-kubernetes-int-or-string"
_REF_PREFIX: Final = "#/$defs/"


class SchemaError(ValueError):
    """A model uses a shape that a structural schema cannot express."""


def structural_schema(model: type[BaseModel]) -> Schema:
    """The structural OpenAPI v3 schema of `model`, as it is read from YAML (by alias)."""
    raw = model.model_json_schema(by_alias=True, mode="validation")
    definitions: dict[str, Schema] = raw.pop("$defs", {})
    return _Converter(definitions).convert(raw, path=model.__name__, open_=False)


class _Converter:
    def __init__(self, definitions: dict[str, Schema]) -> None:
        self._definitions = definitions

    def convert(self, node: Schema, path: str, open_: bool) -> Schema:
        node = self._inline(node, path)
        for key in _FORBIDDEN & node.keys():
            raise SchemaError(f"{path}: {key!r} cannot be expressed in a structural schema")
        result: Schema = {k: copy.deepcopy(v) for k, v in node.items() if k not in _DROPPED}
        if "const" in result:
            result["enum"] = [result.pop("const")]
        _exclusive_bounds(result)
        if result.get("type") == "object" or "properties" in result:
            open_ = self._object(result, path, open_)
        if "items" in result:
            result["items"] = self.convert(result["items"], f"{path}[]", open_)
        if "anyOf" in result:
            result["anyOf"] = [self._int_or_string_member(m, path) for m in result["anyOf"]]
        _keep_default_if_allowed(result, open_)
        if "type" not in result and not result.get(_INT_OR_STRING):
            raise SchemaError(f"{path}: no type could be derived; give the field a concrete type")
        return result

    def _inline(self, node: Schema, path: str) -> Schema:
        """Resolve `$ref`, single-member `allOf`, and `anyOf` with null, into one node."""
        node = dict(node)
        while True:
            if "$ref" in node:
                ref = node.pop("$ref")
                if not ref.startswith(_REF_PREFIX):
                    raise SchemaError(f"{path}: unexpected reference {ref!r}")
                target = self._definitions[ref.removeprefix(_REF_PREFIX)]
                node = {**target, **node}  # the field's own description and default win
            elif "allOf" in node and len(node["allOf"]) == 1:
                (member,) = node.pop("allOf")
                node = {**member, **node}
            elif "anyOf" in node and not node.get(_INT_OR_STRING):
                members: list[Schema] = node.pop("anyOf")
                concrete = [m for m in members if m.get("type") != "null"]
                if len(concrete) < len(members):
                    node["nullable"] = True
                if len(concrete) != 1:
                    raise SchemaError(
                        f"{path}: a union of {len(concrete)} types cannot be expressed in a "
                        "structural schema; use one type (or a quantity)"
                    )
                node = {**concrete[0], **node}
            else:
                return node

    def _object(self, result: Schema, path: str, open_: bool) -> bool:
        """Rewrite an object node in place; return whether its subtree is open."""
        result["type"] = "object"
        extra = result.pop("additionalProperties", None)
        properties: dict[str, Schema] | None = result.get("properties")
        if properties is None and isinstance(extra, dict):
            result["additionalProperties"] = self.convert(extra, f"{path}{{}}", open_)
            return open_
        if properties is None or extra is True:
            result[_PRESERVE] = True
            open_ = True
        if properties is not None:
            result["properties"] = {
                name: self.convert(child, f"{path}.{name}", open_)
                for name, child in properties.items()
            }
        return open_

    @staticmethod
    def _int_or_string_member(member: Schema, path: str) -> Schema:
        if member not in ({"type": "integer"}, {"type": "string"}):
            raise SchemaError(f"{path}: anyOf is allowed only for int-or-string quantities")
        return dict(member)


def _exclusive_bounds(result: Schema) -> None:
    for exclusive, inclusive, step in (
        ("exclusiveMinimum", "minimum", 1),
        ("exclusiveMaximum", "maximum", -1),
    ):
        bound = result.get(exclusive)
        if isinstance(bound, bool) or bound is None:
            continue
        if result.get("type") == "integer":
            del result[exclusive]
            result[inclusive] = bound + step
        else:
            result[inclusive] = bound
            result[exclusive] = True


def _keep_default_if_allowed(result: Schema, open_: bool) -> None:
    if "default" not in result:
        return
    value = result["default"]
    if open_ or value is None or value == "" or isinstance(value, dict | list):
        del result["default"]
