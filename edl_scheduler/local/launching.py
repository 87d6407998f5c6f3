"""How a local job's processes are launched: the same contract as a pod on Kubernetes.

A worker is the first container of the job's pod template, run as a local process: its
``command`` and ``args``, its literal ``env`` values and its ``workingDir`` are honoured,
the image is not (the local backend runs on this machine's Python), and the runtime's
environment contract (``docs/runtime.md``) is added. A job's coordinator is
``python -m trainer_runtime.coordinator`` with the dataset options of the annotation
``edl.dev/coordinator-args`` (the same annotation the Kubernetes controller reads). A
parameter server of a ``ps`` job is ``python -m trainer_runtime.ps`` on this machine's
Python, with the template's literal ``env`` and the servers' side of the contract.

What a job keeps on disk beyond its processes (the coordinator's state, the model of a
suspended job, the servers' snapshots) lies under the service's state directory, named by
the job and its submission (``JobFiles``): a job deleted and submitted again under the same
name starts afresh instead of reading its predecessor's ledger or parameters.

What must stay true:
- Every problem that would make a job unlaunchable is found by ``check_launchable`` at
  submit time, so that a bad job is refused with a message instead of failing later.
- Slots are the machine's GPUs when it has them (each worker sees only its own through
  ``CUDA_VISIBLE_DEVICES``), else CPU slots; a worker takes ``max(1, nvidia.com/gpu)`` slots.
"""

from __future__ import annotations

import hashlib
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
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
    files: JobFiles | None = None,
) -> ProcessSpec:
    """The process of one worker, with the runtime's environment contract; with ``files``,
    its checkpoint directory (where a suspended job keeps its model) and, for a ``ps`` job,
    the servers' snapshot directory too."""
    container = _container(job)
    argv = [str(c) for c in container["command"]]  # type: ignore[attr-defined]
    argv += [str(a) for a in container.get("args", [])]  # type: ignore[attr-defined]
    env = _literal_env(job)
    env.update(_contract(job, name, port, credentials.worker(name)))
    if files is not None:
        env["EDL_CHECKPOINT_DIR"] = str(files.checkpoints)
        if job.spec.strategy is Strategy.PS:
            env["EDL_PS_SNAPSHOTS"] = str(files.ps_snapshots)
    if gpus:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(s) for s in slots)
    argv = [expand(a, env) for a in argv]
    return ProcessSpec(
        name=name, argv=argv, env=env, cwd=_cwd(job, workdir), log_path=log_dir / f"{name}.log"
    )


def server_process(
    job: TrainingJob,
    name: str,
    port: int,
    credentials: JobCredentials,
    workdir: str,
    log_dir: Path,
    files: JobFiles,
) -> ProcessSpec:
    """One parameter server of a ``ps`` job: the runtime's server on this machine's Python
    (as on Kubernetes it runs in the worker's image), any free port, the job's snapshot
    directory. It gets the job's public key, to check the workers that call it."""
    argv = [
        sys.executable,
        "-m",
        "trainer_runtime.ps",
        "--host",
        "127.0.0.1",
        "--port",
        "0",
        "--snapshot-dir",
        str(files.ps_snapshots),
    ]
    env = _literal_env(job)
    env.update(_contract(job, name, port, credentials.server(name)))
    env.update(trust_environ(credentials))
    env["EDL_ROLE"] = "pserver"
    env["EDL_PS_SNAPSHOTS"] = str(files.ps_snapshots)
    return ProcessSpec(
        name=name, argv=argv, env=env, cwd=_cwd(job, workdir), log_path=log_dir / f"{name}.log"
    )


_REFERENCE = re.compile(r"\$\$|\$\(([-._a-zA-Z][-._a-zA-Z0-9]*)\)")


def expand(text: str, env: Mapping[str, str]) -> str:
    """``$(NAME)`` in a command or argument replaced by the variable's value, as Kubernetes
    does for a container: ``$$`` is a literal ``$``, and a reference to a variable the
    process does not get is kept as written. So ``--snapshot-dir $(EDL_PS_SNAPSHOTS)``
    means the same on both backends."""

    def value(match: re.Match[str]) -> str:
        name = match.group(1)
        if name is None:
            return "$"
        return env.get(name, match.group(0))

    return _REFERENCE.sub(value, text)


def _literal_env(job: TrainingJob) -> dict[str, str]:
    """The container's ``env`` entries with a literal value (``valueFrom`` needs a cluster)."""
    env: dict[str, str] = {}
    for item in _container(job).get("env", []) or []:  # type: ignore[attr-defined]
        if isinstance(item, dict) and "name" in item and "value" in item:
            env[str(item["name"])] = str(item["value"])
    return env


def _contract(job: TrainingJob, name: str, port: int, token: str) -> dict[str, str]:
    """The runtime's environment contract of one replica (docs/runtime.md)."""
    return {
        "EDL_COORDINATOR": f"127.0.0.1:{port}",
        "EDL_JOB_TOKEN": token,
        "EDL_JOB_ID": job.metadata.name,
        "EDL_WORKER_ID": name,
        "EDL_NODE_NAME": LOCAL_NODE,
        "EDL_WORKER_HOST": "127.0.0.1",
        "EDL_TIMEOUT_S": str(float(job.spec.timeouts.join_seconds)),
        "PYTHONUNBUFFERED": "1",
    }


def _cwd(job: TrainingJob, workdir: str) -> Path:
    working = _container(job).get("workingDir")
    return Path(str(working)) if working else Path(workdir)


@dataclass(frozen=True, slots=True)
class JobFiles:
    """What one submission of a job keeps on disk beyond its processes, under the service's
    state directory: the coordinator's state (ledger, generation) after each change, the
    model while the job has no worker (suspended or preempted whole), and a ``ps`` job's
    server snapshots."""

    state_file: Path
    checkpoints: Path
    ps_snapshots: Path


def submission_id(token: str) -> str:
    """A short name for one submission of a job, from its row's secret (not revealing it)."""
    return hashlib.sha256(token.encode()).hexdigest()[:12]


def job_files(state_dir: Path, job: TrainingJob, submission: str) -> JobFiles:
    """The files of one submission of ``job`` (``submission_id``). A job submitted before
    files were named by submission keeps the names it has (its coordinator may run on)."""
    legacy = state_dir / f"{job.metadata.namespace}.{job.metadata.name}"
    if Path(f"{legacy}.json").exists():
        base = legacy
    else:
        base = state_dir / f"{job.metadata.namespace}.{job.metadata.name}.{submission}"
    return JobFiles(Path(f"{base}.json"), Path(f"{base}.checkpoints"), Path(f"{base}.ps"))


def legacy_files(state_dir: Path, job: TrainingJob) -> list[Path]:
    """Files of the job's name in the layout before submissions were named: removed when
    a job of that name is submitted (no job of the name exists then)."""
    base = f"{job.metadata.namespace}.{job.metadata.name}"
    return [state_dir / f"{base}.json", state_dir / f"{base}.checkpoints"]


def coordinator_process(
    job: TrainingJob,
    name: str,
    port: int,
    credentials: JobCredentials,
    state_file: Path,
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
        str(state_file),
        "--exit-when-finished",
        *coordinator_options(job),
    ]
    return ProcessSpec(
        name=name,
        argv=argv,
        env={**trust_environ(credentials), "PYTHONUNBUFFERED": "1"},
        log_path=log_dir / f"{name}.log",
    )
