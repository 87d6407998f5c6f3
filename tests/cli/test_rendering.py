"""What edlctl shows of a job is the job's own text.

Aspects tested:
- messages, reasons and Events that look like rich markup (a worker's ``[rank0]: ...``,
  an annotation's ``['edl.dev/...']``) are shown as written in ``describe`` and ``why``;
- an error message is printed as written too;
- a long line is printed whole, not wrapped at 80 columns, when the output is not a
  terminal (the demo's log lines);
- ``describe`` and ``top`` show the batch a job runs at (global batch, accumulation) and the
  goodput its runtime predicts, as either backend reads them from the status; "-" where
  none was reported.
"""

from __future__ import annotations

from typing import Any

import pytest
import typer
from rich.console import Console

from edl_scheduler.api import BatchInUse, load_training_job
from edl_scheduler.cli import main
from edl_scheduler.cli.rendering import details_panel, jobs_table
from edl_scheduler.local import serving
from edl_scheduler.local.storing import JobRow
from edl_scheduler.local.wire import EventView, JobSummary, ResizeView
from edl_scheduler.sdk import kube
from edl_scheduler.sdk.base import JobDetails

FAILURE = "[rank0]: Traceback ... [rank0]: RuntimeError: [bold]boom[/bold]"


def _shown(details: JobDetails, why_only: bool) -> str:
    console = Console(width=400, record=True, color_system=None)
    console.print(details_panel(details, why_only=why_only))
    return console.export_text()


@pytest.mark.parametrize("why_only", [False, True])
def test_text_that_looks_like_markup_is_shown_as_written(why_only: bool) -> None:
    summary = JobSummary(
        name="lr2", namespace="default", queue="default", priority=0, min_replicas=1,
        max_replicas=2, replicas=0, phase="Failed", age_s=3.0, message=f"failed: {FAILURE}",
    )  # fmt: skip
    details = JobDetails(
        summary=summary,
        manifest={},
        events=[EventView(time=0.0, type="Warning", reason="WorkerFailed", message=FAILURE)],
        resizes=[ResizeView(time=0.0, from_replicas=2, to_replicas=1, reason=f"[x] {FAILURE}")],
    )
    shown = _shown(details, why_only)
    assert f"failed: {FAILURE}" in shown
    assert shown.count(FAILURE) == 3


def test_an_error_is_printed_as_written(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    message = "metadata.annotations['edl.dev/coordinator-args'] is missing: [give] it"
    monkeypatch.setattr(main, "err", Console(stderr=True, width=400, color_system=None))
    with pytest.raises(typer.Exit):
        main.fail(message)
    assert message in capsys.readouterr().err


def test_a_long_line_is_printed_whole_into_a_pipe(capsys: pytest.CaptureFixture[str]) -> None:
    line = "12:00:01 default/research: 4 -> 2 workers: " + "shrunk to admit urgent " * 8
    main.out.print(line, highlight=False)
    assert capsys.readouterr().out == line + "\n"


BATCH = {"globalBatch": 256, "accumulation": 2, "goodput": 170.5}


def k8s_object(batch: dict[str, Any] | None) -> dict[str, Any]:
    status: dict[str, Any] = {"phase": "Running", "replicas": 2}
    if batch is not None:
        status["batch"] = batch
    return {
        "apiVersion": "edl.dev/v1alpha1",
        "kind": "TrainingJob",
        "metadata": {"name": "bert", "namespace": "default"},
        "spec": {
            "minReplicas": 1,
            "maxReplicas": 4,
            "resources": {"nvidia.com/gpu": 1},
            "template": {"spec": {"containers": [{"name": "w", "image": "img"}]}},
        },
        "status": status,
    }


def _table(jobs: list[JobSummary]) -> str:
    console = Console(width=400, record=True, color_system=None)
    console.print(jobs_table(jobs, speeds=True))
    return console.export_text()


def test_describe_and_top_show_the_batch_in_use_from_either_backend() -> None:
    from_kube = kube.summary_of(k8s_object(BATCH), now=10.0)
    job = load_training_job(k8s_object(None))
    job.status.batch = BatchInUse(global_batch=256, accumulation=2, goodput=170.5)
    row = JobRow("default/bert", job, "", "", 0, None, None, 0, 2, 0.0)
    from_local = serving.summary_of(row, now=10.0)
    for summary in (from_kube, from_local):
        assert (summary.global_batch, summary.accumulation, summary.goodput) == (256, 2, 170.5)
        shown = _shown(JobDetails(summary=summary, manifest={}), why_only=False)
        assert "global 256, accumulation 2, goodput 170.5 samples/s" in shown
        header, line = _table([summary]).splitlines()[:2]
        assert header.split()[-3:] == ["BATCH", "ACCUM", "GOODPUT/S"]
        assert line.split()[-3:] == ["256", "2", "170.5"]


def test_a_job_that_reported_no_batch_shows_none() -> None:
    summary = kube.summary_of(k8s_object(None), now=10.0)
    assert summary.global_batch is None
    assert "Batch" not in _shown(JobDetails(summary=summary, manifest={}), why_only=False)
    assert _table([summary]).splitlines()[1].split()[-3:] == ["-", "-", "-"]
    unknown = kube.summary_of(k8s_object({**BATCH, "goodput": 0.0}), now=10.0)
    assert "goodput - samples/s" in _shown(JobDetails(summary=unknown, manifest={}), False)
