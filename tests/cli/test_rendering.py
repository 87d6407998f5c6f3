"""What edlctl shows of a job is the job's own text.

Aspects tested:
- messages, reasons and Events that look like rich markup (a worker's ``[rank0]: ...``,
  an annotation's ``['edl.dev/...']``) are shown as written in ``describe`` and ``why``;
- an error message is printed as written too;
- a long line is printed whole, not wrapped at 80 columns, when the output is not a
  terminal (the demo's log lines).
"""

from __future__ import annotations

import pytest
import typer
from rich.console import Console

from edl_scheduler.cli import main
from edl_scheduler.cli.rendering import details_panel
from edl_scheduler.local.wire import EventView, JobSummary, ResizeView
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
