"""Whatever a user writes, the API's readers answer with a job or with ``TrainingJobError``.

Aspects tested, each a hypothesis property over generated input:
- a TrainingJob as YAML text (any text; a valid job with a value replaced by one of any
  kind, a key dropped or added, and its YAML damaged);
- a TrainingJob as a parsed object (what the controller reads from the API server), the
  same mutations without the text;
- a policy file, the same way, and its numbers finite;
- no input raises anything else (a traceback), and none is read for long (aliases,
  nesting and size are refused before they are expanded: ``api/reading.py``).
(``benchmarks/bad_inputs.py`` runs 10,000 such inputs per entry point and counts them.)
"""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from benchmarks.bad_inputs import value_paths
from edl_scheduler.api import TrainingJobError, load_training_job
from edl_scheduler.api.policy import load_policy_config

from .conftest import allreduce_document

POLICY = {"base": "edl", "cooldownSeconds": 120, "preemption": "shrink-then-suspend"}
SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

leaves = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.sampled_from([2**63, 10**40, -(10**30)]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=50),
    st.sampled_from(["1e9", "lots", "500m", "16Gi", "", "2024-13-45T99:99:99Z"]),
)
values = st.recursive(
    leaves,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=12,
)


@st.composite
def mutated(draw: st.DrawFn, document: dict[str, Any]) -> Any:
    """``document`` with one to three values replaced, keys dropped or keys added."""
    doc: Any = yaml.safe_load(yaml.safe_dump(document))
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(value_paths(doc)))
        if not path:
            doc = draw(values)
            continue
        parent = doc
        for key in path[:-1]:
            parent = parent[key]
        how = draw(st.sampled_from(["replace", "drop", "add"]))
        if how == "drop" and isinstance(parent, dict):
            del parent[path[-1]]
        elif how == "add" and isinstance(parent, dict):
            parent[draw(st.text(min_size=1, max_size=12))] = draw(values)
        else:
            parent[path[-1]] = draw(values)
    return doc


@st.composite
def damaged_text(draw: st.DrawFn, value: Any) -> str:
    """``value`` as YAML, then cut, with a stray character, or with an alias bomb."""
    text = yaml.safe_dump(value, allow_unicode=True)
    damage = draw(st.sampled_from(["none", "cut", "insert", "aliases"]))
    if damage == "cut":
        return text[: draw(st.integers(0, len(text)))]
    if damage == "insert":
        at = draw(st.integers(0, len(text)))
        return text[:at] + draw(st.sampled_from(list("[]{}&*!|>%@`:'\"\t\\-?,#"))) + text[at:]
    if damage == "aliases":
        levels = draw(st.integers(2, 10))
        bomb = ["a0: &a0 [x, x, x, x, x, x, x, x, x]"]
        bomb += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, levels)]
        return text + "\n".join(bomb) + "\n"
    return text


def _read_or_refuse(read: Any, given_input: Any) -> None:
    try:
        read(given_input)
    except TrainingJobError as error:
        assert str(error).strip()  # says what is wrong


@SETTINGS
@given(st.one_of(st.text(), mutated(allreduce_document()).flatmap(damaged_text)))
def test_job_yaml_is_a_job_or_a_clean_refusal(text: str) -> None:
    _read_or_refuse(load_training_job, text)


@SETTINGS
@given(mutated(allreduce_document()))
def test_a_job_object_is_a_job_or_a_clean_refusal(document: Any) -> None:
    _read_or_refuse(load_training_job, document)


def test_policy_numbers_are_finite() -> None:
    for text in ("cooldownSeconds: .inf", "gainHorizonSeconds: 1e400", "maxLoad: .nan"):
        with pytest.raises(TrainingJobError, match="must be a finite number"):
            load_policy_config(text)


@SETTINGS
@given(st.one_of(st.text(), mutated(POLICY).flatmap(damaged_text)))
def test_a_policy_file_is_a_policy_or_a_clean_refusal(text: str) -> None:
    _read_or_refuse(load_policy_config, text)
