"""The gradient statistics from the runtime's progress to the planner's snapshot.

Aspects:
- the controller's coordinator port reads `GradientNoise` from a `Progress` message, and the
  status block it writes carries them (`status.efficiency`); unusable ones are not written;
- observing builds the snapshot job's `Efficiency` from the status; a job without
  statistics has none; unusable values (negative, both 0, init batch 0) are dropped with a
  warning and the job is still planned;
- the local backend does the same from the raw progress message and its status.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest

from edl_scheduler.api import GradientStatistics, TrainingJobStatus
from edl_scheduler.controller.coordinating import GrpcCoordinator
from edl_scheduler.controller.observing import observe
from edl_scheduler.core.snapshot import Efficiency
from edl_scheduler.local.statusing import efficiency_fields, planned_efficiency
from trainer_runtime.protocol import pb

from .test_observing import k8s_job, k8s_node


def progress_message(noise: pb.GradientNoise | None) -> Any:
    return pb.Progress(generation=3, epoch=1, epochs=2, committed_step=40, noise=noise)


class ReplyingCoordinator(GrpcCoordinator):
    """The real port's conversion, with the gRPC call answered by a fixed message."""

    def __init__(self, reply: Any) -> None:
        self.reply = reply

    def _call(self, name: str, request: Any) -> Any:
        assert name == "GetProgress"
        return self.reply


def job_with_status(efficiency: dict[str, Any] | None) -> dict[str, Any]:
    obj = k8s_job("j", 1, 4)
    if efficiency is not None:
        obj["status"] = {"efficiency": efficiency}
    return obj


def observed_efficiency(obj: dict[str, Any]) -> Efficiency | None:
    observation = observe([k8s_node("n0")], [], [obj], {})
    (job,) = observation.snapshot.jobs
    return job.efficiency


def test_progress_message_becomes_the_status_block_and_the_snapshot_efficiency() -> None:
    noise = pb.GradientNoise(init_batch=64, grad_sqr=0.5, grad_var=3.0, steps=120)
    progress = ReplyingCoordinator(progress_message(noise)).progress()
    assert progress.efficiency == GradientStatistics(
        init_batch=64, grad_sqr=0.5, grad_var=3.0, steps=120
    )
    block = progress.efficiency.model_dump(mode="json", by_alias=True)
    assert block == {"initBatch": 64, "gradSqr": 0.5, "gradVar": 3.0, "steps": 120}
    assert observed_efficiency(job_with_status(block)) == Efficiency(64, 0.5, 3.0)


def test_a_progress_without_statistics_leaves_the_job_without_efficiency() -> None:
    assert ReplyingCoordinator(progress_message(None)).progress().efficiency is None
    assert observed_efficiency(job_with_status(None)) is None


@pytest.mark.parametrize(
    ("block", "field"),
    [
        ({"initBatch": 0, "gradSqr": 1.0, "gradVar": 1.0}, "initBatch"),
        ({"initBatch": 8, "gradSqr": -1.0, "gradVar": 1.0}, "gradSqr"),
        ({"initBatch": 8, "gradSqr": 0.0, "gradVar": 0.0}, "gradSqr"),
    ],
)
def test_unusable_statistics_are_dropped_with_a_warning_and_the_job_still_planned(
    block: dict[str, Any], field: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING):
        assert observed_efficiency(job_with_status(block)) is None
    assert f"efficiency.{field}" in caplog.text


def test_local_backend_takes_them_from_the_progress_message() -> None:
    noise = pb.GradientNoise(init_batch=32, grad_sqr=0.25, grad_var=2.0, steps=9)
    fields = efficiency_fields(progress_message(noise))
    status = TrainingJobStatus().model_copy(update=fields)
    assert planned_efficiency(status) == Efficiency(32, 0.25, 2.0)
    bad = pb.GradientNoise(init_batch=32, grad_sqr=float("inf"), grad_var=2.0, steps=9)
    assert efficiency_fields(progress_message(bad)) == {}
    assert efficiency_fields(progress_message(None)) == {}
    assert planned_efficiency(TrainingJobStatus()) is None
