"""The names the controller writes on Kubernetes objects, in one place.

Every pod, Service, Secret, ConfigMap and NetworkPolicy the controller creates for a
TrainingJob carries these labels, so that observing can rebuild the whole picture from the
API alone after a restart (level-triggered: nothing is remembered in memory that the API
does not hold).
"""

from __future__ import annotations

from typing import Final

PREFIX: Final = "edl.dev"

#: The job a pod belongs to (the TrainingJob's name; the namespace is the pod's own).
LABEL_JOB: Final = f"{PREFIX}/job"
#: worker | pserver | coordinator.
LABEL_ROLE: Final = f"{PREFIX}/role"
#: Marks every object the controller manages, for one cheap label-selected watch.
LABEL_MANAGED: Final = f"{PREFIX}/managed"

#: Set on a replica pod that has been told to leave at its next step boundary.
ANNOTATION_DRAINING: Final = f"{PREFIX}/draining"
#: When the drain was requested (seconds since the epoch), for the drain deadline.
ANNOTATION_DRAIN_SINCE: Final = f"{PREFIX}/drain-since"

GPU_RESOURCE: Final = "nvidia.com/gpu"

#: The value of LABEL_ROLE on a job's coordinator pod (workers use ``core.Role`` values).
ROLE_COORDINATOR: Final = "coordinator"

#: On a TrainingJob: the coordinator's dataset options (``--samples N --epochs E ...``), as a
#: shell-quoted string. The API has no field for them yet; the coordinator needs them to plan
#: the shards.
ANNOTATION_COORDINATOR_ARGS: Final = f"{PREFIX}/coordinator-args"
#: On a coordinator pod: the port it listens on (unique per job where all pods share a host).
ANNOTATION_COORDINATOR_PORT: Final = f"{PREFIX}/coordinator-port"
#: On a worker pod whose failure was already charged to the job's restart budget.
ANNOTATION_FAILURE_COUNTED: Final = f"{PREFIX}/failure-counted"

#: The key of a replica's credential in its Secret.
TOKEN_KEY: Final = "token"
#: The key of the job's TLS key in its TLS Secret.
TLS_KEY_KEY: Final = "tls.key"
#: The role label of a replica's credential Secret.
ROLE_CREDENTIAL: Final = "credential"
#: The key of the coordinator's state in the job's state ConfigMap.
STATE_KEY: Final = "state.json"
#: The environment variable that hands a restarted coordinator its last saved state.
STATE_ENV: Final = "EDL_COORDINATOR_STATE"


def coordinator_name(job: str) -> str:
    """The coordinator pod's and its Service's name."""
    return f"{job}-coordinator"


def tls_secret_name(job: str) -> str:
    """The Secret with the key of the job's TLS certificate (its servers mount it)."""
    return f"{job}-tls"


def credential_name(pod: str) -> str:
    """The Secret that holds the credential of the replica pod ``pod``."""
    return f"{pod}-credential"


def state_config_map_name(job: str) -> str:
    return f"{job}-coordinator-state"


def network_policy_name(job: str) -> str:
    """The NetworkPolicy around the job's coordinator and parameter servers."""
    return f"{job}-servers"
