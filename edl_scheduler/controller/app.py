"""The kopf operator: watches, indexes, the planning loop's start and stop, and the CLI.

kopf does the watching: cluster-wide indexes of Nodes, Pods (all of them, so that what other
workloads use is counted), TrainingJobs and PriorityClasses, kept current from the watch
streams. kopf calls no regular handler before every index has its initial listing, so the
first event handler call means the whole world has been seen once: only then may the loop
plan (planning on a partial listing would create duplicate workers after a restart). Every
event marks the world dirty. kopf's peering is off (standalone): leader election is ours
(``leading``). Nothing here writes to Kubernetes.

The watches stay cluster-wide, whatever ``--namespace`` says: what pods of every namespace
take on a node is what the planner may not hand out. The namespaces not served are fenced
off as the objects arrive (``fencing``): their TrainingJobs are never indexed.
"""

from __future__ import annotations

import asyncio
import logging
import os
import pickle
import shlex
import socket
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import click
import kopf
import kubernetes

from edl_scheduler.api import GROUP, PLURAL, VERSION, TrainingJobError
from edl_scheduler.api.policy import load_policy_config
from edl_scheduler.controller.config import (
    ConfigError,
    ControllerConfig,
    PortRange,
    ServedNamespaces,
    parse_labels,
)
from edl_scheduler.controller.fencing import FencedKube, NamespaceFence
from edl_scheduler.controller.kubeapi import FaultyKube, Kube
from edl_scheduler.controller.looping import PlanningLoop, World
from edl_scheduler.controller.metrics import Metrics, serve
from edl_scheduler.controller.podstate import left_for_good
from edl_scheduler.controller.vetting import PodField
from edl_scheduler.core import preset
from edl_scheduler.core.building import policy_from_config

log = logging.getLogger("edl.controller")

_RESOURCES: dict[str, tuple[str, ...]] = {
    "nodes": ("v1", "nodes"),
    "pods": ("v1", "pods"),
    "jobs": (GROUP, VERSION, PLURAL),
    "priority_classes": ("scheduling.k8s.io", "v1", "priorityclasses"),
}


def _values(index: Any) -> Iterable[dict[str, Any]]:
    for store in list(index.values()):
        yield from list(store)


def build_registry(config: ControllerConfig, kube: Kube, metrics: Metrics) -> kopf.OperatorRegistry:
    registry = kopf.OperatorRegistry()
    holder: dict[str, Any] = {}
    fence = NamespaceFence(config.namespaces)

    def keep(body: kopf.Body, **_: Any) -> dict[tuple[str | None, str], dict[str, Any]]:
        loop = holder.get("loop")
        if loop is not None:
            loop.mark_dirty()
        meta = body.get("metadata", {})
        return {(meta.get("namespace"), meta.get("name")): _plain(body)}

    def keep_pod(body: kopf.Body, **_: Any) -> dict[tuple[str | None, str], dict[str, Any]]:
        return {key: fence.pod(pod) for key, pod in keep(body).items()}

    def keep_job(body: kopf.Body, **_: Any) -> dict[tuple[str | None, str], dict[str, Any]]:
        if not fence.admits_job(body):
            return {}  # not indexed: never planned, never written to
        # A job the controller never wrote a status for is new: it waits for a plan.
        loop = holder.get("loop")
        if loop is not None and not (body.get("status") or {}).get("phase"):
            meta = body.get("metadata", {})
            # When the watch delivered it: the first step of its admission's latency.
            log.info("new TrainingJob %s/%s seen", meta.get("namespace"), meta.get("name"))
            loop.mark_urgent()
        return keep(body)

    keepers = {"jobs": keep_job, "pods": keep_pod}
    for name, resource in _RESOURCES.items():
        kopf.index(*resource, id=name, registry=registry)(keepers.get(name, keep))

    async def seen(**_: Any) -> None:
        loop = holder.get("loop")
        if loop is not None:
            loop.synced.set()
            loop.mark_dirty()

    async def pod_seen(type: str | None, body: kopf.Body, **_: Any) -> None:
        await seen()
        loop = holder.get("loop")
        if loop is not None and left_for_good(body, deleted=type == "DELETED"):
            # A victim's room is free: the job it was taken for is created now, not after
            # --min-period.
            loop.mark_urgent()

    for name, resource in _RESOURCES.items():
        handler = pod_seen if name == "pods" else seen
        kopf.on.event(*resource, id=f"{name}-event", registry=registry)(handler)

    @kopf.on.login(registry=registry)
    def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
        if os.environ.get("KUBECONFIG"):
            return kopf.login_with_kubeconfig(**kwargs)
        return kopf.login_with_service_account(**kwargs)

    @kopf.on.startup(registry=registry)
    async def startup(settings: kopf.OperatorSettings, **kwargs: Any) -> None:
        settings.posting.enabled = False
        settings.scanning.disabled = True
        settings.watching.server_timeout = config.watch_timeout_s
        settings.watching.client_timeout = config.watch_timeout_s + 30
        indices = {name: kwargs[name] for name in _RESOURCES}

        def world() -> World:
            classes: dict[str, int] = {}
            for pc in _values(indices["priority_classes"]):
                classes[str(pc["metadata"]["name"])] = int(pc.get("value", 0))
            return World(
                nodes=list(_values(indices["nodes"])),
                pods=list(_values(indices["pods"])),
                jobs=list(_values(indices["jobs"])),
                priority_classes=classes,
            )

        loop = PlanningLoop(config, kube, world, metrics)
        holder["loop"] = loop
        holder["task"] = asyncio.create_task(loop.run(), name="planning-loop")
        holder["web"] = await serve(
            metrics, config.metrics_host, config.metrics_port, config.liveness_stale_s
        )
        served = config.namespaces.names
        log.info(
            "controller %s started; it acts in %s, never in kube-system",
            config.identity,
            f"namespaces {', '.join(sorted(served))}" if served else "every namespace",
        )

    @kopf.on.cleanup(registry=registry)
    async def cleanup(**_: Any) -> None:
        # A graceful stop (SIGTERM: a rolling update, a drained node): the cycle in flight
        # finishes, its statuses and Events are written, then the Lease is given up so that
        # a standby leads at once. If either does not end in time, the Lease is left to lapse
        # (the old leader may still write).
        loop = holder.get("loop")
        task = holder.get("task")
        ended = task is None
        if loop is not None:
            loop.stop()
        if task is not None and loop is not None and not loop.synced.is_set():
            task.cancel()  # it never planned: nothing of it is in flight
            ended = True
        elif task is not None:
            try:
                await asyncio.wait_for(asyncio.shield(task), timeout=STOP_TIMEOUT_S)
                ended = True
            except TimeoutError:
                log.warning("the cycle in flight did not end in %.0f s", STOP_TIMEOUT_S)
                task.cancel()
            except Exception:
                log.exception("the planning loop failed while stopping")
                ended = True
        if loop is not None:
            flushed = await asyncio.to_thread(loop.actuator.writer.flush, STOP_TIMEOUT_S)
            if not flushed:
                log.warning("statuses or Events still unwritten after %.0f s", STOP_TIMEOUT_S)
            loop.actuator.close()
            if ended and flushed:
                await asyncio.to_thread(loop.release_lease, STOP_TIMEOUT_S)
        web = holder.get("web")
        if web is not None:
            await web.cleanup()

    return registry


def _plain(body: kopf.Body) -> dict[str, Any]:
    """A detached copy of a watched object (kopf's Body is a live view). Through pickle: the
    object is plain JSON data, and this copies it about seven times faster than
    ``copy.deepcopy``, which was most of the time kopf's threads spent on a busy watch."""
    raw = getattr(body, "_src", None)
    copied: dict[str, Any] = pickle.loads(
        pickle.dumps(dict(raw if raw is not None else body), pickle.HIGHEST_PROTOCOL)
    )
    return copied


#: Connections kept open to the API server: the actuator's 16 threads, the progress poller,
#: the leader check and the reservations' store at once. The client's default (5 per CPU,
#: 10 on 2 cores) made every write past the tenth open a new TLS connection and drop it.
API_CONNECTIONS = 32

#: How long a graceful stop waits for each of its three steps (the cycle in flight, its
#: status writes, the lease thread): all three stay inside the Deployment's
#: terminationGracePeriodSeconds (30).
STOP_TIMEOUT_S = 8.0


def _api_client(kubeconfig: Path | None) -> kubernetes.client.ApiClient:
    cfg = kubernetes.client.Configuration()
    if kubeconfig is not None:
        kubernetes.config.load_kube_config(  # type: ignore[no-untyped-call]
            config_file=str(kubeconfig), client_configuration=cfg
        )
    else:
        kubernetes.config.load_incluster_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
    cfg.connection_pool_maxsize = API_CONNECTIONS
    return kubernetes.client.ApiClient(cfg)


@click.command(name="edl-controller")
@click.option(
    "--kubeconfig",
    type=click.Path(exists=True, path_type=Path),
    help="Kubeconfig file; default: the pod's service account.",
)
@click.option(
    "--policy",
    "policy_file",
    type=click.Path(exists=True, path_type=Path),
    help="Policy file (a preset and overrides); default: the edl preset.",
)
@click.option(
    "--token-key-file",
    type=click.Path(exists=True, path_type=Path),
    required=True,
    help="Random bytes from which each job's signing key (and TLS certificate) is derived.",
)
@click.option("--identity", default=None, help="This replica's name in the Lease (hostname).")
@click.option("--lease-namespace", default="edl-system", show_default=True)
@click.option("--lease-name", default="edl-controller", show_default=True)
@click.option("--lease-duration", type=float, default=10.0, show_default=True)
@click.option("--metrics-host", default="0.0.0.0", show_default=True)
@click.option("--metrics-port", type=int, default=8080, show_default=True)
@click.option("--min-period", type=float, default=0.3, show_default=True)
@click.option("--max-period", type=float, default=3.0, show_default=True)
@click.option(
    "--coordinator-command",
    default="python -m trainer_runtime.coordinator",
    show_default=True,
    help="The coordinator's command line before its options.",
)
@click.option("--coordinator-bind", default="0.0.0.0", show_default=True)
@click.option(
    "--coordinator-host",
    default=None,
    help="Reach coordinators at this host instead of their Service (one-host clusters).",
)
@click.option(
    "--coordinator-ports",
    default="7070",
    show_default=True,
    help="A port, or a range A-B giving each job its own (one-host clusters).",
)
@click.option(
    "--inject-api-faults",
    type=float,
    default=0.0,
    hidden=True,
    help="Chaos testing: fail this share of API requests (409, 429, 5xx).",
)
@click.option(
    "--watch-timeout",
    type=int,
    default=120,
    show_default=True,
    help="Seconds after which the API server ends each watch (it is renewed).",
)
@click.option(
    "--allow-pod-field",
    "allowed_pod_fields",
    multiple=True,
    type=click.Choice([f.value for f in PodField]),
    help="Let jobs' pod templates use this field (refused by default; repeat for several).",
)
@click.option(
    "--tls",
    is_flag=True,
    help="TLS between each job's pods, its coordinator and the controller (a certificate per "
    "job, pinned by its clients).",
)
@click.option(
    "--namespace",
    "namespaces",
    multiple=True,
    help="Act only on TrainingJobs in this namespace (repeat for several); default: every "
    "namespace but kube-system, which is never served. Each needs its RoleBinding.",
)
@click.option(
    "--network-policies/--no-network-policies",
    default=True,
    show_default=True,
    help="Give each job a NetworkPolicy that admits only its pods and the controller's to "
    "its coordinator and parameter servers (off where no CNI enforces them).",
)
@click.option(
    "--operator-namespace-labels",
    default=None,
    help="key=value,... of the controller's namespace, admitted by the jobs' NetworkPolicies; "
    "default: kubernetes.io/metadata.name=<--lease-namespace>.",
)
@click.option(
    "--operator-pod-labels",
    default="app.kubernetes.io/name=edl-controller,app.kubernetes.io/component=controller",
    show_default=True,
    help="key=value,... of the controller's pods, admitted by the jobs' NetworkPolicies.",
)
@click.option(
    "--pserver-port",
    type=click.IntRange(0, 65535),
    default=7071,
    show_default=True,
    help="The port parameter servers listen on (probed); 0: any, unprobed (one-host clusters).",
)
@click.option("-v", "--verbose", is_flag=True)
def main(
    kubeconfig: Path | None,
    policy_file: Path | None,
    token_key_file: Path,
    identity: str | None,
    lease_namespace: str,
    lease_name: str,
    lease_duration: float,
    metrics_host: str,
    metrics_port: int,
    min_period: float,
    max_period: float,
    coordinator_command: str,
    coordinator_bind: str,
    coordinator_host: str | None,
    coordinator_ports: str,
    inject_api_faults: float,
    watch_timeout: int,
    allowed_pod_fields: tuple[str, ...],
    tls: bool,
    namespaces: tuple[str, ...],
    network_policies: bool,
    operator_namespace_labels: str | None,
    operator_pod_labels: str,
    pserver_port: int,
    verbose: bool,
) -> None:
    """Run the EDL operator: watch the cluster, plan, and act on TrainingJobs."""
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
    )
    logging.getLogger("kopf").setLevel(logging.WARNING)
    try:
        policy = preset("edl")
        if policy_file is not None:
            policy = policy_from_config(load_policy_config(policy_file.read_text()))
        key = token_key_file.read_bytes().strip()
        if len(key) < 16:
            raise ConfigError(
                f"--token-key-file {token_key_file}: {len(key)} bytes; give at least 16 "
                "random bytes"
            )
        config = ControllerConfig(
            policy=policy,
            token_key=key,
            identity=identity or socket.gethostname(),
            lease_name=lease_name,
            lease_namespace=lease_namespace,
            lease_duration_s=lease_duration,
            min_period_s=min_period,
            max_period_s=max_period,
            coordinator_command=tuple(shlex.split(coordinator_command)),
            coordinator_bind=coordinator_bind,
            coordinator_host=coordinator_host,
            coordinator_ports=PortRange.parse(coordinator_ports),
            metrics_host=metrics_host,
            metrics_port=metrics_port,
            watch_timeout_s=watch_timeout,
            allowed_pod_fields=frozenset(PodField(f) for f in allowed_pod_fields),
            tls=tls,
            namespaces=ServedNamespaces.parse(namespaces),
            network_policies=network_policies,
            operator_namespace_labels=parse_labels(
                operator_namespace_labels, "--operator-namespace-labels"
            )
            if operator_namespace_labels
            else (),
            operator_pod_labels=parse_labels(operator_pod_labels, "--operator-pod-labels"),
            pserver_port=pserver_port,
        )
    except (ConfigError, TrainingJobError) as error:
        raise click.UsageError(str(error)) from None
    if kubeconfig is not None:
        os.environ["KUBECONFIG"] = str(kubeconfig)
    client = _api_client(kubeconfig)
    kube = FaultyKube(client, inject_api_faults) if inject_api_faults > 0 else Kube(client)
    kube = FencedKube(kube, config.namespaces, config.lease_namespace)
    metrics = Metrics()
    registry = build_registry(config, kube, metrics)
    kopf.run(registry=registry, clusterwide=True, standalone=True)
