"""How a local job's processes are launched, without starting them.

Aspects tested:
- a worker gets the container's command, args, literal env and working directory, plus the
  runtime's environment contract; on a GPU machine only its own slots are visible
- the coordinator gets the annotation's dataset options, its state file and its port
- each submission of a job names its files apart (a job submitted again starts afresh);
  files in the layout before that are kept for the job that has them
- a parameter server gets its own credential, the job's public key and the snapshots
- the job's phase follows JobPhase's diagram one step at a time
"""

from __future__ import annotations

import sys
from pathlib import Path

from edl_scheduler.api import JobPhase, load_training_job
from edl_scheduler.local.launching import (
    coordinator_process,
    job_files,
    legacy_files,
    server_process,
    slots_per_worker,
    submission_id,
    worker_process,
)
from edl_scheduler.local.statusing import next_phase
from edl_scheduler.local.storing import WorkerRow
from trainer_runtime.protocol.credentials import CallerRole, Claims, Issuer, JobCredentials

from .jobs import plain_job


def test_worker_process_carries_the_environment_contract(tmp_path: Path) -> None:
    text = plain_job("envy", 1, 2, gpus=2).replace(
        "image: local", "image: local\n        env: [{name: MY_FLAG, value: 'on'}]"
    )
    job = load_training_job(text)
    assert slots_per_worker(job) == 2
    keys = JobCredentials(Issuer.from_secret("tok"), "default/envy")
    spec = worker_process(job, "default.envy.worker-3", (2, 3), 4567, keys, "/w", tmp_path, True)
    assert spec.argv[:3] == (sys.executable, "-m", "trainer_runtime.plain_worker")
    assert spec.cwd == Path("/w")
    assert spec.log_path == tmp_path / "default.envy.worker-3.log"
    env = dict(spec.env)
    assert env["EDL_COORDINATOR"] == "127.0.0.1:4567"
    assert env["EDL_JOB_ID"] == "envy"
    assert keys.verifier().claims(env["EDL_JOB_TOKEN"]) == Claims(
        "default/envy", CallerRole.WORKER, "default.envy.worker-3"
    )  # its own credential, for its own worker id
    assert env["EDL_WORKER_ID"] == "default.envy.worker-3"
    assert env["EDL_NODE_NAME"] == "local" and env["MY_FLAG"] == "on"
    assert env["CUDA_VISIBLE_DEVICES"] == "2,3"
    cpu = worker_process(job, "w", (0,), 1, keys, "/w", tmp_path, False)
    assert "CUDA_VISIBLE_DEVICES" not in cpu.env


def test_coordinator_process_gets_the_dataset_options(tmp_path: Path) -> None:
    job = load_training_job(plain_job("coord", samples=777))
    keys = JobCredentials(Issuer.from_secret("tok"), "default/coord")
    files = job_files(tmp_path / "state", job, submission_id("tok"))
    spec = coordinator_process(job, "c", 4321, keys, files.state_file, tmp_path)
    assert dict(spec.env)["EDL_TRUSTED_KEY"] == keys.issuer.public_text()
    assert "EDL_JOB_TOKEN" not in spec.env  # it checks credentials, it holds none
    argv = list(spec.argv)
    assert argv[argv.index("--port") + 1] == "4321"
    assert argv[argv.index("--samples") + 1] == "777"
    assert argv[argv.index("--mode") + 1] == "independent"  # framework: none
    assert argv[argv.index("--state-file") + 1] == str(files.state_file)
    assert "--exit-when-finished" in argv


def test_each_submission_keeps_files_of_its_own(tmp_path: Path) -> None:
    job = load_training_job(plain_job("again"))
    first = job_files(tmp_path, job, submission_id("secret-1"))
    second = job_files(tmp_path, job, submission_id("secret-2"))
    assert first.state_file.parent == tmp_path and first.state_file.name.startswith(
        "default.again."
    )
    assert len({first.state_file, second.state_file}) == 2  # a new submission starts afresh
    assert len({first.checkpoints, second.checkpoints, first.ps_snapshots}) == 3
    assert "secret" not in str(first)  # named by a digest of the row's secret, not by it
    # A job submitted before files were named by submission keeps its names.
    (tmp_path / "default.again.json").write_text("{}")
    assert job_files(tmp_path, job, "x").state_file == tmp_path / "default.again.json"
    assert tmp_path / "default.again.json" in legacy_files(tmp_path, job)


def test_a_server_gets_the_servers_side_of_the_contract(tmp_path: Path) -> None:
    text = plain_job("ps").replace(
        "image: local", "image: local\n        env: [{name: OMP_NUM_THREADS, value: '1'}]"
    )
    job = load_training_job(text)
    keys = JobCredentials(Issuer.from_secret("tok"), "default/ps")
    files = job_files(tmp_path, job, "s1")
    spec = server_process(job, "default.ps.pserver-2", 4567, keys, "/w", tmp_path, files)
    argv = list(spec.argv)
    assert argv[:3] == [sys.executable, "-m", "trainer_runtime.ps"]
    assert argv[argv.index("--snapshot-dir") + 1] == str(files.ps_snapshots)
    env = dict(spec.env)
    assert env["EDL_ROLE"] == "pserver" and env["OMP_NUM_THREADS"] == "1"
    assert env["EDL_TRUSTED_KEY"] == keys.issuer.public_text()
    assert keys.verifier().claims(env["EDL_JOB_TOKEN"]) == Claims(
        "default/ps", CallerRole.SERVER, "default.ps.pserver-2"
    )
    assert "CUDA_VISIBLE_DEVICES" not in env and spec.cwd == Path("/w")


def _workers(count: int, draining: int = 0) -> list[WorkerRow]:
    return [WorkerRow(f"w{i}", "j", i, 0.0, (i,), 0.0, i < draining, None) for i in range(count)]


def test_phases_follow_the_diagram() -> None:
    assert next_phase(JobPhase.PENDING, False, _workers(2), 2, 0) is JobPhase.RUNNING
    assert next_phase(JobPhase.RUNNING, False, _workers(2), 2, 2) is JobPhase.RUNNING
    assert next_phase(JobPhase.RUNNING, False, _workers(3, 1), 2, 2) is JobPhase.RESIZING
    # Joining the first group is not a resize; joining after a grow is.
    assert next_phase(JobPhase.RUNNING, False, _workers(2), 2, 1, False) is JobPhase.RUNNING
    assert next_phase(JobPhase.RUNNING, False, _workers(2), 2, 1, True) is JobPhase.RESIZING
    assert next_phase(JobPhase.RESIZING, False, _workers(2), 2, 2) is JobPhase.RUNNING
    # Resizing cannot become Pending directly: one step through Running.
    assert next_phase(JobPhase.RESIZING, False, [], 0, 0) is JobPhase.RUNNING
    assert next_phase(JobPhase.RUNNING, True, [], 0, 0) is JobPhase.SUSPENDED
    # A suspended job whose workers are still draining stays where it is until they left.
    assert next_phase(JobPhase.RUNNING, True, _workers(1, 1), 0, 1) is JobPhase.PENDING
    assert next_phase(JobPhase.SUSPENDED, False, _workers(1), 1, 0) is JobPhase.PENDING
