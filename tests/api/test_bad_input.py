"""Whatever a user writes, the API's readers answer with a job or with ``TrainingJobError``.

Aspects tested, each a hypothesis property over generated input:
- a TrainingJob as YAML text (any text; a valid job with a value replaced by one of any
  kind, a key dropped or added, and its YAML damaged: ``benchmarks/bad_inputs.py``'s
  generator, seeded by hypothesis);
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
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from benchmarks.bad_inputs import as_text, mutated
from edl_scheduler.api import TrainingJobError, load_training_job
from edl_scheduler.api.policy import load_policy_config

from .conftest import allreduce_document

POLICY = {"base": "edl", "cooldownSeconds": 120, "preemption": "shrink-then-suspend"}
SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def bad_text(document: dict[str, Any]) -> st.SearchStrategy[str]:
    """``document`` mutated and written as (sometimes damaged) YAML, by the benchmark's
    generator from a seed hypothesis draws: the test and the benchmark make one kind of
    input."""
    return st.randoms(use_true_random=False).map(lambda r: as_text(mutated(document, r), r))


def _read_or_refuse(read: Any, given_input: Any) -> None:
    try:
        read(given_input)
    except TrainingJobError as error:
        assert str(error).strip()  # says what is wrong


@SETTINGS
@given(st.one_of(st.text(), bad_text(allreduce_document())))
def test_job_yaml_is_a_job_or_a_clean_refusal(text: str) -> None:
    _read_or_refuse(load_training_job, text)


@SETTINGS
@given(st.randoms(use_true_random=False).map(lambda r: mutated(allreduce_document(), r)))
def test_a_job_object_is_a_job_or_a_clean_refusal(document: Any) -> None:
    _read_or_refuse(load_training_job, document)


def test_policy_numbers_are_finite() -> None:
    for text in ("cooldownSeconds: .inf", "gainHorizonSeconds: 1e400", "maxLoad: .nan"):
        with pytest.raises(TrainingJobError, match="must be a finite number"):
            load_policy_config(text)


@SETTINGS
@given(st.one_of(st.text(), bad_text(POLICY)))
def test_a_policy_file_is_a_policy_or_a_clean_refusal(text: str) -> None:
    _read_or_refuse(load_policy_config, text)
