"""The operator's settings, in one frozen value that every module reads.

Why this exists: the entry point parses the command line once; everything else receives a
``ControllerConfig`` and never reads the environment or global state. What must stay true:
the defaults are what a cluster admin deploys (coordinators reached through their Service,
one port for all, binding every interface of the pod); the single-host knobs
(``coordinator_host``, a port range) exist for clusters whose pods share one address, such as
the kubelet in miniature of the tests. The controller acts only in the namespaces it serves
(``ServedNamespaces``), never in kube-system, whatever it is told.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Final

from edl_scheduler.controller.vetting import PodField
from edl_scheduler.core import Policy, preset
from trainer_runtime.protocol.credentials import Issuer, JobCredentials
from trainer_runtime.protocol.tls import JobTls


class ConfigError(ValueError):
    """A setting is malformed; the message names the option and the fix."""


@dataclass(frozen=True, slots=True)
class PortRange:
    """Ports coordinators listen on: one port shared by all (pods have addresses of their
    own) or a range, each job taking the lowest free port (pods share one address)."""

    first: int
    last: int

    @classmethod
    def parse(cls, text: str) -> PortRange:
        try:
            first, _, last = text.partition("-")
            low, high = int(first), int(last or first)
        except ValueError:
            raise ConfigError(
                f"--coordinator-ports {text!r} is not a port or a range: write 7070 or 21000-21999"
            ) from None
        if not 0 < low <= high < 65536:
            raise ConfigError(
                f"--coordinator-ports {text!r}: ports must lie in 1-65535, lowest first"
            )
        return cls(low, high)

    @property
    def shared(self) -> bool:
        return self.first == self.last


#: Namespaces the controller never acts in, whatever it is told: the cluster's own
#: components live there, and a pod created there by a job's author would run beside them.
NEVER_SERVED: Final = frozenset({"kube-system"})


@dataclass(frozen=True, slots=True)
class ServedNamespaces:
    """The namespaces whose TrainingJobs the controller acts on (``--namespace``).

    Empty ``names``: every namespace but ``NEVER_SERVED``. The RBAC is the other half: the
    controller may write only in the namespaces where a RoleBinding grants it the ClusterRole
    ``edl-operator-workloads`` (docs/deploy.md). What must stay true: ``refusal`` answers
    for every namespace in ``NEVER_SERVED``, and ``parse`` never accepts one."""

    names: frozenset[str] = frozenset()

    @classmethod
    def parse(cls, names: Iterable[str]) -> ServedNamespaces:
        given = frozenset(n.strip() for n in names)
        never = sorted(given & NEVER_SERVED)
        if never:
            raise ConfigError(
                f"--namespace {never[0]}: the controller never acts in {never[0]} (the "
                "cluster's own components run there); run jobs in a namespace of their own"
            )
        if "" in given:
            raise ConfigError("--namespace '': give a namespace's name")
        return cls(given)

    def refusal(self, namespace: str) -> str | None:
        """Why the controller does not act in ``namespace``, or None where it does."""
        if namespace in NEVER_SERVED:
            return f"the controller never acts in {namespace}"
        if self.names and namespace not in self.names:
            return (
                f"namespace {namespace} is not served (edl-controller --namespace "
                f'{" --namespace ".join(sorted(self.names))}); docs/deploy.md, "Serving a '
                'namespace", says how to add it'
            )
        return None

    def serves(self, namespace: str) -> bool:
        return self.refusal(namespace) is None


def parse_labels(text: str, option: str) -> tuple[tuple[str, str], ...]:
    """``k=v,k2=v2`` as sorted pairs; raises ``ConfigError`` naming ``option``."""
    pairs: dict[str, str] = {}
    for item in (part.strip() for part in text.split(",")):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"{option} {text!r}: write labels as key=value,key2=value2")
        pairs[key.strip()] = value.strip()
    return tuple(sorted(pairs.items()))


@dataclass(frozen=True, slots=True)
class ControllerConfig:
    """Everything the operator is told at start."""

    policy: Policy = field(default_factory=lambda: preset("edl"))
    #: Key from which each job's token, and from it its signing key and TLS certificate,
    #: is derived (HMAC of the job's UID), so that the controller never needs to read a
    #: Secret back: it may only create them.
    token_key: bytes = b""
    #: Who this instance is, in the leader-election Lease.
    identity: str = "edl-controller"
    lease_name: str = "edl-controller"
    lease_namespace: str = "edl-system"
    lease_duration_s: float = 10.0
    #: Plan at most this often (events mark the world dirty in between) ...
    min_period_s: float = 0.3
    #: ... and at least this often, even when nothing was reported.
    max_period_s: float = 3.0
    #: How often each job's coordinator is asked for its progress.
    progress_period_s: float = 1.0
    #: How often a coordinator that has not answered yet is asked: a job's workers are
    #: created only once it answers, so this bounds what its start adds to admission.
    ready_probe_period_s: float = 0.1
    #: How often each job's coordinator state is copied into its ConfigMap.
    snapshot_period_s: float = 5.0
    #: How often a running job's attained GPU-time is written to its status.
    attained_period_s: float = 15.0
    #: The coordinator's command line, before its options.
    coordinator_command: tuple[str, ...] = ("python", "-m", "trainer_runtime.coordinator")
    #: The address the coordinator binds inside its pod.
    coordinator_bind: str = "0.0.0.0"
    #: Where coordinators are reached; None: through each job's Service DNS name.
    coordinator_host: str | None = None
    coordinator_ports: PortRange = PortRange(7070, 7070)
    coordinator_cpu: str = "100m"
    coordinator_memory: str = "256Mi"
    #: Deadline of one call to a coordinator.
    coordinator_timeout_s: float = 1.0
    metrics_host: str = "0.0.0.0"
    metrics_port: int = 8080
    #: The API server ends each watch after this long; kopf renews it (a dropped watch).
    watch_timeout_s: int = 120
    #: The liveness endpoint fails when no cycle has completed for this long.
    liveness_stale_s: float = 60.0
    #: Pod-template fields that widen what a pod may do on its node (``vetting``) which the
    #: admin allows jobs to use; the others make a job invalid.
    allowed_pod_fields: frozenset[PodField] = frozenset()
    #: TLS between each job's processes and to its coordinator (``--tls``): a certificate
    #: per job, derived like its signing key, that its clients pin.
    tls: bool = False
    #: Where the controller acts (and never in kube-system).
    namespaces: ServedNamespaces = ServedNamespaces()
    #: Whether each job gets a NetworkPolicy that lets only its own pods and the
    #: controller's reach its coordinator and parameter servers (``isolating``): off only
    #: where no CNI enforces NetworkPolicies.
    network_policies: bool = True
    #: The labels of the controller's namespace and pods, as the job's NetworkPolicy admits
    #: them; no namespace labels: ``kubernetes.io/metadata.name`` = ``lease_namespace``.
    operator_namespace_labels: tuple[tuple[str, str], ...] = ()
    operator_pod_labels: tuple[tuple[str, str], ...] = (
        ("app.kubernetes.io/component", "controller"),
        ("app.kubernetes.io/name", "edl-controller"),
    )
    #: The port parameter servers listen on, probed by the kubelet; 0: any free port and no
    #: probes (where every pod shares one address, as in the tests' kubelet in miniature).
    pserver_port: int = 7071

    def operator_namespace_selector(self) -> dict[str, str]:
        """The labels of the controller's own namespace."""
        labels = self.operator_namespace_labels
        return dict(labels) if labels else {"kubernetes.io/metadata.name": self.lease_namespace}

    def token_for(self, uid: str) -> str:
        """The job's token: derived, so a restarted controller knows it without reading the
        Secret it created."""
        if not self.token_key:
            raise ConfigError(
                "no token key: pass --token-key-file (a file of random bytes, e.g. a Secret "
                "mounted into the controller's pod)"
            )
        return hmac.new(self.token_key, uid.encode(), hashlib.sha256).hexdigest()

    def credentials_for(self, namespace: str, name: str, uid: str) -> JobCredentials:
        """The job's credentials: a signing key derived from its token, which never leaves
        the controller (pods get the public key and their own credential only), for the
        job's identity (namespace, name and uid: a job recreated under the same name
        refuses its predecessor's pods)."""
        return JobCredentials(Issuer.from_secret(self.token_for(uid)), f"{namespace}/{name}/{uid}")

    def tls_for(self, uid: str) -> JobTls | None:
        """The job's TLS key and certificate when TLS is on (``tls``); None otherwise."""
        return JobTls.derived(self.token_for(uid)) if self.tls else None
