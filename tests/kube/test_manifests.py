"""The manifests in `manifests/`, applied with kubectl 1.20 to a real API server of their own.

Aspects tested:
- `kubectl apply -k manifests/base` on a fresh cluster creates every object kustomize builds
  (CRD Established, namespace, ServiceAccount, RBAC, policy ConfigMap, metrics Service,
  Deployment), and applying it again changes nothing;
- the Deployment is admitted as far as a cluster with no scheduler goes: its ReplicaSet
  creates two pods that run as the controller's ServiceAccount, mount the generated policy
  ConfigMap, and probe and expose port 8080;
- the policy in the ConfigMap is a valid policy file for the planner; the Deployment's
  arguments are ones `edl-controller` accepts (metrics on the container's port 8080, the
  Lease the Role allows), and the Dockerfile's entry point is that console script;
- the RBAC, checked with the ServiceAccount's own token (a 1.20-style token Secret): every
  verb the controller needs is allowed; Secrets may only be created (never read, listed or
  deleted, in any namespace); nodes, RBAC, CRDs, workloads, exec and other Leases are
  denied; no rule is a wildcard and nothing binds cluster-admin;
- least privilege: the ClusterRole bound cluster-wide only reads (no write of pods,
  Secrets, ConfigMaps, Services or NetworkPolicies), the writes are in the ClusterRole
  ``edl-operator-workloads``, which no ClusterRoleBinding binds; impersonating the
  ServiceAccount (``kubectl auth can-i --as``), it may create pods in a served namespace
  (the examples' RoleBindings) and in none other, kube-system above all; the command
  docs/deploy.md gives to serve a namespace makes it allowed there;
- the RBAC is enough: the real controller, authenticated only as the ServiceAccount and
  serving one namespace (``--namespace``), takes the leader Lease and runs a small job to
  success on a node served by the kubelet in miniature, with its NetworkPolicy; its log
  shows no request refused, and one line for each job it leaves alone (one in
  kube-system, one in a namespace not served), which get no pod and no status;
- `kubectl apply -k manifests/examples` creates the PriorityClasses, namespaces and jobs, and
  each job also passes the project's own checks (`load_training_job`);
- `kubectl apply -k manifests/monitoring` applies the ServiceMonitor (against a stand-in CRD
  that declares the Prometheus Operator's fields we use, since its own CRD is not in a bare
  cluster) and the Grafana dashboard ConfigMap;
- the dashboard is valid Grafana JSON that charts each of the controller's metrics, and only
  those.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import re
import secrets
import shlex
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import kubernetes
import pytest
import yaml
from kubernetes.client import ApiException

from edl_scheduler.api.job import load_training_job
from edl_scheduler.api.policy import load_policy_config
from edl_scheduler.controller.app import main as controller_main
from edl_scheduler.controller.metrics import Metrics
from edl_scheduler.core.building import policy_from_config
from edl_scheduler.core.policy import EqualShrinking

from .controller_harness import ensure_namespace, running_controller, training_job
from .kubelet import running_kubelet
from .nodes import create_node
from .testenv import REPO, KubeAPI, running_control_plane

MANIFESTS = REPO / "manifests"
NAMESPACE = "edl-system"
ACCOUNT = "edl-controller"
LEASE = "edl-controller"
DASHBOARD = MANIFESTS / "monitoring" / "grafana-dashboard.json"
#: The timestamp that starts each line of the controller's log.
STAMP = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} ")

#: The controller's metrics (issue 5); the dashboard charts each of them and nothing else.
METRICS = {
    "edl_planner_cycle_seconds": "histogram",
    "edl_jobs": "gauge",
    "edl_gpus_capacity": "gauge",
    "edl_gpus_allocated": "gauge",
    "edl_resizes_total": "counter",
    "edl_preemptions_total": "counter",
    "edl_job_wait_seconds": "histogram",
    "edl_job_completion_seconds": "histogram",
}

# (verb, group, resource, namespace, name): "" namespace means cluster-wide.
Access = tuple[str, str, str, str, str]

#: The namespaces the examples serve (their RoleBindings), one that exists unserved.
SERVED = ("research", "ads")
UNSERVED = "unserved"
#: The ServiceAccount, as ``kubectl --as`` names it.
ACCOUNT_USER = f"system:serviceaccount:{NAMESPACE}:{ACCOUNT}"
#: The ClusterRole of the writes, bound per served namespace only.
WORKLOADS_ROLE = "edl-operator-workloads"
#: Kinds the controller writes on a job's behalf: never cluster-wide.
JOB_OBJECTS = {"pods", "secrets", "configmaps", "services", "networkpolicies", "events"}
WRITES = {"create", "update", "patch", "delete", "deletecollection", "*"}

#: What the controller does, each of which the ServiceAccount must be allowed.
NEEDED: list[Access] = [
    *[(v, "edl.dev", "trainingjobs", "", "") for v in ("list", "watch")],
    ("get", "edl.dev", "trainingjobs", "research", ""),
    ("patch", "edl.dev", "trainingjobs/status", "research", ""),
    ("update", "edl.dev", "trainingjobs/finalizers", "research", ""),
    *[(v, "", "pods", "", "") for v in ("list", "watch")],
    *[(v, "", "pods", ns, "") for v in ("get", "create", "patch", "delete") for ns in SERVED],
    ("create", "", "services", "research", ""),
    *[(v, "", "configmaps", "research", "") for v in ("get", "create", "patch")],
    ("create", "", "secrets", "research", ""),
    ("create", "", "secrets", "ads", ""),
    ("create", "networking.k8s.io", "networkpolicies", "research", ""),
    *[(v, "", "nodes", "", "") for v in ("list", "watch")],
    *[(v, "scheduling.k8s.io", "priorityclasses", "", "") for v in ("list", "watch")],
    ("create", "", "events", "research", ""),
    ("create", "coordination.k8s.io", "leases", NAMESPACE, ""),
    *[(v, "coordination.k8s.io", "leases", NAMESPACE, LEASE) for v in ("get", "update")],
    ("create", "", "configmaps", NAMESPACE, ""),
    *[(v, "", "configmaps", NAMESPACE, f"{LEASE}-reservations") for v in ("get", "patch")],
]

#: What a least-privilege controller must not be able to do.
DENIED: list[Access] = [
    *[(v, "", "secrets", ns, "") for v in ("get", "list", "watch") for ns in ("research", "")],
    *[(v, "", "secrets", NAMESPACE, "") for v in ("get", "list", "update", "patch", "delete")],
    ("get", "", "secrets", "kube-system", ""),
    *[(v, "", "nodes", "", "") for v in ("create", "update", "patch", "delete")],
    ("patch", "", "nodes/status", "", ""),
    ("create", "", "pods/exec", "research", ""),
    ("create", "", "pods/binding", "research", ""),
    ("create", "", "pods/eviction", "research", ""),
    ("update", "", "pods/status", "research", ""),
    *[
        (v, "edl.dev", "trainingjobs", "research", "")
        for v in ("create", "update", "patch", "delete")
    ],
    ("delete", "", "namespaces", "", ""),
    ("create", "apps", "deployments", "research", ""),
    ("create", "rbac.authorization.k8s.io", "clusterrolebindings", "", ""),
    ("bind", "rbac.authorization.k8s.io", "clusterroles", "", ""),
    ("escalate", "rbac.authorization.k8s.io", "clusterroles", "", ""),
    ("impersonate", "", "serviceaccounts", NAMESPACE, ""),
    ("create", "apiextensions.k8s.io", "customresourcedefinitions", "", ""),
    ("delete", "apiextensions.k8s.io", "customresourcedefinitions", "", ""),
    ("create", "scheduling.k8s.io", "priorityclasses", "", ""),
    ("update", "coordination.k8s.io", "leases", NAMESPACE, "another-lease"),
    ("update", "coordination.k8s.io", "leases", "kube-node-lease", "node-1"),
    ("create", "coordination.k8s.io", "leases", "kube-system", ""),
    # Nothing of a job's outside the served namespaces, nor cluster-wide.
    *[
        (v, "", kind, ns, "")
        for ns in ("kube-system", UNSERVED, "default", "")
        for kind, verbs in (
            ("pods", ("create", "patch", "delete")),
            ("secrets", ("create",)),
            ("services", ("create",)),
            ("configmaps", ("get", "create", "patch")),
            ("events", ("create",)),
        )
        for v in verbs
    ],
    ("get", "", "pods", "kube-system", ""),
    ("create", "networking.k8s.io", "networkpolicies", "kube-system", ""),
    ("create", "networking.k8s.io", "networkpolicies", "", ""),
    ("patch", "edl.dev", "trainingjobs/status", "kube-system", ""),
    ("patch", "edl.dev", "trainingjobs/status", "", ""),
    # In its own namespace, only the reservations' ConfigMap.
    *[(v, "", "configmaps", NAMESPACE, "edl-policy") for v in ("get", "patch")],
]

#: The fields of the Prometheus Operator's ServiceMonitor (monitoring.coreos.com/v1) that our
#: manifest uses; a structural schema prunes any field not declared, so a misspelt one shows.
SERVICE_MONITOR_CRD: dict[str, Any] = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "servicemonitors.monitoring.coreos.com"},
    "spec": {
        "group": "monitoring.coreos.com",
        "names": {
            "kind": "ServiceMonitor",
            "listKind": "ServiceMonitorList",
            "plural": "servicemonitors",
            "singular": "servicemonitor",
        },
        "scope": "Namespaced",
        "versions": [
            {
                "name": "v1",
                "served": True,
                "storage": True,
                "schema": {
                    "openAPIV3Schema": {
                        "type": "object",
                        "properties": {
                            "spec": {
                                "type": "object",
                                "required": ["selector", "endpoints"],
                                "properties": {
                                    "selector": {
                                        "type": "object",
                                        "properties": {
                                            "matchLabels": {
                                                "type": "object",
                                                "additionalProperties": {"type": "string"},
                                            }
                                        },
                                    },
                                    "namespaceSelector": {
                                        "type": "object",
                                        "properties": {
                                            "matchNames": {
                                                "type": "array",
                                                "items": {"type": "string"},
                                            }
                                        },
                                    },
                                    "endpoints": {
                                        "type": "array",
                                        "items": {
                                            "type": "object",
                                            "properties": {
                                                "port": {"type": "string"},
                                                "path": {"type": "string"},
                                                "interval": {"type": "string"},
                                            },
                                        },
                                    },
                                },
                            }
                        },
                    }
                },
            }
        ],
    },
}


def eventually(check: Callable[[], Any], timeout_s: float, what: str) -> Any:
    """Polls `check` until it returns something truthy, and returns that."""
    deadline = time.monotonic() + timeout_s
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.1)


def built(api: KubeAPI, directory: Path) -> list[dict[str, Any]]:
    """The objects `kubectl kustomize` builds from `directory`."""
    out = api.kubectl("kustomize", str(directory)).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


def crd_established(api: KubeAPI, name: str) -> bool:
    ext = kubernetes.client.ApiextensionsV1Api(api.api_client)
    conditions = ext.read_custom_resource_definition(name).status.conditions or []
    return any(c.type == "Established" and c.status == "True" for c in conditions)


@pytest.fixture(scope="module")
def cluster(kube_bin_dir: Path) -> Iterator[KubeAPI]:
    """A control plane of its own, so that the Deployment and the example jobs applied here
    never meet another test's controller, with `manifests/base` applied."""
    with running_control_plane(kube_bin_dir) as api:
        api.kubectl("apply", "-k", str(MANIFESTS / "base"))
        # The example namespaces and the RoleBindings that make them served (their jobs come
        # in test_examples_apply); one namespace that exists and is not served.
        api.kubectl("apply", "-f", str(MANIFESTS / "examples" / "namespaces.yaml"))
        api.kubectl("create", "namespace", UNSERVED)
        # The one step docs/deploy.md asks of the admin besides applying the base.
        api.kubectl(
            "-n", NAMESPACE, "create", "secret", "generic", "edl-controller-token-key",
            f"--from-literal=key={secrets.token_hex(32)}",
        )  # fmt: skip
        eventually(
            lambda: crd_established(api, "trainingjobs.edl.dev"), 30, "the CRD to be Established"
        )
        yield api


@pytest.fixture(scope="module")
def account_token(cluster: KubeAPI) -> str:
    return service_account_token(cluster, NAMESPACE, ACCOUNT)


@pytest.fixture(scope="module")
def account_client(cluster: KubeAPI, account_token: str) -> Iterator[kubernetes.client.ApiClient]:
    """A client that authenticates with the controller's ServiceAccount token."""
    token = account_token
    config = kubernetes.client.Configuration()
    config.host = cluster.server
    config.ssl_ca_cert = str(cluster.ca_file)
    config.api_key = {"authorization": f"Bearer {token}"}
    client = kubernetes.client.ApiClient(config)
    yield client
    client.close()


def service_account_token(api: KubeAPI, namespace: str, account: str) -> str:
    """Creates a token Secret for the account, 1.20 style, and returns the token the token
    controller fills in."""
    core = kubernetes.client.CoreV1Api(api.api_client)
    name = f"{account}-test-token"
    core.create_namespaced_secret(
        namespace,
        {
            "metadata": {
                "name": name,
                "annotations": {"kubernetes.io/service-account.name": account},
            },
            "type": "kubernetes.io/service-account-token",
        },
    )

    def token() -> str | None:
        data = core.read_namespaced_secret(name, namespace).data or {}
        return base64.b64decode(data["token"]).decode() if "token" in data else None

    result: str = eventually(token, 30, f"the token controller to fill {namespace}/{name}")
    return result


def test_base_creates_everything_it_builds(cluster: KubeAPI) -> None:
    objects = built(cluster, MANIFESTS / "base")
    kinds = sorted(o["kind"] for o in objects)
    assert kinds == sorted(
        [
            "ClusterRole",
            "ClusterRole",
            "ClusterRoleBinding",
            "ConfigMap",
            "CustomResourceDefinition",
            "Deployment",
            "Namespace",
            "NetworkPolicy",
            "Role",
            "RoleBinding",
            "Service",
            "ServiceAccount",
        ]
    )
    for obj in objects:
        meta = obj["metadata"]
        args = ["get", obj["kind"].lower(), meta["name"], "-o", "name"]
        if "namespace" in meta:
            args += ["-n", meta["namespace"]]
        assert cluster.kubectl(*args).stdout.strip(), f"{obj['kind']} {meta['name']} missing"
    again = cluster.kubectl("apply", "-k", str(MANIFESTS / "base")).stdout.splitlines()
    assert again and all(line.endswith(" unchanged") for line in again), again


def test_deployment_pods_run_as_the_account_with_the_policy(cluster: KubeAPI) -> None:
    core = kubernetes.client.CoreV1Api(cluster.api_client)
    selector = "app.kubernetes.io/name=edl-controller,app.kubernetes.io/component=controller"
    pods = eventually(
        lambda: (
            items
            if len(items := core.list_namespaced_pod(NAMESPACE, label_selector=selector).items) == 2
            else None
        ),
        60,
        "the ReplicaSet to create two controller pods",
    )
    (policy_map,) = [o for o in built(cluster, MANIFESTS / "base") if o["kind"] == "ConfigMap"]
    for pod in pods:
        assert pod.spec.service_account_name == ACCOUNT
        (container,) = pod.spec.containers
        assert [p.container_port for p in container.ports] == [8080]
        assert container.liveness_probe.http_get.port == "metrics"
        assert container.resources.requests and container.resources.limits
        assert container.security_context.read_only_root_filesystem
        volumes = {v.name: v for v in pod.spec.volumes}
        assert volumes["policy"].config_map.name == policy_map["metadata"]["name"]
        key = core.read_namespaced_secret(volumes["token-key"].secret.secret_name, NAMESPACE)
        assert len(base64.b64decode(key.data["key"])) >= 16
    stored = core.read_namespaced_config_map(policy_map["metadata"]["name"], NAMESPACE)
    assert stored.data == policy_map["data"]


def test_policy_config_map_is_a_valid_policy() -> None:
    config = load_policy_config((MANIFESTS / "base" / "policy.yaml").read_text())
    policy = policy_from_config(config)
    assert config.base == "edl"
    assert policy.cooldown_s == config.cooldown_seconds
    assert policy.shrink_equal_priority is EqualShrinking.ANY  # (it never suspends)


def test_controller_accepts_the_deployment_arguments(cluster: KubeAPI, tmp_path: Path) -> None:
    (deployment,) = [o for o in built(cluster, MANIFESTS / "base") if o["kind"] == "Deployment"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    policy, key = tmp_path / "policy.yaml", tmp_path / "key"
    policy.write_text((MANIFESTS / "base" / "policy.yaml").read_text())
    key.write_text(secrets.token_hex(32))
    local = {
        f"{mounts['policy']}/policy.yaml": str(policy),
        f"{mounts['token-key']}/key": str(key),
        "$(POD_NAME)": "edl-controller-abc12",
        "$(POD_NAMESPACE)": NAMESPACE,
    }
    args = []
    for arg in container["args"]:
        for path, replacement in local.items():
            arg = arg.replace(path, replacement)
        args.append(arg)
    params = controller_main.make_context("edl-controller", args).params
    assert params["metrics_port"] == container["ports"][0]["containerPort"] == 8080
    assert (params["lease_namespace"], params["lease_name"]) == (NAMESPACE, LEASE)
    assert params["identity"] == "edl-controller-abc12"
    dockerfile = (REPO / "Dockerfile").read_text()
    assert 'ENTRYPOINT ["edl-controller"]' in dockerfile
    scripts = (REPO / "pyproject.toml").read_text()
    assert 'edl-controller = "edl_scheduler.controller.app:main"' in scripts


def _review(client: kubernetes.client.ApiClient, access: Access) -> bool:
    verb, group, resource, namespace, name = access
    resource, _, subresource = resource.partition("/")
    review = kubernetes.client.AuthorizationV1Api(client).create_self_subject_access_review(
        {
            "spec": {
                "resourceAttributes": {
                    "verb": verb,
                    "group": group,
                    "resource": resource,
                    "subresource": subresource,
                    "namespace": namespace,
                    "name": name,
                }
            }
        }
    )
    return bool(review.status.allowed)


def test_account_may_do_what_the_controller_needs(
    account_client: kubernetes.client.ApiClient,
) -> None:
    refused = [access for access in NEEDED if not _review(account_client, access)]
    assert refused == []


def test_account_may_not_do_more(account_client: kubernetes.client.ApiClient) -> None:
    allowed = [access for access in DENIED if _review(account_client, access)]
    assert allowed == []


def bound_cluster_wide(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The ClusterRoles that a ClusterRoleBinding of ``objects`` grants."""
    names = {b["roleRef"]["name"] for b in objects if b["kind"] == "ClusterRoleBinding"}
    return [o for o in objects if o["kind"] == "ClusterRole" and o["metadata"]["name"] in names]


def test_nothing_of_a_job_is_written_cluster_wide(cluster: KubeAPI) -> None:
    """The manifests themselves: a write of a job's objects in a ClusterRole bound
    cluster-wide would let the controller write them in kube-system."""
    objects = built(cluster, MANIFESTS / "base")
    wide = bound_cluster_wide(objects)
    assert [r["metadata"]["name"] for r in wide] == [ACCOUNT]
    writes = [
        (rule["resources"], rule["verbs"])
        for role in wide
        for rule in role["rules"]
        if set(rule["resources"]) & (JOB_OBJECTS | {"*"}) and set(rule["verbs"]) & WRITES
    ]
    assert writes == []
    (workloads,) = [o for o in objects if o["metadata"]["name"] == WORKLOADS_ROLE]
    assert workloads["kind"] == "ClusterRole"
    examples = yaml.safe_load_all((MANIFESTS / "examples" / "namespaces.yaml").read_text())
    bindings = [o for o in examples if o["kind"] in ("RoleBinding", "ClusterRoleBinding")]
    assert sorted(b["metadata"]["namespace"] for b in bindings) == sorted(SERVED)
    for binding in bindings:
        assert binding["kind"] == "RoleBinding"
        assert binding["roleRef"] == {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "ClusterRole",
            "name": WORKLOADS_ROLE,
        }
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": ACCOUNT, "namespace": NAMESPACE}
        ]


def can_i(cluster: KubeAPI, verb: str, resource: str, namespace: str) -> bool:
    """``kubectl auth can-i``, as the admin impersonating the controller's ServiceAccount."""
    answer = cluster.kubectl(
        "auth", "can-i", verb, resource, "-n", namespace, f"--as={ACCOUNT_USER}", check=False
    )
    assert answer.stdout.strip() in ("yes", "no"), answer
    return answer.stdout.strip() == "yes"


def serve_as_documented(cluster: KubeAPI, namespace: str) -> None:
    """Runs the command docs/deploy.md gives an admin to serve ``namespace``."""
    docs = (REPO / "docs" / "deploy.md").read_text()
    (line,) = [x for x in docs.splitlines() if x.startswith("kubectl ") and "rolebinding" in x]
    words = shlex.split(line.replace("NAMESPACE", namespace))
    cluster.kubectl(*words[1:])


def test_account_creates_pods_only_in_served_namespaces(cluster: KubeAPI) -> None:
    for ns in SERVED:
        assert can_i(cluster, "create", "pods", ns), ns
    for ns in ("kube-system", UNSERVED, "default", NAMESPACE):
        for verb in ("create", "delete"):
            assert not can_i(cluster, verb, "pods", ns), (verb, ns)
    assert not can_i(cluster, "create", "secrets", "kube-system")
    assert not can_i(cluster, "create", "networkpolicies.networking.k8s.io", "kube-system")
    # The same through the API an admission webhook or a script would use.
    review = kubernetes.client.AuthorizationV1Api(cluster.api_client).create_subject_access_review(
        {
            "spec": {
                "user": ACCOUNT_USER,
                "groups": ["system:serviceaccounts", f"system:serviceaccounts:{NAMESPACE}"],
                "resourceAttributes": {
                    "verb": "create", "resource": "pods", "namespace": "kube-system",
                },
            }
        }
    )  # fmt: skip
    assert review.status.allowed is False
    # An admin serves one more namespace with the documented command.
    ensure_namespace(cluster, "late-served")
    assert not can_i(cluster, "create", "pods", "late-served")
    serve_as_documented(cluster, "late-served")
    assert eventually(lambda: can_i(cluster, "create", "pods", "late-served"), 10, "the binding")
    assert not can_i(cluster, "create", "pods", "kube-system")


def test_account_token_really_creates_but_never_reads_secrets(
    cluster: KubeAPI, account_client: kubernetes.client.ApiClient
) -> None:
    """Not only the reviews: real requests with the token, and kubectl with it."""
    as_account = kubernetes.client.CoreV1Api(account_client)
    assert as_account.list_pod_for_all_namespaces(limit=1).kind == "PodList"
    secret = {"metadata": {"name": "job-token"}, "stringData": {"token": "s3cret"}}
    pod = {"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "image": "i"}]}}
    as_account.create_namespaced_secret("research", secret)  # a served namespace
    for read in (
        lambda: as_account.read_namespaced_secret("job-token", "research"),
        lambda: as_account.list_namespaced_secret("kube-system"),
        lambda: as_account.delete_namespaced_secret("job-token", "research"),
        lambda: as_account.create_namespaced_secret("kube-system", secret),
        lambda: as_account.create_namespaced_pod("kube-system", pod),
    ):
        with pytest.raises(ApiException) as denied:
            read()
        assert denied.value.status == 403
    token = account_client.configuration.api_key["authorization"].removeprefix("Bearer ")
    for verb, resource in (("get", "secrets"), ("create", "pods")):
        can_i = cluster.kubectl(
            "--token", token, "auth", "can-i", verb, resource, "-n", "kube-system", check=False
        )
        assert (can_i.returncode, can_i.stdout.strip()) == (1, "no")


def test_controller_runs_a_job_as_the_account(
    cluster: KubeAPI, account_token: str, tmp_path: Path
) -> None:
    """Sufficiency, not only reviews: the real controller with nothing but the account's
    token (as in its pod) leads, creates a job's objects, writes its status and Events, in
    the one namespace it serves; the jobs elsewhere it leaves alone, and says so."""
    kubeconfig = yaml.safe_load(cluster.kubeconfig.read_text())
    kubeconfig["users"][0]["user"] = {"token": account_token}
    (tmp_path / "kubeconfig").write_text(yaml.safe_dump(kubeconfig))
    as_account = dataclasses.replace(cluster, kubeconfig=tmp_path / "kubeconfig")
    core = kubernetes.client.CoreV1Api(cluster.api_client)
    ensure_namespace(cluster, "rbac-job")
    serve_as_documented(cluster, "rbac-job")
    create_node(cluster.api_client, "rbac-node", gpus=2)
    objects = kubernetes.client.CustomObjectsApi(cluster.api_client)
    job = training_job("tiny", "rbac-job", min_replicas=1, max_replicas=2, samples=200)
    # Jobs it must leave alone: one in kube-system (whatever it is told), one in a
    # namespace that is not served (whatever the RBAC there).
    elsewhere = {
        ns: training_job(name, ns, min_replicas=1, max_replicas=1, samples=200)
        for ns, name in (("kube-system", "sneaky"), ("research", "outside"))
    }
    with (
        running_kubelet(cluster.api_client, tmp_path / "kubelet"),
        running_controller(
            as_account,
            tmp_path,
            identity="rbac-check",
            lease_namespace=NAMESPACE,
            extra=("--namespace", "rbac-job"),
        ) as controller,
    ):
        for manifest in (job, *elsewhere.values()):
            ns = manifest["metadata"]["namespace"]
            objects.create_namespaced_custom_object(
                "edl.dev", "v1alpha1", ns, "trainingjobs", manifest
            )

        def phase() -> str | None:
            found = objects.get_namespaced_custom_object(
                "edl.dev", "v1alpha1", "rbac-job", "trainingjobs", "tiny"
            )
            done = found.get("status", {}).get("phase") in ("Succeeded", "Failed")
            return str(found["status"]["phase"]) if done else None

        try:
            result = eventually(phase, 90, "the job to finish")
        except AssertionError as error:
            raise AssertionError(f"{error}\n{controller.log_tail()}") from None
        leases = kubernetes.client.CoordinationV1Api(cluster.api_client)
        assert leases.read_namespaced_lease(LEASE, NAMESPACE).spec.holder_identity == "rbac-check"
    log = controller.log_tail(400)  # its graceful stop included
    assert result == "Succeeded", log
    # Stopped gracefully, it gave the Lease up: the account may update it.
    assert not leases.read_namespaced_lease(LEASE, NAMESPACE).spec.holder_identity, log
    events = core.list_namespaced_event("rbac-job").items
    assert any(e.reason == "Admitted" for e in events)
    # (each line's timestamp left out: its milliseconds may read 403)
    said = "\n".join(STAMP.sub("", line) for line in log.splitlines())
    assert "403" not in said and "forbidden" not in said.lower(), log
    uid = objects.get_namespaced_custom_object(
        "edl.dev", "v1alpha1", "rbac-job", "trainingjobs", "tiny"
    )["metadata"]["uid"]
    policy = kubernetes.client.NetworkingV1Api(cluster.api_client).read_namespaced_network_policy(
        "tiny-servers", "rbac-job"
    )
    assert policy.metadata.owner_references[0].uid == uid
    for ns, manifest in elsewhere.items():
        name = manifest["metadata"]["name"]
        assert f"not acting on TrainingJob {ns}/{name}" in log, log
        found = objects.get_namespaced_custom_object(
            "edl.dev", "v1alpha1", ns, "trainingjobs", name
        )
        assert "status" not in found, found
        assert not core.list_namespaced_pod(ns, label_selector=f"edl.dev/job={name}").items
        objects.delete_namespaced_custom_object("edl.dev", "v1alpha1", ns, "trainingjobs", name)
    assert "never acts in kube-system" in log
    assert "namespace research is not served" in log


def test_rbac_has_no_wildcards_and_no_cluster_admin(cluster: KubeAPI) -> None:
    objects = built(cluster, MANIFESTS / "base")
    roles = [o for o in objects if o["kind"] in ("ClusterRole", "Role")]
    assert roles
    for role in roles:
        for rule in role["rules"]:
            for key in ("apiGroups", "resources", "verbs"):
                assert "*" not in rule[key], f"{role['metadata']['name']}: {key} has *"
    bindings = [o for o in objects if o["kind"] in ("ClusterRoleBinding", "RoleBinding")]
    assert {b["roleRef"]["name"] for b in bindings} == {"edl-controller", "edl-controller-leader"}
    secrets = [
        sorted(rule["verbs"])
        for role in roles
        for rule in role["rules"]
        if "secrets" in rule["resources"]
    ]
    assert secrets == [["create"]]


def test_examples_apply(cluster: KubeAPI) -> None:
    cluster.kubectl("apply", "-k", str(MANIFESTS / "examples"))
    scheduling = kubernetes.client.SchedulingV1Api(cluster.api_client)
    objects = kubernetes.client.CustomObjectsApi(cluster.api_client)
    for obj in built(cluster, MANIFESTS / "examples"):
        meta = obj["metadata"]
        if obj["kind"] == "TrainingJob":
            load_training_job(obj)  # the project's own checks, beyond the CRD's schema
            stored = objects.get_namespaced_custom_object(
                "edl.dev", "v1alpha1", meta["namespace"], "trainingjobs", meta["name"]
            )
            assert stored["spec"]["maxReplicas"] == obj["spec"]["maxReplicas"]
            name = obj["spec"].get("priorityClassName")
            if name is not None:
                assert scheduling.read_priority_class(name).value > 0
        elif obj["kind"] == "PriorityClass":
            assert scheduling.read_priority_class(meta["name"]).value == obj["value"]


def test_monitoring_overlay_applies(cluster: KubeAPI) -> None:
    cluster.kubectl("apply", "-f", "-", input=json.dumps(SERVICE_MONITOR_CRD))
    eventually(
        lambda: crd_established(cluster, "servicemonitors.monitoring.coreos.com"),
        30,
        "the ServiceMonitor CRD to be Established",
    )
    cluster.kubectl("apply", "-k", str(MANIFESTS / "monitoring"))
    objects = kubernetes.client.CustomObjectsApi(cluster.api_client)
    monitor = objects.get_namespaced_custom_object(
        "monitoring.coreos.com", "v1", NAMESPACE, "servicemonitors", "edl-controller"
    )
    (expected,) = [
        o for o in built(cluster, MANIFESTS / "monitoring") if o["kind"] == "ServiceMonitor"
    ]
    assert monitor["spec"] == expected["spec"]  # nothing pruned: every field is a known one
    service = kubernetes.client.CoreV1Api(cluster.api_client).read_namespaced_service(
        "edl-controller-metrics", NAMESPACE
    )
    assert expected["spec"]["endpoints"][0]["port"] in [p.name for p in service.spec.ports]
    assert service.spec.selector.items() >= expected["spec"]["selector"]["matchLabels"].items()
    dashboard = kubernetes.client.CoreV1Api(cluster.api_client).read_namespaced_config_map(
        "edl-grafana-dashboard", NAMESPACE
    )
    assert dashboard.metadata.labels["grafana_dashboard"] == "1"
    assert json.loads(dashboard.data["edl.json"]) == json.loads(DASHBOARD.read_text())


def test_dashboard_charts_every_metric_and_only_those() -> None:
    """Against the controller's own registry: a renamed metric fails here, not on a wall."""
    families = {f.name: f.type for f in Metrics().registry.collect()}
    issue = {n.removesuffix("_total") if k == "counter" else n: k for n, k in METRICS.items()}
    assert issue.items() <= families.items()
    exposed: dict[str, str] = {}
    for name, kind in families.items():
        if kind == "histogram":
            exposed |= {f"{name}_{part}": name for part in ("bucket", "count", "sum")}
        else:
            exposed[f"{name}_total" if kind == "counter" else name] = name
    dashboard = json.loads(DASHBOARD.read_text())
    panels = dashboard["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    exprs = [t["expr"] for p in panels for t in p["targets"]]
    used = set(re.findall(r"\bedl_[a-z_]+", " ".join(exprs)))
    assert used <= exposed.keys(), used - exposed.keys()
    assert {exposed[u] for u in used} == families.keys()
    for name, kind in families.items():
        if kind == "histogram":
            assert any("histogram_quantile" in e and f"{name}_bucket" in e for e in exprs), name
    variables = [v["name"] for v in dashboard["templating"]["list"]]
    assert "datasource" in variables
    for panel in panels:
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
