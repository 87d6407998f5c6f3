"""edlctl against the local service, started and stopped by edlctl itself.

Aspects tested:
- every verb: local start/status/stop, submit (-f and --command), ls, describe, why, scale,
  suspend, resume, logs, top, delete; their output names what changed
- bad input gives one clear message and a non-zero exit code, and the service stays up:
  invalid YAML, a binary or empty file, YAML aliases, min > max, an unknown job, more
  slots than exist, a command that exits at once (the job Fails, with the exit code in its
  Events)
- no service: a clear message and exit code 5
- stopping the service with --keep-running and starting it again loses no job: the workers
  keep their PIDs and the job finishes
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from edl_scheduler.cli.main import app
from edl_scheduler.sdk.local import LocalClient

from ..local.jobs import plain_job

pytestmark = pytest.mark.slow

RUNNER = CliRunner()


def edlctl(home: Path, *args: str, input: str | None = None) -> Result:
    return RUNNER.invoke(
        app,
        ["--home", str(home), *args],
        input=input,
        env={"COLUMNS": "200"},
        catch_exceptions=False,
    )


def wait_phase(home: Path, name: str, phase: str, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    with LocalClient(home) as client:
        while time.monotonic() < deadline:
            if client.describe(name).summary.phase == phase:
                return
            time.sleep(0.3)
        details = client.describe(name)
    raise AssertionError(f"{name} is {details.summary.phase}, not {phase}: {details.events}")


def serving(home: Path) -> Iterator[Path]:
    started = edlctl(home, "local", "start", "--slots", "4")
    assert started.exit_code == 0, started.output
    assert "4 slots" in started.output
    yield home
    edlctl(home, "local", "stop")


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """One service for the tests that do not stop it (starting one costs seconds)."""
    yield from serving(tmp_path_factory.mktemp("shared") / "edl")


@pytest.fixture
def own_home(tmp_path: Path) -> Iterator[Path]:
    yield from serving(tmp_path / "edl")


def test_every_verb(home: Path, tmp_path: Path) -> None:
    job = tmp_path / "job.yaml"
    job.write_text(plain_job("verbs", 1, 2, priority=7, samples=200000, step_time_s=0.1))
    assert edlctl(home, "local", "status").exit_code == 0

    submitted = edlctl(home, "submit", "-f", str(job))
    assert submitted.exit_code == 0 and "submitted default/verbs" in submitted.output
    wait_phase(home, "verbs", "Running")

    listed = edlctl(home, "ls")
    assert listed.exit_code == 0
    for column in ("NAME", "QUEUE", "PRIO", "MIN/MAX", "REPLICAS", "PHASE", "AGE"):
        assert column in listed.output
    assert "verbs" in listed.output and "1/2" in listed.output and "Running" in listed.output

    described = edlctl(home, "describe", "verbs")
    assert described.exit_code == 0
    for part in ("Workers", "Resize history", "Events", "default.verbs.worker-0", "Started"):
        assert part in described.output
    why = edlctl(home, "why", "default/verbs")
    assert why.exit_code == 0 and "Reason" in why.output and "Resize history" in why.output

    scaled = edlctl(home, "scale", "verbs", "--max", "3")
    assert scaled.exit_code == 0 and "max 3" in scaled.output
    assert edlctl(home, "suspend", "verbs").exit_code == 0
    wait_phase(home, "verbs", "Suspended")
    assert "Suspended" in edlctl(home, "ls").output
    assert edlctl(home, "resume", "verbs").exit_code == 0
    wait_phase(home, "verbs", "Running")

    logs = edlctl(home, "logs", "verbs", "--worker", "coordinator", "--tail", "50")
    assert logs.exit_code == 0 and "listening on 127.0.0.1" in logs.output
    top = edlctl(home, "top", "--once")
    assert top.exit_code == 0 and "slots in use" in top.output and "verbs" in top.output
    assert "DONE" in top.output and "SAMPLES/S" in top.output
    # Into a pipe, without --once: a view every interval (a live display would write none).
    piped = subprocess.Popen(
        [str(Path(sys.executable).parent / "edlctl"), "--home", str(home), "top", "--interval",
         "0.2"],
        stdout=subprocess.PIPE, text=True, env={**os.environ, "COLUMNS": "200"},
    )  # fmt: skip
    try:
        assert piped.stdout is not None
        seen = [piped.stdout.readline() for _ in range(40)]
    finally:
        piped.kill()
        piped.wait(10)
    assert sum("slots in use" in line for line in seen) >= 2, seen

    deleted = edlctl(home, "delete", "verbs")
    assert deleted.exit_code == 0 and "deleted verbs" in deleted.output
    assert "verbs" not in edlctl(home, "ls").output

    command = f"{sys.executable} -m trainer_runtime.plain_worker --step-time-s 0.02"
    quick = edlctl(
        home, "submit", "--name", "quick", "--command", command, "--min", "1", "--max", "2",
        "--priority", "5", "--samples", "300", "--framework", "none",
    )  # fmt: skip
    assert quick.exit_code == 0, quick.output
    wait_phase(home, "quick", "Succeeded")


def test_bad_input_is_refused_and_the_service_stays_up(home: Path, tmp_path: Path) -> None:
    bad_yaml = tmp_path / "bad.yaml"
    bad_yaml.write_text("apiVersion: edl.dev/v1alpha1\nkind: [TrainingJob\n")
    result = edlctl(home, "submit", "-f", str(bad_yaml))
    assert result.exit_code == 2 and "not valid YAML" in result.output

    binary = tmp_path / "binary.yaml"
    binary.write_bytes(b"\xff\xfe\x00\x81" * 32)
    result = edlctl(home, "submit", "-f", str(binary))
    assert result.exit_code == 2 and "is not UTF-8 text" in result.output
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    result = edlctl(home, "submit", "-f", str(empty))
    assert result.exit_code == 2 and "holds no YAML document (it is empty)" in result.output
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text("a: &a [x, x]\nb: [*a, *a]\n")
    result = edlctl(home, "submit", "-f", str(bomb))
    assert result.exit_code == 2 and "aliases (*name) are not accepted" in result.output

    inverted = tmp_path / "inverted.yaml"
    inverted.write_text(plain_job("inverted", 3, 2))
    result = edlctl(home, "submit", "-f", str(inverted))
    assert result.exit_code == 2 and "maxReplicas" in result.output

    huge = tmp_path / "huge.yaml"
    huge.write_text(plain_job("huge", 6, 8))
    result = edlctl(home, "submit", "-f", str(huge))
    assert result.exit_code == 2 and "this local cluster has 4" in result.output

    result = edlctl(home, "describe", "ghost")
    assert result.exit_code == 3 and "does not exist" in result.output
    result = edlctl(home, "scale", "ghost", "--min", "3", "--max", "2")
    assert result.exit_code == 2 and "--min 3 is above --max 2" in result.output

    crash = tmp_path / "crash.yaml"
    crash.write_text(plain_job("crash", 1, 1, command=["false"], max_restarts=0))
    assert edlctl(home, "submit", "-f", str(crash)).exit_code == 0
    wait_phase(home, "crash", "Failed")
    described = edlctl(home, "describe", "crash")
    assert "WorkerFailed" in described.output and "exit code 1" in described.output

    assert edlctl(home, "local", "status").exit_code == 0
    assert "crash" in edlctl(home, "ls").output


def test_no_service_is_a_clear_error(tmp_path: Path) -> None:
    result = edlctl(tmp_path / "nothing", "ls")
    assert result.exit_code == 5
    assert "not running" in result.output and "edlctl local start" in result.output


def test_restarting_the_service_loses_no_job(own_home: Path, tmp_path: Path) -> None:
    home = own_home
    job = tmp_path / "job.yaml"
    job.write_text(plain_job("durable", 2, 2, samples=5000, step_time_s=0.1))
    assert edlctl(home, "submit", "-f", str(job)).exit_code == 0
    wait_phase(home, "durable", "Running")
    with LocalClient(home) as client:
        before = {w.pid for w in client.describe("durable").workers}
    assert edlctl(home, "local", "stop", "--keep-running").exit_code == 0
    assert edlctl(home, "local", "status").exit_code == 5  # Unreachable, as the docs say
    assert edlctl(home, "local", "start", "--slots", "4").exit_code == 0
    with LocalClient(home) as client:
        assert {w.pid for w in client.describe("durable").workers} == before
    wait_phase(home, "durable", "Succeeded", timeout_s=180)
    with LocalClient(home) as client:
        details = client.describe("durable")
    assert details.summary.restarts == 0
    assert details.progress["samplesDone"] == 5000
