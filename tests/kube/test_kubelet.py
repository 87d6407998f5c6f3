"""The kubelet in miniature (`kubelet.py`) against the real API server, through the session's
`kubelet` fixture, as the end-to-end tests use it.

Aspects tested:
- a pod whose command exits 0 ends Succeeded, with exit code 0 and reason Completed;
- one that exits 3 ends Failed with exit code 3 in its container's terminated state;
- a long-running pod is Running and Ready with podIP 127.0.0.1 and a running container;
  deleted, its process gets SIGTERM and the pod object is removed;
- a process that ignores SIGTERM is SIGKILLed once the pod's grace period has passed, not
  before, and the pod object goes with it;
- the environment reaches the process: a value from a Secret and from a ConfigMap, envFrom,
  the downward API (name, namespace, node, pod IP, a label), `$(VAR)` expansion and a
  service link;
- a missing Secret keeps the pod Pending (CreateContainerConfigError) until it exists;
- restartPolicy OnFailure restarts a failed container and counts the restart;
- the served node is Ready, without the not-ready taint, and its Lease is renewed;
- a pod on a node without the kubelet label is left alone (tests that play the kubelet by
  hand own it);
- a failed node (`fail_node`) loses its processes at once, and nothing more is reported for
  it: its pod stays Running, as last reported.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from typing import Any

import kubernetes
import pytest
from kubernetes.client import ApiException

from .controller_harness import ensure_namespace
from .kubelet import MiniKubelet
from .nodes import create_node
from .testenv import KubeAPI

NAMESPACE = "kubelet-test"
NODE = "kubelet-node"


def eventually(check: Callable[[], Any], timeout_s: float, what: str) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.05)


@pytest.fixture(scope="module")
def core(kube_api: KubeAPI, kubelet: MiniKubelet) -> kubernetes.client.CoreV1Api:
    """A namespace and a node served by the session's kubelet; the node starts with the
    not-ready taint that admission adds, as a freshly registered node has."""
    api = kubernetes.client.CoreV1Api(kube_api.api_client)
    ensure_namespace(kube_api, NAMESPACE)
    create_node(
        kube_api.api_client,
        NODE,
        gpus=2,
        taints=[{"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"}],
        kubelet=True,
    )
    return api


def python_pod(
    name: str,
    code: str,
    *,
    grace_s: int = 5,
    restart: str = "Never",
    env: list[dict[str, Any]] | None = None,
    env_from: list[dict[str, Any]] | None = None,
    labels: dict[str, str] | None = None,
) -> dict[str, Any]:
    container: dict[str, Any] = {
        "name": "main",
        "image": "python:3.11",
        "command": ["python", "-c", code],
        "env": env or [],
    }
    if env_from:
        container["envFrom"] = env_from
    return {
        "metadata": {"name": name, "labels": labels or {}},
        "spec": {
            "nodeName": NODE,
            "restartPolicy": restart,
            "terminationGracePeriodSeconds": grace_s,
            "containers": [container],
        },
    }


def phase_of(core: kubernetes.client.CoreV1Api, name: str, phases: set[str]) -> Any:
    def check() -> Any:
        pod = core.read_namespaced_pod(name, NAMESPACE)
        return pod if pod.status.phase in phases else None

    return eventually(check, 30, f"pod {name} to reach {sorted(phases)}")


def gone(core: kubernetes.client.CoreV1Api, name: str) -> bool:
    try:
        core.read_namespaced_pod(name, NAMESPACE)
    except ApiException as error:
        return error.status == 404
    return False


def pid_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie counts as gone: it has exited and only waits to be reaped. It may also be
    # reaped between the signal above and this read, which then fails with ESRCH or ENOENT.
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (ProcessLookupError, FileNotFoundError):
        return False


def test_exit_zero_succeeds(core: kubernetes.client.CoreV1Api) -> None:
    core.create_namespaced_pod(NAMESPACE, python_pod("exit-zero", "print('done')"))
    pod = phase_of(core, "exit-zero", {"Succeeded", "Failed"})
    assert pod.status.phase == "Succeeded"
    (status,) = pod.status.container_statuses
    assert status.state.terminated.exit_code == 0
    assert status.state.terminated.reason == "Completed"


def test_exit_three_fails_with_its_code(
    core: kubernetes.client.CoreV1Api, kubelet: MiniKubelet
) -> None:
    code = "import sys; print('bad input', file=sys.stderr); sys.exit(3)"
    core.create_namespaced_pod(NAMESPACE, python_pod("exit-three", code))
    pod = phase_of(core, "exit-three", {"Succeeded", "Failed"})
    assert pod.status.phase == "Failed"
    (status,) = pod.status.container_statuses
    assert status.state.terminated.exit_code == 3
    assert status.state.terminated.reason == "Error"
    assert "bad input" in kubelet.logs(NAMESPACE, "exit-three")


def test_running_pod_is_reported_then_deleted(
    core: kubernetes.client.CoreV1Api, kubelet: MiniKubelet
) -> None:
    core.create_namespaced_pod(
        NAMESPACE, python_pod("sleeper", "import time; time.sleep(600)", grace_s=60)
    )
    pod = phase_of(core, "sleeper", {"Running"})
    assert pod.status.pod_ip == "127.0.0.1"
    (status,) = pod.status.container_statuses
    assert status.ready and status.state.running is not None
    ready = {c.type: c.status for c in pod.status.conditions}
    assert ready["Ready"] == "True"
    pid = kubelet.pids(NAMESPACE, "sleeper")["main"]
    assert pid_exists(pid)
    started = time.monotonic()
    core.delete_namespaced_pod("sleeper", NAMESPACE)
    eventually(lambda: gone(core, "sleeper"), 40, "the deleted pod to be removed")
    assert not pid_exists(pid)
    # SIGTERM ended it at once: nowhere near the 60 s grace period (a bound with room for
    # a loaded machine's watch and sync; a process left to its grace takes twice that).
    assert time.monotonic() - started < 30


def test_sigterm_ignored_is_killed_after_the_grace_period(
    core: kubernetes.client.CoreV1Api, kubelet: MiniKubelet
) -> None:
    code = (
        "import signal, time\n"
        "signal.signal(signal.SIGTERM, lambda *_: print('ignoring SIGTERM', flush=True))\n"
        "print('up', flush=True)\n"
        "time.sleep(600)\n"
    )
    core.create_namespaced_pod(NAMESPACE, python_pod("stubborn", code, grace_s=2))
    phase_of(core, "stubborn", {"Running"})
    eventually(lambda: "up" in kubelet.logs(NAMESPACE, "stubborn"), 20, "the handler set")
    pid = kubelet.pids(NAMESPACE, "stubborn")["main"]
    started = time.monotonic()
    core.delete_namespaced_pod("stubborn", NAMESPACE)
    eventually(lambda: not pid_exists(pid), 20, "the process to be killed")
    killed_after = time.monotonic() - started
    eventually(lambda: gone(core, "stubborn"), 20, "the pod to be removed")
    assert 1.5 <= killed_after < 10, killed_after
    assert "ignoring SIGTERM" in kubelet.logs(NAMESPACE, "stubborn")


def test_environment_reaches_the_process(
    core: kubernetes.client.CoreV1Api, kubelet: MiniKubelet
) -> None:
    core.create_namespaced_secret(
        NAMESPACE, {"metadata": {"name": "job-token"}, "stringData": {"token": "s3cret"}}
    )
    core.create_namespaced_config_map(
        NAMESPACE, {"metadata": {"name": "settings"}, "data": {"EPOCHS": "3", "LR": "0.1"}}
    )
    core.create_namespaced_service(
        NAMESPACE,
        {
            "metadata": {"name": "job-coordinator"},
            "spec": {"ports": [{"name": "grpc", "port": 80, "targetPort": 7070}]},
        },
    )
    env = [
        {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "job-token", "key": "token"}}},
        {"name": "LR", "valueFrom": {"configMapKeyRef": {"name": "settings", "key": "LR"}}},
        {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "NS", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
        {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
        {"name": "IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        {"name": "ROLE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['role']"}}},
        {"name": "ADDRESS", "value": "$(IP):$(JOB_COORDINATOR_SERVICE_PORT)"},
        {"name": "LITERAL", "value": "$$(IP) and $(UNDEFINED)"},
    ]
    code = "import json, os; print(json.dumps(dict(os.environ)))"
    pod = python_pod(
        "env-reader",
        code,
        env=env,
        env_from=[{"configMapRef": {"name": "settings"}, "prefix": "CFG_"}],
        labels={"role": "worker"},
    )
    core.create_namespaced_pod(NAMESPACE, pod)
    assert phase_of(core, "env-reader", {"Succeeded", "Failed"}).status.phase == "Succeeded"
    seen = json.loads(kubelet.logs(NAMESPACE, "env-reader"))
    assert seen["TOKEN"] == "s3cret"
    assert seen["LR"] == "0.1"
    assert (seen["CFG_EPOCHS"], seen["CFG_LR"]) == ("3", "0.1")
    assert (seen["POD"], seen["NS"], seen["NODE"]) == ("env-reader", NAMESPACE, NODE)
    assert (seen["IP"], seen["ROLE"]) == ("127.0.0.1", "worker")
    assert seen["JOB_COORDINATOR_SERVICE_HOST"] == "127.0.0.1"
    assert seen["ADDRESS"] == "127.0.0.1:7070"
    assert seen["LITERAL"] == "$(IP) and $(UNDEFINED)"
    assert "KUBECONFIG" not in seen  # the test process's own environment is not inherited


def test_missing_secret_waits_until_it_exists(core: kubernetes.client.CoreV1Api) -> None:
    env = [{"name": "T", "valueFrom": {"secretKeyRef": {"name": "later", "key": "t"}}}]
    core.create_namespaced_pod(NAMESPACE, python_pod("waits", "print('ok')", env=env))

    def waiting_reason() -> str | None:
        statuses = core.read_namespaced_pod("waits", NAMESPACE).status.container_statuses
        waiting = statuses[0].state.waiting if statuses else None
        return waiting.reason if waiting else None

    assert eventually(waiting_reason, 20, "a waiting reason") == "CreateContainerConfigError"
    assert core.read_namespaced_pod("waits", NAMESPACE).status.phase == "Pending"
    core.create_namespaced_secret(NAMESPACE, {"metadata": {"name": "later"}, "data": {"t": ""}})
    assert phase_of(core, "waits", {"Succeeded", "Failed"}).status.phase == "Succeeded"


def test_on_failure_restarts_and_counts(
    core: kubernetes.client.CoreV1Api, kubelet: MiniKubelet
) -> None:
    # Fails on its first run, succeeds on its second: the marker is in the pod's directory.
    code = (
        "import os, sys\n"
        "if os.path.exists('ran'):\n    sys.exit(0)\n"
        "open('ran', 'w').close(); sys.exit(1)\n"
    )
    core.create_namespaced_pod(NAMESPACE, python_pod("flaky", code, restart="OnFailure"))
    pod = phase_of(core, "flaky", {"Succeeded", "Failed"})
    assert pod.status.phase == "Succeeded"
    (status,) = pod.status.container_statuses
    assert status.restart_count == 1
    assert status.last_state.terminated.exit_code == 1


def test_node_is_ready_untainted_and_leased(kube_api: KubeAPI, core: Any) -> None:
    def untainted() -> bool:
        return not core.read_node(NODE).spec.taints

    eventually(untainted, 20, "the not-ready taint to be removed")
    ready = [c for c in core.read_node(NODE).status.conditions if c.type == "Ready"]
    assert [c.status for c in ready] == ["True"]
    leases = kubernetes.client.CoordinationV1Api(kube_api.api_client)

    def renew_time() -> Any:
        try:
            return leases.read_namespaced_lease(NODE, "kube-node-lease").spec.renew_time
        except ApiException:
            return None

    first = eventually(renew_time, 20, "the node's Lease")
    eventually(lambda: renew_time() > first, 20, "the Lease to be renewed")
    lease = leases.read_namespaced_lease(NODE, "kube-node-lease")
    assert lease.spec.holder_identity == NODE
    assert lease.metadata.owner_references[0].name == NODE


def test_unlabelled_node_is_left_alone(kube_api: KubeAPI, core: Any, kubelet: MiniKubelet) -> None:
    create_node(kube_api.api_client, "by-hand-node", gpus=1)
    pod = python_pod("by-hand", "print('must not run')")
    pod["spec"]["nodeName"] = "by-hand-node"
    core.create_namespaced_pod(NAMESPACE, pod)
    # Seen, then synced twice: a kubelet serving the node would have run it and reported
    # it by then.
    eventually(lambda: kubelet.sees(NAMESPACE, "by-hand"), 20, "the kubelet to see the pod")
    kubelet.quiet()
    assert kubelet.logs(NAMESPACE, "by-hand") == "", "it ran"
    assert core.read_namespaced_pod("by-hand", NAMESPACE).status.phase == "Pending"


def test_failed_node_loses_its_processes_and_goes_silent(
    kube_api: KubeAPI, core: Any, kubelet: MiniKubelet
) -> None:
    create_node(kube_api.api_client, "doomed-node", gpus=1, kubelet=True)
    pod = python_pod("doomed", "import time; time.sleep(600)")
    pod["spec"]["nodeName"] = "doomed-node"
    core.create_namespaced_pod(NAMESPACE, pod)
    phase_of(core, "doomed", {"Running"})
    pid = kubelet.pids(NAMESPACE, "doomed")["main"]
    kubelet.fail_node("doomed-node")
    eventually(lambda: not pid_exists(pid), 10, "the node's process to die")
    # A live kubelet would report the killed container (exit 137) at its next sync.
    kubelet.quiet()
    assert core.read_namespaced_pod("doomed", NAMESPACE).status.phase == "Running"
