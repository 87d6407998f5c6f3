"""The TrainingJob status and its phase machine.

Aspects tested:
- a full status round-trips through YAML with RFC 3339 times and the `from`/`to` aliases,
  the batch of each throughput sample and the batch in use;
- times without a zone are rejected with a fix; `message` is folded to one line;
- condition shape (status enum, CamelCase reason) and lookup by type;
- `JobPhase.can_become` follows the documented diagram: final phases are final, the
  expected transitions are allowed and the unexpected ones refused.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from pydantic import ValidationError

from edl_scheduler.api import (
    ConditionStatus,
    JobPhase,
    TrainingJobError,
    TrainingJobStatus,
    load_training_job,
)

from .conftest import STATUS, allreduce_document


def test_full_status_round_trips() -> None:
    document = allreduce_document()
    document["status"] = STATUS
    job = load_training_job(document)
    status = job.status
    assert status.phase is JobPhase.RESIZING
    assert status.last_resize is not None
    assert (status.last_resize.from_replicas, status.last_resize.to_replicas) == (2, 4)
    assert status.submit_time == datetime(2024, 5, 1, 11, 59, tzinfo=UTC)
    assert status.throughput[0].samples_per_second == 410.0
    assert status.throughput[1].step_seconds is None
    assert [t.batch for t in status.throughput] == [64, 0]  # 0: not reported
    assert status.batch is not None
    assert (status.batch.global_batch, status.batch.accumulation) == (128, 2)
    assert status.batch.goodput == 300.0
    assert status.conditions[0].status is ConditionStatus.TRUE
    assert job.to_dict(as_written=True)["status"] == STATUS
    assert load_training_job(job.to_yaml()) == job


def test_times_load_from_yaml_text_as_aware_datetimes() -> None:
    job = load_training_job(
        "apiVersion: edl.dev/v1alpha1\nkind: TrainingJob\nmetadata: {name: a}\n"
        "spec: {minReplicas: 1, maxReplicas: 1, template: {spec: {containers: [{image: x}]}}}\n"
        "status: {submitTime: 2024-05-01T12:00:00+02:00}\n"
    )
    assert job.status.submit_time == datetime(2024, 5, 1, 10, 0, tzinfo=UTC)
    assert job.to_dict()["status"]["submitTime"] == "2024-05-01T12:00:00+02:00"


@pytest.mark.parametrize("value", ["2024-05-01T12:00:00", "yesterday"])
def test_times_need_a_zone(value: str) -> None:
    document = allreduce_document()
    document["status"] = {"startTime": value}
    with pytest.raises(TrainingJobError) as caught:
        load_training_job(document)
    (problem,) = caught.value.problems
    assert problem.path == "status.startTime"
    assert "RFC 3339" in problem.message
    assert "2024-05-01T12:00:00Z" in problem.message


def test_message_is_one_line() -> None:
    status = TrainingJobStatus(message="waiting:\n  needs 4 GPUs,\t2 free\n")
    assert status.message == "waiting: needs 4 GPUs, 2 free"


def test_default_status_is_pending_and_empty() -> None:
    status = TrainingJobStatus()
    assert status.phase is JobPhase.PENDING
    assert (status.replicas, status.generation, status.restarts) == (0, 0, 0)
    assert status.allocation == {} and status.throughput == [] and status.conditions == []


def test_condition_lookup_by_type() -> None:
    status = TrainingJobStatus.model_validate({"conditions": STATUS["conditions"]})
    condition = status.condition("Admitted")
    assert condition is not None and condition.reason == "GangPlaced"
    assert status.condition("Ready") is None


@pytest.mark.parametrize(
    ("condition", "field"),
    [
        ({"status": "Yes"}, "status"),
        ({"reason": "not camel case"}, "reason"),
        ({"lastTransitionTime": None}, "lastTransitionTime"),
    ],
)
def test_conditions_are_checked(condition: dict[str, Any], field: str) -> None:
    given = {**STATUS["conditions"][0], **condition}
    with pytest.raises(ValidationError, match=field):
        TrainingJobStatus.model_validate({"conditions": [given]})


def test_negative_counts_are_refused() -> None:
    with pytest.raises(ValidationError):
        TrainingJobStatus(replicas=-1)
    with pytest.raises(ValidationError):
        TrainingJobStatus.model_validate(
            {"throughput": [{"nodes": 1, "workers": 0, "samplesPerSecond": 1}]}
        )
    with pytest.raises(ValidationError, match="batch"):
        TrainingJobStatus.model_validate(
            {"throughput": [{"nodes": 1, "workers": 1, "samplesPerSecond": 1, "batch": -8}]}
        )


P = JobPhase
ALLOWED = {
    (P.PENDING, P.RUNNING),
    (P.RUNNING, P.RESIZING),
    (P.RESIZING, P.RUNNING),
    (P.RUNNING, P.PENDING),
    (P.PENDING, P.SUSPENDED),
    (P.RUNNING, P.SUSPENDED),
    (P.RESIZING, P.SUSPENDED),
    (P.SUSPENDED, P.PENDING),
    (P.RUNNING, P.SUCCEEDED),
    (P.RESIZING, P.SUCCEEDED),
    (P.PENDING, P.FAILED),
    (P.RUNNING, P.FAILED),
    (P.RESIZING, P.FAILED),
    (P.SUSPENDED, P.FAILED),
}


@pytest.mark.parametrize("source", list(JobPhase))
@pytest.mark.parametrize("target", list(JobPhase))
def test_phase_transitions_follow_the_diagram(source: JobPhase, target: JobPhase) -> None:
    expected = source is target or (source, target) in ALLOWED
    assert source.can_become(target) is expected


def test_final_and_active_phases() -> None:
    assert {p for p in JobPhase if p.final} == {P.SUCCEEDED, P.FAILED}
    assert {p for p in JobPhase if p.active} == {P.RUNNING, P.RESIZING}
    for phase in JobPhase:
        if phase.final:
            assert not any(phase.can_become(other) for other in JobPhase if other is not phase)


def test_diagram_is_in_the_docstring() -> None:
    doc = JobPhase.__doc__ or ""
    for phase in JobPhase:
        assert phase.value in doc
