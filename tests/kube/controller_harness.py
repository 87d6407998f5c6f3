"""Running the operator under test: ``python -m edl_scheduler.controller`` as a subprocess
against the session's API server, plus what the controller test modules share: their
``cluster`` and ``controller`` fixtures (``controller_fixtures``), the job builder
(``training_job``: a scenario's differences as arguments), the status readers of ``Cluster``
and small waits (the framework-free worker's ledgers are read in ``ledgers.py``).

The controller runs as a real process (so that tests can SIGKILL it) with the test
kubeconfig, a token key, coordinators reached at 127.0.0.1 on per-job ports (all pods of the
kubelet in miniature share one address), and a fast planning period. Processes are stopped
by PID.
"""

from __future__ import annotations

import atexit
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import kubernetes
import pytest
from kubernetes.client import ApiException

from edl_scheduler.controller.intents import EventReason
from edl_scheduler.controller.naming import coordinator_name
from edl_scheduler.local.processes import ProcessSpec, ProcessSupervisor, UnknownProcess

from .kubelet import MiniKubelet
from .leftovers import GROUP, PLURAL, VERSION, job_keys, refuse_other_tests_jobs
from .nodes import KUBELET_LABELS
from .pod_environment import ContainerEnvironment, container_argv
from .testenv import REPO, KubeAPI

#: The node label that keeps each test's jobs on its own nodes (``training_job(pool=...)``).
POOL = "edl.test/pool"
CRD_FILE = REPO / "manifests" / "crd" / "trainingjobs.edl.dev.yaml"


def eventually(
    check: Callable[[], Any],
    timeout_s: float,
    what: str,
    explain: Callable[[], str] | None = None,
) -> Any:
    """Polls ``check`` until it returns something truthy; bounded. On a timeout the error
    carries what ``explain`` says (the logs that tell why, where a wait has some)."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            said = f"\n{explain()}" if explain is not None else ""
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}{said}")
        time.sleep(0.1)


def ensure_namespace(api: KubeAPI, name: str) -> None:
    """The namespace, once pods can be created in it: the API server refuses a pod (500, "No
    API token found for service account") until the controller manager has given the
    namespace's default ServiceAccount its token, a moment after the namespace exists."""
    core = kubernetes.client.CoreV1Api(api.api_client)
    try:
        core.create_namespace({"metadata": {"name": name}})
    except ApiException as error:
        if error.status != 409:
            raise

    def token_given() -> bool:
        try:
            account = core.read_namespaced_service_account("default", name)
        except ApiException as error:
            if error.status != 404:
                raise
            return False
        return bool(account.secrets)

    eventually(token_given, 30, f"the default ServiceAccount of {name} to get its token")


def apply_crd(api: KubeAPI) -> None:
    api.kubectl("apply", "-f", str(CRD_FILE))
    ext = kubernetes.client.ApiextensionsV1Api(api.api_client)

    def established() -> bool:
        found = ext.read_custom_resource_definition(f"{PLURAL}.{GROUP}")
        return any(
            c.type == "Established" and c.status == "True" for c in found.status.conditions or []
        )

    eventually(established, 30, "the TrainingJob CRD to become Established")


def remove_jobs(api: KubeAPI, keys: set[tuple[str, str]], timeout_s: float = 60) -> None:
    """Deletes the TrainingJobs ``keys`` and their pods, and waits, bounded, until both are
    gone. What a test leaves behind otherwise stays planned by every later cluster-wide
    operator of the session.

    A pod on a node the kubelet in miniature serves is deleted with a short grace: the
    kubelet stops its processes (SIGTERM, SIGKILL after 5 s) before it removes the pod, so
    once the pods are gone their ports are free (the next test's job may be given the same
    coordinator port: all pods share 127.0.0.1). A pod no kubelet runs has no process (a
    played coordinator is stopped here) and is removed at once, as is one still there when
    the wait runs out."""
    if not keys:
        return
    cluster = Cluster(api)
    selector = ",".join(f"{k}={v}" for k, v in KUBELET_LABELS.items())
    served = {n.metadata.name for n in cluster.core.list_node(label_selector=selector).items}

    def pods_left() -> list[Any]:
        return [p for ns, name in sorted(keys) for p in cluster.pods(ns, name)]

    for ns, name in sorted(keys):
        with suppress(ApiException):  # already gone
            cluster.delete_job(ns, name)
    for pod in pods_left():
        grace = 5 if pod.spec.node_name in served else 0
        with suppress(ApiException):
            cluster.core.delete_namespaced_pod(
                pod.metadata.name, pod.metadata.namespace, grace_period_seconds=grace
            )
    if _played is not None:
        for ns in {ns for ns, _ in keys}:
            live = cluster.core.list_namespaced_pod(ns).items
            _played.stop_all_but(ns, {p.metadata.uid for p in live})
    try:
        eventually(lambda: not pods_left(), timeout_s, "the removed jobs' pods to go")
    except AssertionError:
        for pod in pods_left():
            with suppress(ApiException):
                cluster.core.delete_namespaced_pod(
                    pod.metadata.name, pod.metadata.namespace, grace_period_seconds=0
                )
    eventually(lambda: not keys & job_keys(api), 30, f"{len(keys)} TrainingJob(s) removed")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _unused_range(ports: str, probe: int = 10, tries: int = 20) -> str:
    """``ports`` ("low-high"), or the first range of the same size above it whose first
    ports nothing listens on: coordinators listen with SO_REUSEPORT, so one of another run
    of these tests on the same machine (a stale one too) would share a port with ours and
    answer our controller with the wrong token."""
    low, high = (int(p) for p in ports.split("-"))
    size = high - low + 1
    for _ in range(tries):
        if high <= 65535 and all(_bindable(p) for p in range(low, low + min(probe, size))):
            return f"{low}-{high}"
        low, high = low + size, high + size
    return ports


class ControllerProcess:
    """One operator process; ``kill()`` is SIGKILL, ``stop()`` SIGTERM then SIGKILL."""

    def __init__(
        self,
        api: KubeAPI,
        workdir: Path,
        identity: str,
        lease_namespace: str,
        extra: tuple[str, ...] = (),
        ports: str = "21000-21999",
    ) -> None:
        self.api = api
        self.workdir = workdir
        self.identity = identity
        #: The namespace of this test's jobs too (``refuse_other_tests_jobs``).
        self.lease_namespace = lease_namespace
        self.metrics_port = free_port()
        key = workdir / "token-key"
        if not key.exists():
            key.write_bytes(os.urandom(32).hex().encode())
        policy = workdir / "policy.yaml"
        if not policy.exists():
            policy.write_text(
                "base: edl\ncooldown_seconds: 0\nmin_run_seconds: 0\nsuspend_cost_seconds: 0\n"
            )
        self.argv = [
            sys.executable, "-m", "edl_scheduler.controller",
            "--kubeconfig", str(api.kubeconfig),
            "--token-key-file", str(key),
            "--policy", str(policy),
            "--identity", identity,
            "--lease-namespace", lease_namespace,
            "--lease-duration", "4",
            "--metrics-host", "127.0.0.1",
            "--metrics-port", str(self.metrics_port),
            "--min-period", "0.1",
            "--max-period", "1",
            "--coordinator-command", f"{sys.executable} -m trainer_runtime.coordinator",
            "--coordinator-bind", "127.0.0.1",
            "--coordinator-host", "127.0.0.1",
            "--coordinator-ports", _unused_range(ports),
            # Parameter servers share 127.0.0.1 here: each takes a free port (and no probes).
            "--pserver-port", "0",
            *extra,
        ]  # fmt: skip
        self.log_path = workdir / f"controller-{identity}.log"
        self.popen: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        refuse_other_tests_jobs(self.api, self.lease_namespace)
        log = self.log_path.open("ab")
        self.popen = subprocess.Popen(
            self.argv, stdout=log, stderr=subprocess.STDOUT, cwd=REPO, start_new_session=True
        )
        log.close()

    def metrics(self) -> str:
        import urllib.request

        with urllib.request.urlopen(
            f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=2
        ) as answer:
            return str(answer.read().decode())

    def healthy(self) -> bool:
        import urllib.error
        import urllib.request

        try:
            with urllib.request.urlopen(
                f"http://127.0.0.1:{self.metrics_port}/healthz", timeout=2
            ) as answer:
                return bool(answer.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    def kill(self) -> None:
        if self.popen is not None and self.popen.poll() is None:
            os.kill(self.popen.pid, signal.SIGKILL)
            self.popen.wait(10)

    def stop(self) -> None:
        if self.popen is None or self.popen.poll() is not None:
            return
        os.kill(self.popen.pid, signal.SIGTERM)
        try:
            self.popen.wait(10)
        except subprocess.TimeoutExpired:
            os.kill(self.popen.pid, signal.SIGKILL)
            self.popen.wait(10)

    def log_tail(self, n: int = 60) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except FileNotFoundError:
            return ""


@contextmanager
def running_controller(
    api: KubeAPI,
    workdir: Path,
    identity: str = "ctrl-a",
    lease_namespace: str = "default",
    **kwargs: Any,
) -> Iterator[ControllerProcess]:
    proc = ControllerProcess(api, workdir, identity, lease_namespace, **kwargs)
    proc.start()
    try:
        yield proc
    finally:
        proc.stop()


@contextmanager
def healthy_controller(
    api: KubeAPI,
    workdir: Path,
    identity: str = "ctrl-a",
    lease_namespace: str = "default",
    tail: int = 100,
    **kwargs: Any,
) -> Iterator[ControllerProcess]:
    """A controller answering on /healthz (what a test module's fixture hands its tests);
    the last `tail` lines of its log are printed when it stops, so a failure shows them."""
    with running_controller(api, workdir, identity, lease_namespace, **kwargs) as proc:
        try:
            eventually(proc.healthy, 30, "the controller's /healthz")
            yield proc
        finally:
            print(proc.log_tail(tail))


def training_job(
    name: str,
    namespace: str,
    *,
    min_replicas: int = 1,
    max_replicas: int = 1,
    gpus: int = 1,
    priority: int | None = None,
    priority_class: str | None = None,
    samples: int = 1000,
    command: list[str] | None = None,
    framework: str = "none",
    max_restarts: int = 3,
    extra_spec: dict[str, Any] | None = None,
    pool: str | None = None,
    drain_seconds: int | None = None,
    env: dict[str, str] | None = None,
) -> dict[str, Any]:
    """A TrainingJob manifest, each scenario's differences as arguments: ``pool`` keeps its
    workers on the nodes labelled ``POOL: pool``, ``drain_seconds`` is its drain deadline,
    ``env`` is set in its worker container."""
    spec: dict[str, Any] = {
        "minReplicas": min_replicas,
        "maxReplicas": max_replicas,
        "framework": framework,
        "resources": {"nvidia.com/gpu": gpus, "cpu": "1", "memory": "1Gi"},
        "failurePolicy": {"maxRestarts": max_restarts},
        "template": {
            "spec": {
                "containers": [
                    {
                        "name": "worker",
                        "image": "edl/plain-worker:test",
                        "command": command
                        or [sys.executable, "-m", "trainer_runtime.plain_worker",
                            "--step-time-s", "0.02"],
                    }
                ]
            }
        },
    }  # fmt: skip
    if priority is not None:
        spec["priority"] = priority
    if priority_class is not None:
        spec["priorityClassName"] = priority_class
    spec |= extra_spec or {}
    if pool is not None:
        spec["template"]["spec"]["nodeSelector"] = {POOL: pool}
    if drain_seconds is not None:
        spec["timeouts"] = {"drainSeconds": drain_seconds}
    if env is not None:
        container = spec["template"]["spec"]["containers"][0]
        container["env"] = [{"name": k, "value": v} for k, v in env.items()]
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "TrainingJob",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "annotations": {"edl.dev/coordinator-args": f"--samples {samples} --shard-size 10"},
        },
        "spec": spec,
    }


class Cluster:
    """Reads and writes of the tests, through the admin client."""

    def __init__(self, api: KubeAPI) -> None:
        self.api = api
        self.core = kubernetes.client.CoreV1Api(api.api_client)
        self.custom = kubernetes.client.CustomObjectsApi(api.api_client)

    def create_job(self, manifest: dict[str, Any]) -> dict[str, Any]:
        ns = manifest["metadata"]["namespace"]
        found: dict[str, Any] = self.custom.create_namespaced_custom_object(
            GROUP, VERSION, ns, PLURAL, manifest
        )
        return found

    def job(self, ns: str, name: str) -> dict[str, Any]:
        found: dict[str, Any] = self.custom.get_namespaced_custom_object(
            GROUP, VERSION, ns, PLURAL, name
        )
        return found

    def jobs(self, ns: str) -> list[dict[str, Any]]:
        found = self.custom.list_namespaced_custom_object(GROUP, VERSION, ns, PLURAL)
        return list(found["items"])

    def status(self, ns: str, name: str) -> dict[str, Any]:
        found: dict[str, Any] = self.job(ns, name).get("status", {})
        return found

    def condition(self, ns: str, name: str, type_: str) -> dict[str, Any] | None:
        """The job's status condition of ``type_``, if it has one."""
        conditions = self.status(ns, name).get("conditions", [])
        return next((c for c in conditions if c["type"] == type_), None)

    def samples_done(self, ns: str, name: str) -> int:
        return int(self.status(ns, name).get("progress", {}).get("samplesDone", 0))

    def set_suspend(self, ns: str, name: str, value: bool) -> None:
        self.custom.patch_namespaced_custom_object(
            GROUP, VERSION, ns, PLURAL, name, {"spec": {"suspend": value}}
        )

    def delete_job(self, ns: str, name: str) -> None:
        self.custom.delete_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name)

    def pods(self, ns: str, job: str, role: str | None = None) -> list[Any]:
        selector = f"edl.dev/job={job}" + (f",edl.dev/role={role}" if role else "")
        return list(self.core.list_namespaced_pod(ns, label_selector=selector).items)

    def events(self, ns: str, name: str) -> list[Any]:
        return [
            e
            for e in self.core.list_namespaced_event(ns).items
            if e.involved_object.name == name and e.involved_object.kind == "TrainingJob"
        ]

    def told(self, ns: str, name: str, *reasons: str, timeout_s: float = 30) -> list[Any]:
        """The job's Events once one of each of ``reasons`` is among them. The controller
        posts Events in the background (``StatusWriter``), so one may show a moment after
        the pods or status it tells of: a test waits for it rather than reading at once."""

        def all_there() -> list[Any]:
            events = self.events(ns, name)
            return events if set(reasons) <= {e.reason for e in events} else []

        return list(eventually(all_there, timeout_s, f"Events {', '.join(reasons)} of {name}"))

    def restarts_told(self, ns: str, name: str, kubelet: MiniKubelet) -> list[str]:
        """Why a job was charged restarts: each ReplicaFailed Event, with the last lines of
        the failed replica's output (what a failing test prints)."""
        told = []
        for event in self.events(ns, name):
            if event.reason != EventReason.REPLICA_FAILED.value:
                continue
            replica = str(event.message).split(" ", 1)[0]
            tail = kubelet.logs(ns, replica).splitlines()[-15:]
            told.append(f"{event.message}\n" + "\n".join(tail))
        if told:  # what the job's coordinator said of its workers
            log = kubelet.logs(ns, coordinator_name(name)).splitlines()
            words = ("lost", "depart", "expire", "fence", "error", "Error")
            told.extend(line for line in log if any(word in line for word in words))
        return told

    def set_pod_phase(self, ns: str, name: str, phase: str, reason: str | None = None) -> None:
        """Plays the kubelet's part: report a pod's phase through the status subresource."""
        status: dict[str, Any] = {"phase": phase, "podIP": "127.0.0.1"}
        if reason:
            status["reason"] = reason
        self.core.patch_namespaced_pod_status(name, ns, {"status": status})


class PlayedCoordinators:
    """The coordinator pods of tests that play the kubelet by hand, run for real.

    The controller asks a job's coordinator for progress, drains and the planned size, so
    a test that reports pods Running without processes still needs real coordinators: each one
    ``settle`` reports Running is first started here, as a local process with the pod's
    command and environment (the kubelet in miniature's own machinery), and stopped when
    its pod is deleted or gone. Workers stay played (no process). Processes are stopped by
    the supervisor (by process group) when the pod goes, and all of them at exit.
    """

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.supervisor = ProcessSupervisor()
        self._running: dict[str, tuple[str, str]] = {}  # pod uid -> (namespace, process)
        atexit.register(self.close)

    def start(self, cluster: Cluster, pod: Any) -> None:
        uid = str(pod.metadata.uid)
        if uid in self._running:
            return
        obj = cluster.api.api_client.sanitize_for_serialization(pod)
        declared = obj["spec"]["containers"][0]
        directory = self.workdir / f"{pod.metadata.namespace}_{pod.metadata.name}_{uid[:8]}"
        (directory / "tmp").mkdir(parents=True, exist_ok=True)
        env = ContainerEnvironment(cluster.core).environment(directory, obj, declared)
        name = f"{pod.metadata.namespace}/{pod.metadata.name}/{uid[:8]}"
        self.supervisor.start(
            ProcessSpec(
                name=name,
                argv=container_argv(declared, env),
                env=env,
                cwd=directory,
                log_path=directory / "coordinator.log",
                inherit_env=False,
            )
        )
        self._running[uid] = (str(pod.metadata.namespace), name)

    def stop_all_but(self, ns: str, live: set[str]) -> None:
        """Stops the coordinators of ``ns`` whose pods are not in ``live`` (uids)."""
        for uid, (namespace, name) in list(self._running.items()):
            if namespace == ns and uid not in live:
                del self._running[uid]
                with suppress(UnknownProcess):
                    self.supervisor.stop(name, grace_s=2.0)

    def report(self, ns: str, job: str) -> str:
        """Each played coordinator of ``job`` in ``ns`` (stopped ones too): its process's
        state and the end of its log, for a test's error."""
        lines = []
        for status in self.supervisor.statuses().values():
            namespace, _, rest = status.name.partition("/")
            if namespace != ns or not rest.startswith(f"{job}-coordinator/"):
                continue
            log = self.workdir / status.name.replace("/", "_") / "coordinator.log"
            try:
                tail = log.read_text(errors="replace").splitlines()[-20:]
            except FileNotFoundError:
                tail = ["(no log)"]
            said = ""
            if status.state.finished:
                said = f" (exit code {status.exit_code}) {status.message}"
            lines += [f"played coordinator {status.name}: {status.state.value}{said}", *tail]
        return "\n".join(lines) or f"no played coordinator of {ns}/{job}"

    def close(self) -> None:
        self._running.clear()
        self.supervisor.close(grace_s=2.0)


#: The phases of a started job where the test plays the kubelet: its workers run no
#: process, so they never join the (real) coordinator, and after its first Running the job
#: shows Resizing (the coordinator's members differ from its workers).
RUNNING_PHASES = ("Running", "Resizing")

_played: PlayedCoordinators | None = None


def played_coordinators() -> PlayedCoordinators:
    global _played
    if _played is None:
        _played = PlayedCoordinators(Path(tempfile.mkdtemp(prefix="edl-played-coordinators-")))
    return _played


def settle(cluster: Cluster, ns: str) -> None:
    """Plays the kubelet once: bound pending pods become Running (coordinators run for
    real, see ``PlayedCoordinators``; workers run no process), pods being deleted and pods
    of jobs that no longer exist are removed at once."""
    played = played_coordinators()
    pods = cluster.core.list_namespaced_pod(ns).items
    played.stop_all_but(ns, {p.metadata.uid for p in pods if not p.metadata.deletion_timestamp})
    jobs = {str(j["metadata"]["name"]) for j in cluster.jobs(ns)}
    for pod in pods:
        name = pod.metadata.name
        job = (pod.metadata.labels or {}).get("edl.dev/job")
        try:
            if pod.metadata.deletion_timestamp or (job is not None and job not in jobs):
                # Being deleted, or left by a deleted job (the garbage collector's to
                # remove; its Secret may be gone): removed, never started.
                cluster.core.delete_namespaced_pod(name, ns, grace_period_seconds=0)
            elif pod.spec.node_name and pod.status.phase == "Pending":
                if (pod.metadata.labels or {}).get("edl.dev/role") == "coordinator":
                    played.start(cluster, pod)
                cluster.set_pod_phase(ns, name, "Running")
        except ApiException as error:
            if error.status not in (404, 409):
                raise


def live_workers(cluster: Cluster, ns: str, job: str) -> list[Any]:
    return [
        p
        for p in cluster.pods(ns, job, "worker")
        if not p.metadata.deletion_timestamp
        and (p.metadata.annotations or {}).get("edl.dev/draining") != "true"
    ]


def cluster_in(api: KubeAPI, namespace: str) -> Cluster:
    """A `Cluster` on ``api`` with the CRD applied and ``namespace`` present: what every
    controller test module starts from."""
    apply_crd(api)
    ensure_namespace(api, namespace)
    return Cluster(api)


def controller_fixtures(
    namespace: str,
    identity: str,
    ports: str,
    *,
    with_kubelet: bool = True,
    policy: str | None = None,
    extra: tuple[str, ...] = (),
    tail: int = 100,
) -> tuple[Any, Any]:
    """The module-scoped ``cluster`` and ``controller`` fixtures of a test module whose jobs
    run in ``namespace`` under one controller (``identity``, coordinator ports ``ports``,
    the policy file ``policy`` if given, ``extra`` arguments; the last ``tail`` lines of its
    log printed when it stops). With ``with_kubelet`` the session's kubelet in miniature runs
    the pods. Use: ``cluster, controller = controller_fixtures(NS, "e2e", "23000-23999")``."""

    def cluster_fixture(kube_api: KubeAPI) -> Cluster:
        return cluster_in(kube_api, namespace)

    def cluster_with_kubelet(kube_api: KubeAPI, kubelet: MiniKubelet) -> Cluster:
        return cluster_in(kube_api, namespace)

    def controller_fixture(
        kube_api: KubeAPI, cluster: Cluster, tmp_path_factory: pytest.TempPathFactory
    ) -> Iterator[ControllerProcess]:
        workdir = tmp_path_factory.mktemp(f"ctrl-{identity}")
        if policy is not None:
            (workdir / "policy.yaml").write_text(policy)
        with healthy_controller(
            kube_api, workdir, identity, namespace, tail=tail, ports=ports, extra=extra
        ) as proc:
            yield proc

    cluster = pytest.fixture(scope="module", name="cluster")(
        cluster_with_kubelet if with_kubelet else cluster_fixture
    )
    controller = pytest.fixture(scope="module", name="controller")(controller_fixture)
    return cluster, controller
