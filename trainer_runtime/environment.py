"""The environment contract between whoever starts a worker and the worker itself.

The local backend and the Kubernetes controller start workers the same way: a process whose
environment names its job's coordinator, the job token, and its own identity. This module is
the one place that contract is written down (docs/runtime.md repeats this table):

| variable            | required | meaning                                                    |
|---------------------|----------|------------------------------------------------------------|
| EDL_COORDINATOR     | yes      | host:port of the job's coordinator                         |
| EDL_JOB_TOKEN       | yes      | the job's secret; a call without it is refused             |
| EDL_JOB_ID          | yes      | the job's name (namespaces the per-generation group store) |
| EDL_WORKER_ID       | yes      | this worker's name, unique in the job (the pod name)       |
| EDL_NODE_NAME       | no       | the node it runs on (throughput is keyed by node count)    |
| EDL_WORKER_HOST     | no       | address peers reach this worker at (default 127.0.0.1)     |
| EDL_TIMEOUT_S       | no       | bound on every wait, in seconds (default 30)               |
| EDL_CHECKPOINT_DIR  | no       | where a suspended allreduce job keeps its model (shared by |
|                     |          | every worker of the job); unset: a suspension restarts it  |

The coordinator itself reads EDL_JOB_TOKEN (its other settings are command-line options).
What must stay true: a missing required variable is a clear error naming it, at start.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass

COORDINATOR = "EDL_COORDINATOR"
JOB_TOKEN = "EDL_JOB_TOKEN"
JOB_ID = "EDL_JOB_ID"
WORKER_ID = "EDL_WORKER_ID"
NODE_NAME = "EDL_NODE_NAME"
WORKER_HOST = "EDL_WORKER_HOST"
TIMEOUT_S = "EDL_TIMEOUT_S"
CHECKPOINT_DIR = "EDL_CHECKPOINT_DIR"
DEFAULT_TIMEOUT_S = 30.0


class ContractError(RuntimeError):
    """The worker's environment does not fulfil the contract."""


@dataclass(frozen=True, slots=True)
class WorkerContract:
    coordinator: str
    token: str
    job_id: str
    worker_id: str
    node: str
    host: str = "127.0.0.1"
    timeout_s: float = DEFAULT_TIMEOUT_S
    checkpoint_dir: str | None = None

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> WorkerContract:
        env = os.environ if environ is None else environ
        missing = [
            name for name in (COORDINATOR, JOB_TOKEN, JOB_ID, WORKER_ID) if not env.get(name)
        ]
        if missing:
            raise ContractError(
                f"missing environment: {', '.join(missing)} (see docs/runtime.md, "
                "'Environment contract')"
            )
        try:
            timeout_s = float(env.get(TIMEOUT_S, DEFAULT_TIMEOUT_S))
        except ValueError as error:
            raise ContractError(f"{TIMEOUT_S} must be a number of seconds") from error
        if timeout_s <= 0:
            raise ContractError(f"{TIMEOUT_S} must be positive")
        return cls(
            coordinator=env[COORDINATOR],
            token=env[JOB_TOKEN],
            job_id=env[JOB_ID],
            worker_id=env[WORKER_ID],
            node=env.get(NODE_NAME) or socket.gethostname(),
            host=env.get(WORKER_HOST) or "127.0.0.1",
            timeout_s=timeout_s,
            checkpoint_dir=env.get(CHECKPOINT_DIR) or None,
        )

    def to_environ(self) -> dict[str, str]:
        """The variables that give a child process this contract."""
        checkpoints = {CHECKPOINT_DIR: self.checkpoint_dir} if self.checkpoint_dir else {}
        return {
            **checkpoints,
            COORDINATOR: self.coordinator,
            JOB_TOKEN: self.token,
            JOB_ID: self.job_id,
            WORKER_ID: self.worker_id,
            NODE_NAME: self.node,
            WORKER_HOST: self.host,
            TIMEOUT_S: str(self.timeout_s),
        }
