"""Reading untrusted text and objects into plain data, within limits: the one place where
YAML is parsed for the API (TrainingJobs, policy files).

Why: a YAML reader follows aliases (nine nested ones in under a kilobyte expand to a billion
nodes), recurses into nesting, and reads whatever size it is given. So aliases are refused,
nesting stops at ``MAX_DEPTH``, and an object larger than ``MAX_OBJECT_BYTES`` (the API
server's own limit) is refused before it is read; an object that arrives parsed (from the
API server, a caller) is checked for the same depth and size without recursion.

What must stay true: every problem is a ``TrainingJobError`` naming where and the fix; no
input makes the reader raise anything else, recurse without bound or expand.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import yaml

from edl_scheduler.api.errors import Problem, TrainingJobError

__all__ = ["MAX_DEPTH", "MAX_OBJECT_BYTES", "read_yaml", "shape_problem"]

#: The most bytes a TrainingJob may take as written: what the API server's etcd keeps in
#: one object (1.5 MiB). A larger one is refused before it is parsed.
MAX_OBJECT_BYTES = 1_572_864
#: The deepest nesting of mappings and lists a TrainingJob may have (a pod template with
#: affinity nests about ten levels).
MAX_DEPTH = 64


class _YamlLoader(yaml.SafeLoader):
    """Safe YAML, except that timestamps stay strings for pydantic to check, aliases are
    refused (nine nested aliases in under a kilobyte expand to a billion nodes) and so is
    nesting deeper than ``MAX_DEPTH``."""

    _depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()  # type: ignore[no-untyped-call]
            raise yaml.composer.ComposerError(
                None,
                None,
                "aliases (*name) are not accepted: write the value out",
                event.start_mark,
            )
        if self._depth >= MAX_DEPTH:
            event = self.peek_event()  # type: ignore[no-untyped-call]
            raise yaml.composer.ComposerError(
                None, None, f"nests deeper than {MAX_DEPTH} levels: flatten it", event.start_mark
            )
        self._depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


_YamlLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}


def _too_large(size: int) -> TrainingJobError:
    return TrainingJobError(
        [
            Problem(
                "(document)",
                f"is {size} bytes, more than the {MAX_OBJECT_BYTES} (1.5 MiB) one object may "
                "hold: move large data out of the job (a ConfigMap, a volume)",
            )
        ],
        "TrainingJob",
    )


def read_yaml(text: str) -> list[Any]:
    """Every document of ``text`` (None for an empty one), within the limits above; any
    problem raises ``TrainingJobError`` with the line and the fix."""
    size = len(text.encode("utf-8", "replace"))
    if size > MAX_OBJECT_BYTES:
        raise _too_large(size)
    try:
        return list(yaml.load_all(text, Loader=_YamlLoader))
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "(document)"
        problem = getattr(error, "problem", None) or str(error)
        raise TrainingJobError(
            [Problem(where, f"is not valid YAML ({problem}): fix the syntax")], "YAML"
        ) from None
    except (ValueError, TypeError, OverflowError, RecursionError) as error:
        # What PyYAML's constructors let through: an integer of thousands of digits, a
        # !!binary that is not base64, a key that cannot be hashed, ...
        raise TrainingJobError(
            [Problem("(document)", f"holds a value YAML cannot read ({error}): write it plainly")],
            "YAML",
        ) from None


def shape_problem(data: object) -> Problem | None:
    """Nesting deeper than ``MAX_DEPTH``, or more than ``MAX_OBJECT_BYTES`` (about, as JSON:
    every key and scalar's text and two bytes of punctuation each), of an already parsed
    object (the API server's, a caller's mapping); walked without recursion, so no depth
    can exhaust the stack, and without serializing it, so no key or value can fail to."""
    stack: list[tuple[object, int]] = [(data, 1)]
    size = 0
    while stack:
        node, depth = stack.pop()
        if depth > MAX_DEPTH:
            return Problem("(document)", f"nests deeper than {MAX_DEPTH} levels: flatten it")
        if isinstance(node, Mapping):
            for key, value in node.items():
                size += _text_size(key) + 2
                stack.append((value, depth + 1))
        elif isinstance(node, list | tuple):
            stack.extend((v, depth + 1) for v in node)
            size += 2 * len(node)
        else:
            size += _text_size(node)
        if size > MAX_OBJECT_BYTES:
            return _too_large(size).problems[0]
    return None


def _text_size(value: object) -> int:
    if isinstance(value, str):
        return len(value.encode("utf-8", "replace"))
    if isinstance(value, bytes):
        return len(value)
    if isinstance(value, int) and value.bit_length() > 64:
        return value.bit_length() // 3  # (its digits, without writing them out)
    return len(repr(value))
