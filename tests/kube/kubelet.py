"""The kubelet in miniature: runs the pods bound to the test cluster's nodes as local processes.

The test control plane has no kubelets (`testenv.py`). This plays one for every node it serves,
so that end-to-end tests run real coordinators and real training workers:

- a pod with `spec.nodeName` on a served node has each container's `command` + `args` run as
  a local process (`edl_scheduler.local.processes`, the process machinery of the local
  backend), in the pod's environment: `env` (values with `$(VAR)` expansion, and `valueFrom`
  fieldRef, secretKeyRef, configMapKeyRef, resourceFieldRef), `envFrom`, and service links;
- its status is reported through the status subresource as a kubelet would: Running (podIP
  127.0.0.1, container statuses), then Succeeded or Failed with each container's exit code in
  `state.terminated`; restartPolicy OnFailure and Always restart a container with a short
  back-off and count its restarts;
- a deleted pod's processes get SIGTERM, then SIGKILL after the pod's grace period, and the
  pod is then force-deleted (grace 0, guarded by its uid), as a kubelet finishes a deletion;
- each served node keeps its Lease in kube-node-lease fresh and stays Ready without the
  not-ready or unreachable taints.

What differs from a real kubelet, on purpose: no images (a container must name its
`command`; otherwise it waits with reason CreateContainerError), no volumes, no probes, no
init containers (refused: the pod fails with reason UnsupportedInitContainers), and every pod
shares this machine's network: its IP is 127.0.0.1, so two pods listening on one port
collide, and a Service name does not resolve (`pod_environment.py` says what the
environment holds instead). What a pod's status holds is in `pod_status.py`; the nodes'
heartbeats are in `nodes.py`.

What must stay true:
- only processes this kubelet started are signalled (by the supervisor, by process group);
  `stop()` ends every one of them, within the pods' grace periods, and joins its threads;
- a status is written only to the pod (uid) whose processes it describes, never to a new pod
  that reuses the name;
- every wait is bounded; an API error while syncing one pod is logged and retried at the next
  sync, never fatal to the others.
"""

from __future__ import annotations

import logging
import math
import os
import signal
import threading
import time
from collections.abc import Collection, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kubernetes
from kubernetes.client import ApiException

from edl_scheduler.local.processes import (
    ProcessSpec,
    ProcessSupervisor,
    UnknownProcess,
)

from .listing import keep_listed
from .nodes import renew_node_lease, report_node_ready
from .pod_environment import ContainerConfigError, ContainerEnvironment, container_argv
from .pod_status import (
    ContainerRun,
    PodPhase,
    PodRun,
    now,
    phase,
    pod_status,
    should_restart,
    terminated,
)

log = logging.getLogger(__name__)

MERGE_PATCH = "application/merge-patch+json"

Obj = dict[str, Any]


@dataclass(slots=True)
class _Node:
    name: str
    uid: str
    failed: bool = False
    next_status_at: float = 0.0


class MiniKubelet:
    """Plays the kubelet for the nodes named in `nodes` (None: every node) that carry all of
    `node_labels`.

    Use as a context manager, or call `start()` and `stop()`. Threads: a watch of the pods
    bound to nodes, kept as the API's JSON; one
    sync loop that starts and restarts processes and decides each pod's status; a pool that
    writes statuses (one write in flight per pod); a pool that finishes deletions, so one
    pod's grace period never holds up the others; and one thread for the nodes' heartbeats.
    A settled pod is looked at again only when its object changes or a child exits, so a
    hundred nodes with hundreds of pods cost little when nothing happens.
    """

    def __init__(
        self,
        api_client: kubernetes.client.ApiClient,
        workdir: Path,
        *,
        nodes: Collection[str] | None = None,
        node_labels: Mapping[str, str] | None = None,
        sync_interval_s: float = 0.1,
        lease_interval_s: float = 5.0,
        node_status_interval_s: float = 30.0,
        lease_duration_s: int = 40,
        restart_backoff_s: float = 1.0,
    ) -> None:
        self.core = kubernetes.client.CoreV1Api(api_client)
        self.coordination = kubernetes.client.CoordinationV1Api(api_client)
        self.workdir = workdir
        self.only_nodes = frozenset(nodes) if nodes is not None else None
        self.node_labels = dict(node_labels or {})
        self.sync_interval_s = sync_interval_s
        self.lease_interval_s = lease_interval_s
        self.node_status_interval_s = node_status_interval_s
        self.lease_duration_s = lease_duration_s
        self.restart_backoff_s = restart_backoff_s
        self.supervisor = ProcessSupervisor()
        self.environment = ContainerEnvironment(self.core)
        self._lock = threading.Lock()
        self._seen: dict[str, Obj] = {}  # uid -> latest pod object from the watch
        self._pods: dict[str, PodRun] = {}  # uid -> what runs here
        #: (namespace, name) -> the directory and containers of the latest pod of that name
        #: run here, kept after deletion so that its logs can still be read.
        self._ran: dict[tuple[str, str], tuple[Path, list[str]]] = {}
        self._nodes: dict[str, _Node] = {}  # the nodes it serves, by name
        self._not_served: set[str] = set()  # the other nodes of the last listing
        self._nodes_listed_at = -math.inf
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._threads: list[threading.Thread] = []
        self._finishers = ThreadPoolExecutor(max_workers=16, thread_name_prefix="kubelet-delete")
        self._reporters = ThreadPoolExecutor(max_workers=8, thread_name_prefix="kubelet-status")
        self._reporting: set[str] = set()  # uids whose status write is in flight
        self._syncs = 0  # syncs completed, for `quiet`

    # -- lifecycle --------------------------------------------------------------------------

    def start(self) -> MiniKubelet:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._refresh_nodes(force=True)
        for target, name in (
            (self._watch_pods, "kubelet-watch"),
            (self._sync_loop, "kubelet-sync"),
            (self._heartbeat_loop, "kubelet-heartbeat"),
        ):
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def stop(self) -> None:
        """Stops every process it started (each pod's grace period, SIGKILL after it) and
        joins its threads. Pod objects are left as they are."""
        self._stopping.set()
        self._wake.set()
        for thread in self._threads:
            thread.join(timeout=15)
        self._finishers.shutdown(wait=True, cancel_futures=False)
        self._reporters.shutdown(wait=True, cancel_futures=True)
        with self._lock:
            graces = [self._grace_s(self._seen.get(uid)) for uid in self._pods]
        # SIGTERM to all at once, SIGKILL after the longest grace period (bounded).
        self.supervisor.close(grace_s=min(10.0, max(graces, default=1.0)))

    def __enter__(self) -> MiniKubelet:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- what tests may ask or do -----------------------------------------------------------

    def logs(self, namespace: str, name: str, container: str | None = None) -> str:
        """The output of a pod's container (the only one when `container` is None), as
        `kubectl logs` would show it; empty when it has not run here."""
        with self._lock:
            ran = self._ran.get((namespace, name))
        if ran is None:
            return ""
        directory, containers = ran
        path = directory / f"{containers[0] if container is None else container}.log"
        return path.read_text(errors="replace") if path.is_file() else ""

    def pids(self, namespace: str, name: str) -> dict[str, int]:
        """The running processes of a pod, by container name."""
        with self._lock:
            pods = [p for p in self._pods.values() if (p.namespace, p.name) == (namespace, name)]
            processes = {
                c.name: c.process for p in pods for c in p.containers.values() if c.process
            }
        pids = {}
        for container, process in processes.items():
            with suppress(UnknownProcess):
                status = self.supervisor.status(process)
                if status.running and status.pid is not None:
                    pids[container] = status.pid
        return pids

    def sees(self, namespace: str, name: str) -> bool:
        """Whether its watch has shown it a pod of that name bound to a node."""
        with self._lock:
            return any(
                (o["metadata"]["namespace"], o["metadata"]["name"]) == (namespace, name)
                for o in self._seen.values()
            )

    def quiet(self, syncs: int = 2, timeout_s: float = 20.0) -> None:
        """Returns once `syncs` more syncs have run and no status write is in flight: what
        it would do of what it sees now is done by then (a test that asserts it did nothing
        waits for this, not for a fixed time that a loaded machine may not give a sync)."""
        with self._lock:
            wanted = self._syncs + syncs
        deadline = time.monotonic() + timeout_s
        while True:
            self._wake.set()
            with self._lock:
                if self._syncs >= wanted and not self._reporting:
                    return
            if time.monotonic() > deadline:
                raise AssertionError(f"the kubelet did not sync {syncs} times in {timeout_s} s")
            time.sleep(0.02)

    def fail_node(self, name: str) -> None:
        """Plays a node that dies: its processes are SIGKILLed, its Lease and its pods'
        statuses are no longer updated (the pods stay as last reported, as they would)."""
        with self._lock:
            node = self._nodes.get(name)
            if node is not None:
                node.failed = True
            lost = [p for p in self._pods.values() if p.node == name]
            for pod in lost:
                pod.lost = True
        for pod in lost:
            for container in pod.containers.values():
                if container.process is not None:
                    # SIGKILL only: a machine that dies gives its processes no SIGTERM.
                    with suppress(UnknownProcess):
                        self.supervisor.signal(container.process, signal.SIGKILL)

    # -- watching ---------------------------------------------------------------------------

    def _watch_pods(self) -> None:
        """Keeps `_seen` equal to the pods bound to any node."""
        keep_listed(
            self.core.list_pod_for_all_namespaces,
            self._seen,
            self._lock,
            self._wake,
            self._stopping,
            field_selector="spec.nodeName!=",
        )

    # -- syncing ----------------------------------------------------------------------------

    def _sync_loop(self) -> None:
        while not self._stopping.is_set():
            self._wake.wait(self.sync_interval_s)
            self._wake.clear()
            if self._stopping.is_set():
                return
            try:
                self._sync()
            except Exception:
                log.exception("kubelet sync failed; retrying")
            with self._lock:
                self._syncs += 1

    def _sync(self) -> None:
        self.environment.forget_services()  # listed afresh, once per namespace and sync
        with self._lock:
            seen = dict(self._seen)
            pods = dict(self._pods)
        # A settled pod (its containers running or done, its status written) needs no look
        # unless its object changed or one of this process's children has exited.
        exited = _a_child_exited()
        for uid, obj in seen.items():
            pod = pods.get(uid)
            settled = pod is not None and not pod.pending and not exited
            if settled and pod is not None and pod.synced == obj["metadata"]["resourceVersion"]:
                continue
            node_name = obj["spec"]["nodeName"]
            if not self._serves(node_name):
                continue
            try:
                self._sync_pod(uid, obj)
            except ApiException as error:
                log.warning("syncing pod %s: %s", _key(obj), error)
        # Pods that vanished without a graceful deletion (force-deleted, or their node was
        # deleted and the pod garbage collector removed them): stop their processes.
        with self._lock:
            gone = [p for uid, p in self._pods.items() if uid not in seen and not p.terminating]
            for pod in gone:
                pod.terminating = True
        for pod in gone:
            self._finishers.submit(self._finish, pod, None, self._grace_s(None))

    def _serves(self, node_name: str) -> bool:
        if self.only_nodes is not None and node_name not in self.only_nodes:
            return False
        if node_name not in self._nodes and node_name not in self._not_served:
            self._refresh_nodes(force=False)  # a node it has not listed yet
        node = self._nodes.get(node_name)
        return node is not None and not node.failed

    def _sync_pod(self, uid: str, obj: Obj) -> None:
        with self._lock:
            pod = self._pods.get(uid)
        if pod is None:
            if obj.get("status", {}).get("phase") in ("Succeeded", "Failed"):
                return  # finished before this kubelet saw it: nothing to run
            pod = self._admit(uid, obj)
        if pod.lost or pod.terminating:
            return
        if obj["metadata"].get("deletionTimestamp"):
            pod.terminating = True
            self._finishers.submit(self._finish, pod, obj, self._grace_s(obj))
            return
        if pod.refused is None and not pod.phase.terminal:
            self._run_containers(pod, obj)
        written = self._report(pod, obj)
        starting = any(c.process is None or c.retry_at for c in pod.containers.values())
        pod.pending = not written or (starting and pod.refused is None and not pod.phase.terminal)
        pod.synced = obj["metadata"]["resourceVersion"]

    def _admit(self, uid: str, obj: Obj) -> PodRun:
        meta, spec = obj["metadata"], obj["spec"]
        directory = self.workdir / f"{meta['namespace']}_{meta['name']}_{uid[:8]}"
        (directory / "tmp").mkdir(parents=True, exist_ok=True)
        pod = PodRun(
            uid=uid,
            namespace=meta["namespace"],
            name=meta["name"],
            node=spec["nodeName"],
            directory=directory,
            containers={c["name"]: ContainerRun(c["name"]) for c in spec["containers"]},
            started_at=now(),
        )
        if spec.get("initContainers"):
            pod.refused = (
                "UnsupportedInitContainers",
                "the kubelet in miniature does not run init containers",
            )
            pod.phase = PodPhase.FAILED
        with self._lock:
            self._pods[uid] = pod
            self._ran[(pod.namespace, pod.name)] = (directory, list(pod.containers))
        return pod

    def _run_containers(self, pod: PodRun, obj: Obj) -> None:
        policy = obj["spec"].get("restartPolicy", "Always")
        for declared in obj["spec"]["containers"]:
            container = pod.containers[declared["name"]]
            if container.process is not None and container.status is None:
                status = self.supervisor.status(container.process)
                if status.state.finished:
                    container.status = status
            if container.status is not None and should_restart(policy, container.status):
                if container.retry_at == 0.0:
                    container.retry_at = time.monotonic() + min(
                        10.0, self.restart_backoff_s * 2**container.restarts
                    )
                if time.monotonic() < container.retry_at:
                    continue
                container.last_terminated = terminated(container)
                container.restarts += 1
                container.status = None
                assert container.process is not None
                self.supervisor.forget(container.process)
                container.process = None
            if container.process is None and time.monotonic() >= container.retry_at:
                self._start_container(pod, obj, declared, container)
        pod.phase = phase(policy, pod)

    def _start_container(
        self, pod: PodRun, obj: Obj, declared: Obj, container: ContainerRun
    ) -> None:
        try:
            env = self.environment.environment(pod.directory, obj, declared)
            argv = container_argv(declared, env)
        except ContainerConfigError as error:
            container.waiting = (error.reason, error.message)
            container.retry_at = time.monotonic() + 1.0
            return
        working_dir = declared.get("workingDir")
        cwd = Path(working_dir) if working_dir and Path(working_dir).is_dir() else pod.directory
        process = f"{pod.namespace}/{pod.name}/{pod.uid[:8]}/{container.name}"
        self.supervisor.start(
            ProcessSpec(
                name=process,
                argv=argv,
                env=env,
                cwd=cwd,
                log_path=pod.directory / f"{container.name}.log",
                inherit_env=False,
            )
        )
        container.process = process
        container.waiting = None
        container.retry_at = 0.0
        container.started_at = now()

    # -- deletion ---------------------------------------------------------------------------

    def _grace_s(self, obj: Obj | None) -> float:
        if obj is None:
            return 1.0
        grace = obj["metadata"].get("deletionGracePeriodSeconds")
        if grace is None:
            grace = obj["spec"].get("terminationGracePeriodSeconds", 30)
        return float(grace)

    def _finish(self, pod: PodRun, obj: Obj | None, grace_s: float) -> None:
        """Stops the pod's processes (SIGTERM, SIGKILL after the grace period), then removes
        the pod object for good, as a kubelet completes a graceful deletion."""
        try:
            for container in pod.containers.values():
                if container.process is not None:
                    with suppress(UnknownProcess):
                        self.supervisor.stop(container.process, grace_s=grace_s)
            if obj is not None:
                with suppress(ApiException):  # already gone, or replaced by a new uid
                    self.core.delete_namespaced_pod(
                        pod.name,
                        pod.namespace,
                        grace_period_seconds=0,
                        body=kubernetes.client.V1DeleteOptions(
                            grace_period_seconds=0,
                            preconditions=kubernetes.client.V1Preconditions(uid=pod.uid),
                        ),
                    )
        finally:
            with self._lock:
                self._pods.pop(pod.uid, None)
            for container in pod.containers.values():
                if container.process is not None:
                    with suppress(UnknownProcess, ValueError):
                        self.supervisor.forget(container.process)

    # -- reporting --------------------------------------------------------------------------

    def _report(self, pod: PodRun, obj: Obj) -> bool:
        """Sends the pod's status when it changed, from a pool so that one slow write never
        holds up the other pods; at most one write per pod is in flight, so they stay in
        order (a change made meanwhile goes out once the write before it returns). Whether
        the status as it stands is already written."""
        status = pod_status(pod, obj)
        with self._lock:
            if status == pod.reported:
                return True
            if pod.uid not in self._reporting:
                self._reporting.add(pod.uid)
                self._reporters.submit(self._write_status, pod, status)
        return False

    def _write_status(self, pod: PodRun, status: Obj) -> None:
        body = {"metadata": {"uid": pod.uid}, "status": status}
        try:
            self.core.patch_namespaced_pod_status(
                pod.name, pod.namespace, body, _content_type=MERGE_PATCH
            )
            pod.reported = status
        except ApiException as error:
            # 404, 409, 422: gone, or the name now names another pod; else retried next sync.
            if error.status not in (404, 409, 422):
                log.warning("status of pod %s/%s: %s", pod.namespace, pod.name, error)
        except Exception:
            log.exception("status of pod %s/%s", pod.namespace, pod.name)
        finally:
            with self._lock:
                self._reporting.discard(pod.uid)
            self._wake.set()

    def _refresh_nodes(self, *, force: bool) -> None:
        """Lists the nodes: those it serves are kept (a node re-created under the same name
        is a new node), the others are remembered as not served until the next listing."""
        now = time.monotonic()
        if not force and now - self._nodes_listed_at < 1.0:
            return
        self._nodes_listed_at = now
        listed = {n.metadata.name: n for n in self.core.list_node().items}
        with self._lock:
            self._not_served = set(listed)
            served: dict[str, _Node] = {}
            for name, node in listed.items():
                if self.only_nodes is not None and name not in self.only_nodes:
                    continue
                labels = node.metadata.labels or {}
                if any(labels.get(k) != v for k, v in self.node_labels.items()):
                    continue
                known = self._nodes.get(name)
                same = known is not None and known.uid == node.metadata.uid
                served[name] = (
                    known if same and known is not None else _Node(name, node.metadata.uid)
                )
                self._not_served.discard(name)
            self._nodes = served

    def _heartbeat_loop(self) -> None:
        """The nodes' heartbeats, in a thread of their own: a hundred nodes' Lease renewals
        must not delay the pods."""
        while True:
            try:
                self._refresh_nodes(force=True)
                self._heartbeat()
            except Exception:
                log.exception("node heartbeat failed; retrying")
            if self._stopping.wait(self.lease_interval_s):
                return

    def _heartbeat(self) -> None:
        with self._lock:
            nodes = [n for n in self._nodes.values() if not n.failed]
        now = time.monotonic()
        for node in nodes:
            try:
                renew_node_lease(self.coordination, node.name, node.uid, self.lease_duration_s)
                if now >= node.next_status_at:
                    node.next_status_at = now + self.node_status_interval_s
                    report_node_ready(self.core, node.name)
            except ApiException as error:
                if error.status != 404:  # a node deleted meanwhile is dropped at the next list
                    log.warning("heartbeat of node %s: %s", node.name, error)


# -- pure helpers ---------------------------------------------------------------------------


_SERIALIZER = kubernetes.client.ApiClient()


def _plain(items: list[Any]) -> list[Obj]:
    """API objects as the JSON dicts the server sent (camelCase keys)."""
    return [_SERIALIZER.sanitize_for_serialization(item) for item in items]


def _a_child_exited() -> bool:
    """Whether any child of this process has exited and waits to be reaped (not reaping it:
    the children of others, such as the control plane's processes, stay theirs)."""
    try:
        return os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return False


def _key(obj: Obj) -> str:
    return f"{obj['metadata']['namespace']}/{obj['metadata']['name']}"


@contextmanager
def running_kubelet(
    api_client: kubernetes.client.ApiClient, workdir: Path, **options: Any
) -> Iterator[MiniKubelet]:
    """A started `MiniKubelet`, stopped on exit."""
    kubelet = MiniKubelet(api_client, workdir, **options)
    kubelet.start()
    try:
        yield kubelet
    finally:
        kubelet.stop()


__all__ = [
    "ContainerConfigError",
    "MiniKubelet",
    "PodPhase",
    "running_kubelet",
]
