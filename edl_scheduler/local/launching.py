"""How a local job's processes are launched: the same contract as a pod on Kubernetes.

A worker is the first container of the job's pod template, run as a local process: its
``command`` and ``args``, its literal ``env`` values and its ``workingDir`` are honoured,
the image is not (the local backend runs on this machine's Python), and the runtime's
environment contract (``docs/runtime.md``) is added. A job's coordinator is
``python -m trainer_runtime.coordinator`` with the dataset options of the annotation
``edl.dev/coordinator-args`` (the same annotation the Kubernetes controller reads).

What must stay true:
- Every problem that would make a job unlaunchable is found by ``check_launchable`` at
  submit time, so that a bad job is refused with a message instead of failing later.
- Slots are the machine's GPUs when it has them (each worker sees only its own through
  ``CUDA_VISIBLE_DEVICES``), else CPU slots; a worker takes ``max(1, nvidia.com/gpu)`` slots.
"""

from __future__ import annotations

import os
import shlex
import shutil
import socket
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from edl_scheduler.api import Framework, Strategy, TrainingJob
from edl_scheduler.core.plan import counted
from edl_scheduler.local.processes import ProcessSpec
from trainer_runtime.environment import trust_environ
from trainer_runtime.protocol.credentials import JobCredentials
from trainer_runtime.protocol.options import options_problem

ANNOTATION_COORDINATOR_ARGS = "edl.dev/coordinator-args"
"""The coordinator's dataset options on a TrainingJob (shared with the Kubernetes controller)."""

LOCAL_NODE = "local"
"""The one node of the local cluster, as the planner and the workers see it."""


class LaunchError(ValueError):
    """A job cannot be run by the local backend; the message names the field and the fix."""


def detect_gpus() -> int:
    """GPUs on this machine: ``CUDA_VISIBLE_DEVICES`` when set, else ``nvidia-smi -L``."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([d for d in visible.split(",") if d.strip() and d.strip() != "-1"])
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return 0
    try:
        listing = subprocess.run(
            [smi, "-L"], capture_output=True, text=True, timeout=10, check=False
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return sum(1 for line in listing.splitlines() if line.startswith("GPU "))


def slots_per_worker(job: TrainingJob) -> int:
    return max(1, job.spec.resources.gpu)


def free_port() -> int:
    """A port free now on 127.0.0.1 (for a coordinator that must keep it across restarts)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _container(job: TrainingJob) -> dict[str, object]:
    return job.spec.template.spec.containers[0]


def coordinator_options(job: TrainingJob) -> list[str]:
    text = job.metadata.annotations.get(ANNOTATION_COORDINATOR_ARGS, "")
    try:
        options = shlex.split(text)
    except ValueError as error:
        raise LaunchError(
            f"metadata.annotations.{ANNOTATION_COORDINATOR_ARGS}: cannot be split like a "
            f"shell line ({error}): fix the quoting"
        ) from None
    if job.spec.framework is Framework.NONE and "--mode" not in options:
        options += ["--mode", "independent"]
    return options


def check_launchable(job: TrainingJob, total_slots: int) -> None:
    """Refuse, with the field and the fix, a job the local backend could never run."""
    container = _container(job)
    command = container.get("command")
    if not isinstance(command, list) or not command or not all(isinstance(c, str) for c in command):
        raise LaunchError(
            "spec.template.spec.containers[0].command: is required by the local backend "
            "(it runs the command, not the image): give it as a list, e.g. "
            "['python', 'train.py']"
        )
    args = container.get("args", [])
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        raise LaunchError("spec.template.spec.containers[0].args: must be a list of strings")
    if job.spec.strategy is Strategy.PS:
        raise LaunchError(
            "spec.strategy: ps is not run by the local backend yet: use strategy: allreduce "
            "locally, or run the job on Kubernetes"
        )
    if job.spec.priority_class_name is not None:
        raise LaunchError(
            "spec.priorityClassName: the local backend has no PriorityClasses: give "
            "spec.priority instead"
        )
    need = job.spec.min_replicas * slots_per_worker(job)
    if need > total_slots:
        raise LaunchError(
            f"spec.minReplicas: {counted(job.spec.min_replicas, 'worker')} of "
            f"{counted(slots_per_worker(job), 'slot')} need {need} slots at once, but this local "
            f"cluster has {total_slots}: lower minReplicas (or the GPUs per worker), or "
            "start the local service with more --slots"
        )
    problem = options_problem(coordinator_options(job))
    if problem is not None:
        raise LaunchError(
            f"metadata.annotations.{ANNOTATION_COORDINATOR_ARGS}: the coordinator refuses "
            f"them ({problem}): give its dataset options, e.g. '--samples 4096 --epochs 3' "
            "(edlctl submit --samples N --epochs E sets them)"
        )


def worker_process(
    job: TrainingJob,
    name: str,
    slots: Sequence[int],
    port: int,
    credentials: JobCredentials,
    workdir: str,
    log_dir: Path,
    gpus: bool,
    state_dir: Path | None = None,
) -> ProcessSpec:
    """The process of one worker, with the runtime's environment contract; with
    ``state_dir``, its checkpoint directory too (where a suspended job keeps its model)."""
    container = _container(job)
    argv = [str(c) for c in container["command"]]  # type: ignore[attr-defined]
    argv += [str(a) for a in container.get("args", [])]  # type: ignore[attr-defined]
    env: dict[str, str] = {}
    for item in container.get("env", []) or []:  # type: ignore[attr-defined]
        if isinstance(item, dict) and "name" in item and "value" in item:
            env[str(item["name"])] = str(item["value"])
    env.update(
        {
            "EDL_COORDINATOR": f"127.0.0.1:{port}",
            "EDL_JOB_TOKEN": credentials.worker(name),
            "EDL_JOB_ID": job.metadata.name,
            "EDL_WORKER_ID": name,
            "EDL_NODE_NAME": LOCAL_NODE,
            "EDL_WORKER_HOST": "127.0.0.1",
            "EDL_TIMEOUT_S": str(float(job.spec.timeouts.join_seconds)),
            "PYTHONUNBUFFERED": "1",
        }
    )
    if state_dir is not None:
        env["EDL_CHECKPOINT_DIR"] = str(checkpoint_dir(state_dir, job))
    if gpus:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(s) for s in slots)
    working = container.get("workingDir")
    cwd = Path(str(working)) if working else Path(workdir)
    return ProcessSpec(name=name, argv=argv, env=env, cwd=cwd, log_path=log_dir / f"{name}.log")


def state_file(state_dir: Path, job: TrainingJob) -> Path:
    """Where the job's coordinator saves its state (ledger, generation) after each change."""
    return state_dir / f"{job.metadata.namespace}.{job.metadata.name}.json"


def checkpoint_dir(state_dir: Path, job: TrainingJob) -> Path:
    """Where the job's workers keep its model while it has no worker (suspended or
    preempted whole); beside the coordinator's state, which outlives the job's processes."""
    return state_dir / f"{job.metadata.namespace}.{job.metadata.name}.checkpoints"


def coordinator_process(
    job: TrainingJob,
    name: str,
    port: int,
    credentials: JobCredentials,
    state_dir: Path,
    log_dir: Path,
) -> ProcessSpec:
    """The job's coordinator; its state file lets a restarted one continue where it was. It
    gets the public key of the job's credentials only (it checks them, never makes one)."""
    argv = [
        sys.executable,
        "-m",
        "trainer_runtime.coordinator",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--state-file",
        str(state_file(state_dir, job)),
        "--exit-when-finished",
        *coordinator_options(job),
    ]
    return ProcessSpec(
        name=name,
        argv=argv,
        env={**trust_environ(credentials), "PYTHONUNBUFFERED": "1"},
        log_path=log_dir / f"{name}.log",
    )
