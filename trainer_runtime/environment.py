"""The environment contract between whoever starts a worker and the worker itself.

The local backend and the Kubernetes controller start workers the same way: a process whose
environment names its job's coordinator, its own credential, and its own identity. This module is
the one place that contract is written down (docs/runtime.md repeats this table):

| variable            | required | meaning                                                    |
|---------------------|----------|------------------------------------------------------------|
| EDL_COORDINATOR     | yes      | host:port of the job's coordinator                         |
| EDL_JOB_TOKEN       | yes      | this process's credential, issued for its worker id        |
| EDL_JOB_ID          | yes      | the job's name (namespaces the per-generation group store) |
| EDL_WORKER_ID       | yes      | this worker's name, unique in the job (the pod name)       |
| EDL_NODE_NAME       | no       | the node it runs on (throughput is keyed by node count)    |
| EDL_WORKER_HOST     | no       | address peers reach this worker at (default 127.0.0.1)     |
| EDL_TIMEOUT_S       | no       | bound on every wait, in seconds (default 30)               |
| EDL_TLS_CERT        | no       | the job's certificate: set, every call to the job's        |
|                     |          | servers is TLS, trusting that certificate only             |
| EDL_TLS_KEY         | servers  | its key, for the coordinator and the parameter servers     |
| EDL_CHECKPOINT_DIR  | no       | where a suspended allreduce job keeps its model (shared by |
|                     |          | every worker of the job); unset: a suspension restarts it  |

The coordinator and the parameter servers check callers' credentials with EDL_TRUSTED_KEY
(the launcher's public key) for the job EDL_JOB_IDENTITY names (``verifier_from``); the
coordinator's other settings are command-line options. Credentials and keys come from the
environment, never the command line, where `ps` shows them.
What must stay true: a missing required variable is a clear error naming it, at start.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass

from trainer_runtime.protocol.credentials import (
    JOB_IDENTITY_ENV,
    TRUSTED_KEY_ENV,
    JobCredentials,
    Verifier,
)
from trainer_runtime.protocol.tls import JobTls
from trainer_runtime.protocol.tls import from_environ as tls_from_environ

COORDINATOR = "EDL_COORDINATOR"
JOB_TOKEN = "EDL_JOB_TOKEN"
JOB_ID = "EDL_JOB_ID"
WORKER_ID = "EDL_WORKER_ID"
NODE_NAME = "EDL_NODE_NAME"
WORKER_HOST = "EDL_WORKER_HOST"
TIMEOUT_S = "EDL_TIMEOUT_S"
CHECKPOINT_DIR = "EDL_CHECKPOINT_DIR"
TRUSTED_KEY = TRUSTED_KEY_ENV
JOB_IDENTITY = JOB_IDENTITY_ENV
DEFAULT_TIMEOUT_S = 30.0


class ContractError(RuntimeError):
    """The worker's environment does not fulfil the contract."""


def trust_environ(credentials: JobCredentials) -> dict[str, str]:
    """The variables that let a coordinator or a parameter server check the job's callers."""
    return {TRUSTED_KEY: credentials.issuer.public_text(), JOB_IDENTITY: credentials.job}


def verifier_from(environ: Mapping[str, str] | None = None) -> Verifier:
    """What checks the credentials of a job's callers, from its server's environment."""
    env = os.environ if environ is None else environ
    missing = [name for name in (TRUSTED_KEY, JOB_IDENTITY) if not env.get(name)]
    if missing:
        raise ContractError(
            f"missing environment: {', '.join(missing)} (the launcher's public key and the "
            "job's identity, which every credential of the job names; see docs/runtime.md)"
        )
    try:
        return Verifier(env[TRUSTED_KEY], env[JOB_IDENTITY])
    except ValueError as error:
        raise ContractError(str(error)) from None


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
    #: TLS to the job's servers, where the deployment turns it on (``protocol/tls.py``).
    tls: JobTls | None = None

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
            tls=tls_from_environ(env),
        )

    def to_environ(self) -> dict[str, str]:
        """The variables that give a child process this contract."""
        checkpoints = {CHECKPOINT_DIR: self.checkpoint_dir} if self.checkpoint_dir else {}
        tls = self.tls.environ() if self.tls is not None else {}
        return {
            **checkpoints,
            **tls,
            COORDINATOR: self.coordinator,
            JOB_TOKEN: self.token,
            JOB_ID: self.job_id,
            WORKER_ID: self.worker_id,
            NODE_NAME: self.node,
            WORKER_HOST: self.host,
            TIMEOUT_S: str(self.timeout_s),
        }
