"""How a local job's processes are launched, without starting them.

Aspects tested:
- a worker gets the container's command, args, literal env and working directory, plus the
  runtime's environment contract; on a GPU machine only its own slots are visible
- the coordinator gets the annotation's dataset options, its state file and its port
- the job's phase follows JobPhase's diagram one step at a time
"""

from __future__ import annotations

import sys
from pathlib import Path

from edl_scheduler.api import JobPhase, load_training_job
from edl_scheduler.local.launching import coordinator_process, slots_per_worker, worker_process
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
    spec = coordinator_process(job, "c", 4321, keys, tmp_path / "state", tmp_path)
    assert dict(spec.env)["EDL_TRUSTED_KEY"] == keys.issuer.public_text()
    assert "EDL_JOB_TOKEN" not in spec.env  # it checks credentials, it holds none
    argv = list(spec.argv)
    assert argv[argv.index("--port") + 1] == "4321"
    assert argv[argv.index("--samples") + 1] == "777"
    assert argv[argv.index("--mode") + 1] == "independent"  # framework: none
    assert argv[argv.index("--state-file") + 1] == str(tmp_path / "state" / "default.coord.json")
    assert "--exit-when-finished" in argv


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
