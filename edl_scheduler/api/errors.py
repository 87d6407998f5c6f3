"""Turning validation failures into messages a person can act on.

Why this exists: a researcher submitting a job should learn from one error which fields are
wrong and what to write instead, in the names they wrote (camelCase, `spec.minReplicas`),
not in pydantic's vocabulary. Every public loader raises `TrainingJobError` and nothing else;
pydantic's `ValidationError` never leaves this package.

What must stay true:
- Each problem is `<path>: <problem and fix>`, where path is the full camelCase path from
  the document's root (`spec.template.spec.containers[0].image`).
- Problems raised through `meta.field_problem` get their sibling references spelled out in
  full (`{at}minReplicas` becomes `spec.minReplicas`).
- Input values are quoted in messages, truncated, never dumped whole.
"""

from __future__ import annotations

import difflib
import inspect
import re
import types
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Final, Union, get_args, get_origin

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import ErrorDetails, ValidationError

from edl_scheduler.api.meta import FIELD_PROBLEM

__all__ = ["Problem", "TrainingJobError", "problems_from"]

_IDENTIFIER: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_TIME_EXAMPLE: Final = "an RFC 3339 time with a zone, such as 2024-05-01T12:00:00Z"


@dataclass(frozen=True, slots=True)
class Problem:
    """One thing wrong with a document: where, and what to do about it."""

    path: str
    message: str
    document: int | None = None
    """The 1-based position in a multi-document YAML stream, when there is one."""

    def __str__(self) -> str:
        where = f"document {self.document}: " if self.document is not None else ""
        return f"{where}{self.path}: {self.message}"


class TrainingJobError(ValueError):
    """A TrainingJob could not be read; `problems` lists every problem found."""

    def __init__(self, problems: Sequence[Problem], subject: str = "TrainingJob") -> None:
        self.problems: tuple[Problem, ...] = tuple(problems)
        count = len(self.problems)
        lines = "\n".join(f"  {problem}" for problem in self.problems)
        noun = "problem" if count == 1 else "problems"
        super().__init__(f"invalid {subject} ({count} {noun}):\n{lines}")


def join_path(loc: Iterable[int | str]) -> str:
    """`("spec", "template", "spec", "containers", 0)` -> `spec.template.spec.containers[0]`."""
    path = ""
    for item in loc:
        if isinstance(item, int):
            path += f"[{item}]"
        elif _IDENTIFIER.fullmatch(item):
            path += f".{item}" if path else item
        else:
            path += f'["{item}"]'
    return path


def problems_from(
    error: ValidationError, root: type[BaseModel], document: int | None = None
) -> list[Problem]:
    """The problems in a pydantic error raised while validating `root`."""
    return [_problem(detail, root, document) for detail in error.errors(include_url=False)]


def _problem(detail: ErrorDetails, root: type[BaseModel], document: int | None) -> Problem:
    loc = tuple(detail["loc"])
    kind = detail["type"]
    ctx: dict[str, Any] = dict(detail.get("ctx") or {})
    if kind == FIELD_PROBLEM:
        parent = join_path(loc)
        at = f"{parent}." if parent else ""
        message = str(ctx["template"]).format_map({**ctx, "at": at})
        return Problem(f"{at}{ctx['field']}", message, document)
    path = join_path(loc) or "(document)"
    return Problem(path, _message(kind, ctx, detail, loc, root), document)


def _shown(value: object) -> str:
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _message(
    kind: str, ctx: dict[str, Any], detail: ErrorDetails, loc: tuple[int | str, ...], root: type
) -> str:
    got = _shown(detail.get("input"))
    match kind:
        case "missing":
            info = _field_at(root, loc)
            about = f" ({_lower_first(info.description)})" if info and info.description else ""
            return f"is required{about}: add it"
        case "extra_forbidden":
            return _unknown_field(root, loc)
        case "value_error" | "assertion_error":
            return str(ctx.get("error", detail["msg"]))
        case "greater_than_equal":
            return f"must be at least {ctx['ge']} (got {got}): use {ctx['ge']} or more"
        case "greater_than":
            return f"must be more than {ctx['gt']} (got {got}): use a larger value"
        case "less_than_equal":
            return f"must be at most {ctx['le']} (got {got}): use {ctx['le']} or less"
        case "less_than":
            return f"must be less than {ctx['lt']} (got {got}): use a smaller value"
        case "int_type" | "int_parsing" | "int_from_float":
            return f"must be a whole number (got {got}): write it without quotes or decimals"
        case "float_type" | "float_parsing":
            return f"must be a number (got {got})"
        case "finite_number":
            return f"must be a finite number (got {got}): write a number of seconds or units"
        case "bool_type" | "bool_parsing":
            return f"must be true or false (got {got})"
        case "string_type":
            return f"must be text (got {got}): quote it"
        case "string_too_short":
            return "must not be empty: give a value or remove the field"
        case "string_too_long":
            return f"is longer than {ctx['max_length']} characters: shorten it"
        case "string_pattern_mismatch":
            return f"has the wrong form (got {got}): it must match {ctx['pattern']}"
        case "too_short":
            return f"needs at least {ctx['min_length']} item(s): add them"
        case "enum":
            return f"must be one of {ctx['expected']} (got {got})"
        case "dict_type" | "model_type" | "model_attributes_type":
            return f"must be a mapping of fields (got {got})"
        case "list_type":
            return f"must be a list (got {got}): write it as a YAML sequence"
        case "timezone_aware":
            return f"has no time zone (got {got}): write {_TIME_EXAMPLE}"
        case _ if kind.startswith(("datetime", "date", "time")):
            return f"is not a time (got {got}): write {_TIME_EXAMPLE}"
        case _:
            return str(detail["msg"])


def _lower_first(text: str) -> str:
    text = text.strip().rstrip(".")
    return text[:1].lower() + text[1:]


def _unknown_field(root: type, loc: tuple[int | str, ...]) -> str:
    name = str(loc[-1]) if loc else ""
    model = _model_at(root, loc[:-1])
    if model is None:
        return "is not a known field: remove it"
    known = sorted(_aliases(model))
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
    if close:
        return f"is not a known field: did you mean {close[0]}?"
    return f"is not a known field: remove it (the fields here are {', '.join(known)})"


def _aliases(model: type[BaseModel]) -> dict[str, FieldInfo]:
    return {info.alias or name: info for name, info in model.model_fields.items()}


def _model_in(annotation: Any) -> type[BaseModel] | None:
    """The model inside an annotation such as `Model`, `Model | None`, `list[Model]`."""
    if inspect.isclass(annotation) and issubclass(annotation, BaseModel):
        return annotation
    if get_origin(annotation) in (list, Union, types.UnionType):
        for arg in get_args(annotation):
            found = _model_in(arg)
            if found is not None:
                return found
    return None


def _model_at(root: type, loc: Sequence[int | str]) -> type[BaseModel] | None:
    model = _model_in(root)
    for item in loc:
        if model is None:
            return None
        if isinstance(item, int):
            continue  # a list index: the list's model is already in hand
        info = _aliases(model).get(item) or model.model_fields.get(item)
        model = _model_in(info.annotation) if info else None
    return model


def _field_at(root: type, loc: Sequence[int | str]) -> FieldInfo | None:
    if not loc or isinstance(loc[-1], int):
        return None
    model = _model_at(root, loc[:-1])
    if model is None:
        return None
    return _aliases(model).get(loc[-1]) or model.model_fields.get(loc[-1])
