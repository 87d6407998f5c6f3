"""The objects the controller creates for a TrainingJob, as pure functions returning manifests.

For each job: worker (and parameter-server) pods, each with a Secret holding its own
credential, one coordinator pod, its Service, and a ConfigMap with the coordinator's last
saved state. What must stay
true of every one of them:
- it carries the job's labels (``naming``), so that observing finds it again after a restart,
  and an owner reference to the TrainingJob (controller, blockOwnerDeletion), so that deleting
  the job removes it through garbage collection and nothing is ever orphaned;
- replica pods are placed by ``spec.nodeName`` on the node the planner chose. The planner has
  already decided; binding through the Binding API would cost a second call per pod and
  leave a window where the pod exists unbound. The kubelet still admits the pod against the
  node's resources, and a refusal comes back as a failed pod that the controller replaces
  without charging the job (``deciding``). Other workloads keep the default scheduler;
- worker pods carry the runtime's environment contract (``trainer_runtime/environment.py``,
  docs/runtime.md), with their credential (issued for their own worker id,
  ``trainer_runtime/protocol/credentials.py``) read from their Secret, never written into the
  pod spec; the coordinator and the parameter servers get the job's public key and identity
  (public: they check credentials and can make none); the signing key never leaves the
  controller; with ``--tls``, every pod gets the job's certificate and only the job's
  servers the key, from the job's TLS Secret (``tls_env``);
- GPUs are both requested and limited (extended resources must be equal in both);
- parameter-server pods run the runtime's server (``python -m trainer_runtime.ps``) in the
  worker's image and pod template, bound to the pod's IP; every replica of a ``ps`` job gets
  ``EDL_PS_SNAPSHOTS``, the directory the servers' snapshots live in (``ps_snapshot_dir``);
  the workers of a job that names ``edl.dev/checkpoints`` get ``EDL_CHECKPOINT_DIR``, where
  the model waits while the job has no worker (``checkpoint_dir``);
- the coordinator and each parameter server get readiness and liveness probes of their gRPC
  health service (``probing``), parameter servers on ``--pserver-port``. Worker pods get none
  of ours; the template's own probes of the training container are kept. A worker serves
  nothing a probe could ask (its training script is the user's), and its liveness is already
  watched: its ``Watch`` stream to the coordinator drops when the process dies, and a worker
  that stops reporting loses its leases at lease expiry, so the survivors go on without it
  and the controller replaces the failed pod. A liveness probe of ours would add only wrong
  kills: a long step, a state transfer to a newcomer or a checkpoint load looks like a hang
  from outside, and each kill is charged to the job's restart budget.
"""

from __future__ import annotations

import copy
import shlex
from collections.abc import Mapping, Sequence
from pathlib import PurePosixPath
from typing import Any

from edl_scheduler.api import API_VERSION, KIND, Framework, ReplicaResources, TrainingJob
from edl_scheduler.api.spec import StateKind, Strategy
from edl_scheduler.controller.config import ControllerConfig
from edl_scheduler.controller.naming import (
    ANNOTATION_COORDINATOR_ARGS,
    ANNOTATION_COORDINATOR_PORT,
    GPU_RESOURCE,
    LABEL_JOB,
    LABEL_MANAGED,
    LABEL_ROLE,
    ROLE_COORDINATOR,
    ROLE_CREDENTIAL,
    STATE_ENV,
    STATE_KEY,
    TLS_KEY_KEY,
    TOKEN_KEY,
    coordinator_name,
    credential_name,
    state_config_map_name,
    tls_secret_name,
)
from edl_scheduler.controller.probing import health_probes, interpreter_of
from edl_scheduler.core import Role
from trainer_runtime.protocol.credentials import JOB_IDENTITY_ENV, TRUSTED_KEY_ENV, JobCredentials
from trainer_runtime.protocol.options import options_problem
from trainer_runtime.protocol.tls import CERT_ENV as TLS_CERT_ENV
from trainer_runtime.protocol.tls import KEY_ENV as TLS_KEY_ENV

Manifest = dict[str, Any]

#: Where a coordinator with ``state.kind: volume`` keeps its state inside its pod.
VOLUME_MOUNT = "/var/lib/edl"
#: Seeds a file from the saved state, then runs the coordinator with ``--state-file``; the
#: coordinator's own arguments follow as "$0" "$@".
_SEED_STATE = (
    'd="$(mktemp -d)" && printf "%s" "$' + STATE_ENV + '" > "$d/state.json" && '
    'exec "$0" "$@" --state-file "$d/state.json"'
)


#: The directory, inside the job's pods, under which a ``ps`` job's servers keep their
#: snapshots: it must lie on a volume the pod template mounts and every replica shares.
ANNOTATION_PS_SNAPSHOTS = "edl.dev/ps-snapshots"
#: What the replicas of a ``ps`` job are told: ``<that directory>/<the job's uid>``.
PS_SNAPSHOTS_ENV = "EDL_PS_SNAPSHOTS"
#: The directory, inside the job's pods, under which an allreduce job keeps its model while
#: it has no worker; optional; same rules as the snapshots' directory.
ANNOTATION_CHECKPOINTS = "edl.dev/checkpoints"
#: What the workers are told: ``<that directory>/<the job's uid>`` (the runtime's contract).
CHECKPOINTS_ENV = "EDL_CHECKPOINT_DIR"
#: The runtime's parameter server, run in the worker's image (which holds the runtime).
PSERVER_COMMAND = ("python", "-m", "trainer_runtime.ps")
#: Volume sources each pod gets its own copy of (or that live on one node): snapshots
#: written there are not seen by a server on another pod, so they cannot hold them.
_UNSHARED_VOLUMES = frozenset(
    {"emptyDir", "configMap", "secret", "downwardAPI", "projected", "hostPath", "ephemeral"}
)


class ShapingError(ValueError):
    """The job lacks something its objects need; the message names the field and the fix."""


def ps_snapshot_dir(tj: TrainingJob) -> str | None:
    """Where the replicas of a ``ps`` job keep the servers' snapshots (None for other jobs).

    A server that dies costs a rollback to the last snapshot every partition wrote, so the
    snapshots must outlive any pod and be read by servers and workers on any node: a
    directory on a volume the job's template mounts (a ReadWriteMany claim), named by the
    annotation ``edl.dev/ps-snapshots``. A ConfigMap, as for the coordinator's state, cannot
    hold them: they are the model's parameters and momentum (1 MiB is a ConfigMap's limit).
    Raises ``ShapingError`` naming the field and the fix."""
    if tj.spec.strategy is not Strategy.PS:
        return None
    return _shared_directory(tj, ANNOTATION_PS_SNAPSHOTS, "its servers' snapshots", "servers")


def checkpoint_dir(tj: TrainingJob) -> str | None:
    """Where an allreduce job keeps its model while it has no worker (suspended, or
    preempted whole): the annotation ``edl.dev/checkpoints`` names a directory on a volume
    every replica shares, and the workers are told ``EDL_CHECKPOINT_DIR`` (docs/runtime.md,
    "Suspension to zero workers"). Optional: without it such a job restarts its model when
    it resumes, and says so. Raises ``ShapingError`` naming the field and the fix when the
    directory is named but unusable."""
    if ANNOTATION_CHECKPOINTS not in tj.metadata.annotations:
        return None
    return _shared_directory(tj, ANNOTATION_CHECKPOINTS, "its model while suspended", "workers")


def _shared_directory(tj: TrainingJob, annotation: str, keeps: str, writers: str) -> str:
    """The directory an annotation names, checked to lie on a read-write volume that every
    replica shares, plus the job's uid (a job re-created under the same name never reads the
    old one's files)."""
    field = f"metadata.annotations[{annotation!r}]"
    raw = tj.metadata.annotations.get(annotation)
    if not raw:
        raise ShapingError(
            f"{field} is missing: this job keeps {keeps} in a directory every replica "
            "shares; mount a ReadWriteMany volume in spec.template (spec.volumes and "
            "containers[0].volumeMounts) and name a directory on it, e.g. '/snapshots'"
        )
    path = PurePosixPath(raw)
    if not path.is_absolute() or ".." in path.parts:
        raise ShapingError(f"{field} {raw!r} must be an absolute path without '..'")
    spec = tj.spec.template.spec.model_dump(mode="json", by_alias=True, exclude_none=True)
    mounts = [
        m
        for m in spec["containers"][0].get("volumeMounts") or []
        if path == PurePosixPath(m.get("mountPath", ""))
        or PurePosixPath(m.get("mountPath", "")) in path.parents
    ]
    if not mounts:
        raise ShapingError(
            f"{field} {raw!r} lies on no volume: mount a volume every replica shares (a "
            "ReadWriteMany persistentVolumeClaim) at or above it in "
            "spec.template.spec.containers[0].volumeMounts"
        )
    mount = max(mounts, key=lambda m: len(PurePosixPath(m["mountPath"]).parts))
    volume = next(
        (v for v in spec.get("volumes") or [] if v.get("name") == mount.get("name")), None
    )
    if volume is None:
        raise ShapingError(
            f"spec.template.spec.volumes has no volume {mount.get('name')!r}, which "
            f"containers[0] mounts at {mount['mountPath']!r}: add it"
        )
    kinds = sorted(set(volume) - {"name"})
    if set(kinds) & _UNSHARED_VOLUMES:
        raise ShapingError(
            f"{field} {raw!r} lies on volume {volume['name']!r} ({', '.join(kinds)}), which "
            "is not shared by every pod on every node: use a volume every replica shares (a "
            "ReadWriteMany persistentVolumeClaim, nfs, ...)"
        )
    if mount.get("readOnly"):
        raise ShapingError(
            f"{field} {raw!r} lies on a read-only mount ({mount['mountPath']!r}): the "
            f"{writers} write there; mount it read-write"
        )
    if not tj.metadata.uid:
        raise ShapingError(f"TrainingJob {tj.key} has no metadata.uid: read it from the API")
    return str(path / tj.metadata.uid)


def owner_reference(tj: TrainingJob) -> Manifest:
    if not tj.metadata.uid:
        raise ShapingError(f"TrainingJob {tj.key} has no metadata.uid: read it from the API")
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "name": tj.metadata.name,
        "uid": tj.metadata.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def labels_for(tj: TrainingJob, role: str) -> dict[str, str]:
    return {LABEL_JOB: tj.metadata.name, LABEL_ROLE: role, LABEL_MANAGED: "true"}


def _metadata(
    tj: TrainingJob, name: str, role: str, extra_labels: Mapping[str, str] | None = None
) -> Manifest:
    return {
        "name": name,
        "namespace": tj.metadata.namespace,
        "labels": dict(extra_labels or {}) | labels_for(tj, role),
        "ownerReferences": [owner_reference(tj)],
    }


def _resources(res: ReplicaResources) -> Manifest:
    requests: dict[str, str] = {}
    limits: dict[str, str] = {}
    if res.gpu:
        requests[GPU_RESOURCE] = limits[GPU_RESOURCE] = str(res.gpu)
    if res.cpu is not None:
        requests["cpu"] = str(res.cpu)
    if res.memory is not None:
        requests["memory"] = str(res.memory)
    out: Manifest = {}
    if requests:
        out["requests"] = requests
    if limits:
        out["limits"] = limits
    return out


def coordinator_address(tj: TrainingJob, port: int, config: ControllerConfig) -> str:
    """host:port where the job's workers and the controller reach its coordinator."""
    host = config.coordinator_host
    if host is None:
        host = f"{coordinator_name(tj.metadata.name)}.{tj.metadata.namespace}.svc"
    return f"{host}:{port}"


def trust_env(credentials: JobCredentials) -> list[Manifest]:
    """What lets a coordinator or a parameter server check the job's credentials (the
    runtime's ``EDL_TRUSTED_KEY`` and ``EDL_JOB_IDENTITY``; public values)."""
    return [
        {"name": TRUSTED_KEY_ENV, "value": credentials.issuer.public_text()},
        {"name": JOB_IDENTITY_ENV, "value": credentials.job},
    ]


def tls_env(tj: TrainingJob, config: ControllerConfig, server: bool) -> list[Manifest]:
    """The runtime's TLS variables when the deployment turns TLS on: the job's certificate
    for every process; its key, from the job's TLS Secret, for its servers only."""
    tls = config.tls_for(tj.metadata.uid or "")
    if tls is None:
        return []
    env: list[Manifest] = [{"name": TLS_CERT_ENV, "value": tls.cert_pem}]
    if server:
        ref = {"name": tls_secret_name(tj.metadata.name), "key": TLS_KEY_KEY}
        env.append({"name": TLS_KEY_ENV, "valueFrom": {"secretKeyRef": ref}})
    return env


def tls_secret(tj: TrainingJob, config: ControllerConfig) -> Manifest | None:
    """The Secret with the key of the job's TLS certificate, when TLS is on."""
    tls = config.tls_for(tj.metadata.uid or "")
    if tls is None or tls.key_pem is None:
        return None
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": _metadata(tj, tls_secret_name(tj.metadata.name), ROLE_COORDINATOR),
        "stringData": {TLS_KEY_KEY: tls.key_pem},
    }


def credentials_of(tj: TrainingJob, config: ControllerConfig) -> JobCredentials:
    meta = tj.metadata
    return config.credentials_for(meta.namespace, meta.name, meta.uid or "")


def credential_secret(tj: TrainingJob, pod: str, role: Role, config: ControllerConfig) -> Manifest:
    """The Secret with the credential of the replica ``pod`` (a worker's or a server's, for
    its own worker id). Owned by the job like its pods, it goes with the job: the
    controller never deletes (nor reads) a Secret."""
    credentials = credentials_of(tj, config)
    issued = credentials.server(pod) if role is Role.PSERVER else credentials.worker(pod)
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": _metadata(tj, credential_name(pod), ROLE_CREDENTIAL),
        "stringData": {TOKEN_KEY: issued},
    }


def replica_pod(
    tj: TrainingJob,
    name: str,
    node: str,
    role: Role,
    address: str,
    config: ControllerConfig,
) -> Manifest:
    """A worker or parameter-server pod on ``node``, from the job's template; its
    credential comes from ``credential_secret(tj, name, ...)``, created before it. A
    parameter server listens on ``config.pserver_port`` (probed), or on any free port (0:
    not probed)."""
    template = tj.spec.template.model_dump(
        mode="json", by_alias=True, exclude_none=True, exclude_unset=True
    )
    spec: Manifest = copy.deepcopy(template.get("spec", {}))
    tmeta: Mapping[str, Any] = template.get("metadata", {}) or {}
    meta = _metadata(tj, name, role.value, tmeta.get("labels"))
    if tmeta.get("annotations"):
        meta["annotations"] = dict(tmeta["annotations"])
    res = tj.spec.resources
    if role is Role.PSERVER and tj.spec.pserver is not None:
        res = tj.spec.pserver.resources
    containers: list[Manifest] = spec["containers"]
    main = containers[0]
    main["resources"] = _resources(res)
    token: Manifest = {
        "name": "EDL_JOB_TOKEN",
        "valueFrom": {"secretKeyRef": {"name": credential_name(name), "key": TOKEN_KEY}},
    }
    contract: list[Manifest] = [
        {"name": "EDL_COORDINATOR", "value": address},
        token,
        {"name": "EDL_JOB_ID", "value": tj.metadata.name},
        {"name": "EDL_WORKER_ID", "value": name},
        {"name": "EDL_NODE_NAME", "value": node},
        {"name": "EDL_WORKER_HOST", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        {"name": "EDL_ROLE", "value": role.value},
    ]
    if role is Role.PSERVER:
        contract += trust_env(credentials_of(tj, config))
    contract += tls_env(tj, config, server=role is Role.PSERVER)
    snapshots = ps_snapshot_dir(tj)
    if snapshots is not None:
        contract.append({"name": PS_SNAPSHOTS_ENV, "value": snapshots})
    checkpoints = checkpoint_dir(tj)
    if checkpoints is not None:
        contract.append({"name": CHECKPOINTS_ENV, "value": checkpoints})
    ours = {e["name"] for e in contract}
    main["env"] = [e for e in main.get("env", []) if e.get("name") not in ours] + contract
    if role is Role.PSERVER:
        # The server, not the training script: the template's image, environment and
        # mounts, none of its other containers or probes (they watch the training script).
        pserver_port = config.pserver_port
        main["command"] = [
            *PSERVER_COMMAND,
            "--host", "$(EDL_WORKER_HOST)",
            "--port", str(pserver_port),
            "--snapshot-dir", f"$({PS_SNAPSHOTS_ENV})",
        ]  # fmt: skip
        for key in ("args", "livenessProbe", "readinessProbe", "startupProbe"):
            main.pop(key, None)
        if pserver_port:
            python = interpreter_of(PSERVER_COMMAND)
            main |= health_probes(pserver_port, python, host_env="EDL_WORKER_HOST")
        spec["containers"] = [main]
    spec["nodeName"] = node
    spec["restartPolicy"] = "Never"
    spec.pop("schedulerName", None)
    if tj.spec.priority_class_name is not None:
        spec["priorityClassName"] = tj.spec.priority_class_name
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def coordinator_args(tj: TrainingJob) -> list[str]:
    """The dataset options of the job's coordinator, from its annotation, as the
    coordinator accepts them (``trainer_runtime.protocol.options``): checked when the job
    is observed, so that a job the coordinator would refuse is never started."""
    raw = tj.metadata.annotations.get(ANNOTATION_COORDINATOR_ARGS)
    if not raw:
        raise ShapingError(
            f"metadata.annotations[{ANNOTATION_COORDINATOR_ARGS!r}] is missing: give the "
            "coordinator's dataset options, e.g. '--samples 50000 --epochs 3'"
        )
    try:
        args = shlex.split(raw)
    except ValueError as error:
        raise ShapingError(
            f"metadata.annotations[{ANNOTATION_COORDINATOR_ARGS!r}] is not valid shell "
            f"quoting ({error}): fix the quotes"
        ) from None
    problem = options_problem(args)
    if problem is not None:
        raise ShapingError(
            f"metadata.annotations[{ANNOTATION_COORDINATOR_ARGS!r}]: the coordinator refuses "
            f"them ({problem}): give its dataset options, e.g. '--samples 50000 --epochs 3'"
        )
    return args


def coordinator_pod(
    tj: TrainingJob,
    node: str,
    port: int,
    config: ControllerConfig,
    saved_state: str | None,
) -> Manifest:
    """The job's coordinator on ``node``. With ``state.kind: snapshot`` a replacement starts
    from ``saved_state`` (the last snapshot the controller kept); with ``volume`` it reads and
    writes its state on the claim the job names."""
    name = coordinator_name(tj.metadata.name)
    mode = "independent" if tj.spec.framework is Framework.NONE else "group"
    argv = [
        *config.coordinator_command,
        "--host",
        config.coordinator_bind,
        "--port",
        str(port),
        "--mode",
        mode,
        *coordinator_args(tj),
    ]
    container: Manifest = {
        "name": "coordinator",
        "image": tj.spec.coordinator_image,
        "env": [*trust_env(credentials_of(tj, config)), *tls_env(tj, config, server=True)],
        "ports": [{"name": "grpc", "containerPort": port}],
        "resources": {
            "requests": {"cpu": config.coordinator_cpu, "memory": config.coordinator_memory}
        },
        **health_probes(
            port, interpreter_of(config.coordinator_command), host=config.coordinator_bind
        ),
    }
    spec: Manifest = {"nodeName": node, "restartPolicy": "Never", "containers": [container]}
    state = tj.spec.coordinator.state
    if state.kind is StateKind.VOLUME:
        container["command"] = [*argv, "--state-file", f"{VOLUME_MOUNT}/state.json"]
        container["volumeMounts"] = [{"name": "state", "mountPath": VOLUME_MOUNT}]
        spec["volumes"] = [
            {"name": "state", "persistentVolumeClaim": {"claimName": state.claim_name}}
        ]
    elif saved_state:
        container["command"] = ["sh", "-c", _SEED_STATE, *argv]
        container["env"].append({"name": STATE_ENV, "value": saved_state})
    else:
        container["command"] = argv
    tolerations = tj.spec.template.spec.model_dump(mode="json", by_alias=True, exclude_none=True)
    for key in ("tolerations", "nodeSelector"):
        if tolerations.get(key):
            spec[key] = tolerations[key]
    if tj.spec.priority_class_name is not None:
        spec["priorityClassName"] = tj.spec.priority_class_name
    meta = _metadata(tj, name, ROLE_COORDINATOR)
    meta["annotations"] = {ANNOTATION_COORDINATOR_PORT: str(port)}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def coordinator_service(tj: TrainingJob, port: int) -> Manifest:
    name = coordinator_name(tj.metadata.name)
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(tj, name, ROLE_COORDINATOR),
        "spec": {
            "selector": {LABEL_JOB: tj.metadata.name, LABEL_ROLE: ROLE_COORDINATOR},
            "ports": [{"name": "grpc", "port": port, "targetPort": port}],
            # Reached as soon as it listens, not one readiness period later (``probing``).
            "publishNotReadyAddresses": True,
        },
    }


def state_config_map(tj: TrainingJob, state: str) -> Manifest:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _metadata(tj, state_config_map_name(tj.metadata.name), ROLE_COORDINATOR),
        "data": {STATE_KEY: state},
    }


def free_port(used: Sequence[int], config: ControllerConfig) -> int:
    """The port of a new coordinator: the shared one, or the lowest one no coordinator
    holds."""
    ports = config.coordinator_ports
    if ports.shared:
        return ports.first
    taken = set(used)
    for port in range(ports.first, ports.last + 1):
        if port not in taken:
            return port
    raise ShapingError(
        f"every port of --coordinator-ports {ports.first}-{ports.last} is taken by a "
        "coordinator: widen the range"
    )
