"""The manifests of a job's objects.

Aspects:
- worker pods keep the template's own containers, labels and environment, add the contract
  (replacing variables of the same name) and GPU requests equal to limits;
- the coordinator runs in independent mode for framework none, starts from a saved state
  through EDL_COORDINATOR_STATE, or on the job's claim with state kind volume;
- a job without its coordinator's dataset options, or with broken quoting, is refused with
  the annotation named;
- ports: shared, or the lowest free one of a range; a full range is an error naming the option;
- tokens are derived from the job's UID and differ between jobs; each replica gets a
  credential of its own, in a Secret of its own, and the coordinator and the servers the
  job's public key; with TLS on, every pod gets the job's certificate and only its servers
  (coordinator, parameter servers) its key, from the job's TLS Secret;
- a job naming `edl.dev/checkpoints` on a shared read-write volume has its workers told
  EDL_CHECKPOINT_DIR (the directory plus the job's uid); one on unusable storage is refused
  naming the annotation and the fix; without it nothing is set;
- probes: the coordinator and each parameter server get readiness and liveness probes that
  ask their gRPC health service on the port and address they listen on, run by the
  interpreter that runs them; the template's probes of the training script stay on workers
  and go from parameter servers; workers get none of ours; a parameter server without a
  fixed port gets none; the coordinator's Service does not wait for readiness;
- the NetworkPolicy selects only the job's coordinator and parameter servers, admits only
  the job's own pods and the controller's pods in the controller's namespace (labels
  configurable), limits ingress only, and is owned by the job (garbage-collectable).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from edl_scheduler.api import load_training_job
from edl_scheduler.controller.config import ConfigError, ControllerConfig, PortRange
from edl_scheduler.controller.isolating import job_network_policies, network_policy
from edl_scheduler.controller.probing import interpreter_of
from edl_scheduler.controller.shaping import (
    ShapingError,
    checkpoint_dir,
    coordinator_pod,
    coordinator_service,
    credential_secret,
    free_port,
    replica_pod,
    tls_secret,
)
from edl_scheduler.core import Role
from trainer_runtime.protocol.credentials import CallerRole, Claims

CONFIG = ControllerConfig(token_key=b"k" * 32)


def body(**spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "edl.dev/v1alpha1",
        "kind": "TrainingJob",
        "metadata": {
            "name": "j",
            "namespace": "ns",
            "uid": "u",
            "annotations": {"edl.dev/coordinator-args": "--samples 10 --epochs '2'"},
        },
        "spec": {
            "minReplicas": 1,
            "maxReplicas": 2,
            "framework": "none",
            "resources": {"nvidia.com/gpu": 2, "cpu": "500m"},
            "template": {
                "metadata": {"labels": {"team": "a"}},
                "spec": {
                    "containers": [
                        {"name": "w", "image": "img", "command": ["train"],
                         "env": [{"name": "A", "value": "1"},
                                 {"name": "EDL_WORKER_ID", "value": "spoofed"}]},
                        {"name": "sidecar", "image": "side"},
                    ]
                },
            },
        }
        | spec,
    }  # fmt: skip


def test_worker_pod_keeps_the_template_and_adds_the_contract() -> None:
    pod = replica_pod(load_training_job(body()), "j-worker-1", "n1", Role.WORKER, "h:1", CONFIG)
    assert pod["metadata"]["labels"]["team"] == "a"
    assert pod["metadata"]["labels"]["edl.dev/role"] == "worker"
    main, sidecar = pod["spec"]["containers"]
    assert sidecar == {"name": "sidecar", "image": "side"}
    env = {e["name"]: e for e in main["env"]}
    assert env["A"]["value"] == "1"
    assert env["EDL_WORKER_ID"]["value"] == "j-worker-1"
    assert [e["name"] for e in main["env"]].count("EDL_WORKER_ID") == 1
    assert main["resources"] == {
        "requests": {"nvidia.com/gpu": "2", "cpu": "500m"},
        "limits": {"nvidia.com/gpu": "2"},
    }
    assert pod["spec"]["nodeName"] == "n1" and pod["spec"]["restartPolicy"] == "Never"


def test_coordinator_modes_and_state() -> None:
    tj = load_training_job(body())
    fresh = coordinator_pod(tj, "n1", 7070, CONFIG, None)["spec"]["containers"][0]
    assert fresh["command"][-6:] == ["--mode", "independent", "--samples", "10", "--epochs", "2"]
    seeded = coordinator_pod(tj, "n1", 7070, CONFIG, '{"x": 1}')["spec"]["containers"][0]
    assert seeded["command"][:2] == ["sh", "-c"]
    assert {"name": "EDL_COORDINATOR_STATE", "value": '{"x": 1}'} in seeded["env"]
    torch = load_training_job(body(framework="torch"))
    assert (
        "group"
        in coordinator_pod(torch, "n1", 7070, CONFIG, None)["spec"]["containers"][0]["command"]
    )
    volume = load_training_job(
        body(coordinator={"state": {"kind": "volume", "claimName": "claim"}})
    )
    pod = coordinator_pod(volume, "n1", 7070, CONFIG, "ignored")
    assert pod["spec"]["volumes"][0]["persistentVolumeClaim"]["claimName"] == "claim"
    assert pod["spec"]["containers"][0]["command"][-2:] == [
        "--state-file",
        "/var/lib/edl/state.json",
    ]


@pytest.mark.parametrize("args", [None, "--samples '10"])
def test_bad_coordinator_args_name_the_annotation(args: str | None) -> None:
    raw = body()
    if args is None:
        del raw["metadata"]["annotations"]["edl.dev/coordinator-args"]
    else:
        raw["metadata"]["annotations"]["edl.dev/coordinator-args"] = args
    with pytest.raises(ShapingError, match=r"edl\.dev/coordinator-args"):
        coordinator_pod(load_training_job(raw), "n1", 7070, CONFIG, None)


def test_ports_and_tokens() -> None:
    assert free_port([7070, 7070], CONFIG) == 7070
    ranged = ControllerConfig(coordinator_ports=PortRange.parse("100-102"))
    assert free_port([100, 102], ranged) == 101
    with pytest.raises(ShapingError, match="--coordinator-ports"):
        free_port([100, 101, 102], ranged)
    with pytest.raises(ConfigError, match="--coordinator-ports"):
        PortRange.parse("9-x")
    assert CONFIG.token_for("a") != CONFIG.token_for("b")
    assert CONFIG.token_for("a") == ControllerConfig(token_key=b"k" * 32).token_for("a")
    with pytest.raises(ConfigError, match="--token-key-file"):
        ControllerConfig().token_for("a")


def with_checkpoints(path: str, volume: dict[str, Any]) -> dict[str, Any]:
    manifest = body()
    manifest["metadata"]["annotations"]["edl.dev/checkpoints"] = path
    template = manifest["spec"]["template"]["spec"]
    template["volumes"] = [{"name": "shared", **volume}]
    template["containers"][0]["volumeMounts"] = [{"name": "shared", "mountPath": "/shared"}]
    return manifest


def test_workers_are_told_the_checkpoint_directory_the_job_names() -> None:
    claim = {"persistentVolumeClaim": {"claimName": "c"}}
    tj = load_training_job(with_checkpoints("/shared/ckpt", claim))
    assert checkpoint_dir(tj) == "/shared/ckpt/u"
    pod = replica_pod(tj, "j-worker-1", "n1", Role.WORKER, "h:1", CONFIG)
    env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
    assert env["EDL_CHECKPOINT_DIR"] == "/shared/ckpt/u"
    plain = replica_pod(load_training_job(body()), "j-worker-1", "n1", Role.WORKER, "h:1", CONFIG)
    assert "EDL_CHECKPOINT_DIR" not in {e["name"] for e in plain["spec"]["containers"][0]["env"]}


@pytest.mark.parametrize(
    ("path", "volume", "says"),
    [
        ("ckpt", {"persistentVolumeClaim": {"claimName": "c"}}, "absolute path"),
        ("/elsewhere", {"persistentVolumeClaim": {"claimName": "c"}}, "lies on no volume"),
        ("/shared/ckpt", {"emptyDir": {}}, "not shared by every pod"),
    ],
)
def test_unusable_checkpoint_directory_is_named_with_the_fix(
    path: str, volume: dict[str, Any], says: str
) -> None:
    with pytest.raises(ShapingError, match=says) as refused:
        checkpoint_dir(load_training_job(with_checkpoints(path, volume)))
    assert "edl.dev/checkpoints" in str(refused.value)


def test_credentials_each_replica_its_own_and_the_servers_the_public_key() -> None:
    tj = load_training_job(body())
    keys = CONFIG.credentials_for("ns", "j", "u")
    secret = credential_secret(tj, "j-worker-1", Role.WORKER, CONFIG)
    assert secret["metadata"]["name"] == "j-worker-1-credential"
    assert secret["metadata"]["ownerReferences"][0]["uid"] == "u"
    claims = keys.verifier().claims(secret["stringData"]["token"])
    assert claims == Claims("ns/j/u", CallerRole.WORKER, "j-worker-1")
    server = credential_secret(tj, "j-pserver-1", Role.PSERVER, CONFIG)
    assert keys.verifier().claims(server["stringData"]["token"]) == Claims(
        "ns/j/u", CallerRole.SERVER, "j-pserver-1"
    )
    coordinator = env_of(coordinator_pod(tj, "n1", 7070, CONFIG, None))
    assert coordinator["EDL_TRUSTED_KEY"]["value"] == keys.issuer.public_text()
    assert coordinator["EDL_JOB_IDENTITY"]["value"] == "ns/j/u"
    assert "EDL_JOB_TOKEN" not in coordinator  # it checks credentials and holds none
    pserver = env_of(replica_pod(tj, "j-pserver-1", "n1", Role.PSERVER, "h:1", CONFIG))
    assert pserver["EDL_TRUSTED_KEY"]["value"] == keys.issuer.public_text()
    worker = env_of(replica_pod(tj, "j-worker-1", "n1", Role.WORKER, "h:1", CONFIG))
    assert "EDL_TRUSTED_KEY" not in worker


def test_tls_gives_every_pod_the_certificate_and_only_servers_the_key() -> None:
    tj = load_training_job(body())
    assert tls_secret(tj, CONFIG) is None  # off unless the deployment turns it on
    assert not any(name.startswith("EDL_TLS") for name in env_of(coordinator_pod(
        tj, "n1", 7070, CONFIG, None)))  # fmt: skip
    on = dataclasses.replace(CONFIG, tls=True)
    tls = on.tls_for("u")
    assert tls is not None and tls.key_pem is not None
    secret = tls_secret(tj, on)
    assert secret is not None and secret["metadata"]["name"] == "j-tls"
    assert secret["stringData"] == {"tls.key": tls.key_pem}
    key_ref = {"secretKeyRef": {"name": "j-tls", "key": "tls.key"}}
    for server in (
        env_of(coordinator_pod(tj, "n1", 7070, on, None)),
        env_of(replica_pod(tj, "j-pserver-1", "n1", Role.PSERVER, "h:1", on)),
    ):
        assert server["EDL_TLS_CERT"]["value"] == tls.cert_pem
        assert server["EDL_TLS_KEY"]["valueFrom"] == key_ref
    worker = env_of(replica_pod(tj, "j-worker-1", "n1", Role.WORKER, "h:1", on))
    assert worker["EDL_TLS_CERT"]["value"] == tls.cert_pem
    assert "EDL_TLS_KEY" not in worker
    assert on.tls_for("other-uid") != tls  # a certificate per job


def env_of(pod: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in pod["spec"]["containers"][0]["env"]}


def ps_body() -> dict[str, Any]:
    manifest = with_checkpoints("/shared/ckpt", {"persistentVolumeClaim": {"claimName": "c"}})
    manifest["metadata"]["annotations"]["edl.dev/ps-snapshots"] = "/shared/ps"
    pserver = {"minReplicas": 1, "maxReplicas": 2}
    manifest["spec"] |= {"strategy": "ps", "framework": "torch", "pserver": pserver}
    return manifest


def probe_command(container: dict[str, Any], kind: str) -> list[str]:
    probe = container[kind]
    assert set(probe) >= {"exec", "periodSeconds", "timeoutSeconds", "failureThreshold"}
    return list(probe["exec"]["command"])


def test_coordinator_and_parameter_servers_are_probed_through_their_health_service() -> None:
    tj = load_training_job(body())
    coordinator = coordinator_pod(tj, "n1", 7070, CONFIG, None)["spec"]["containers"][0]
    for kind in ("readinessProbe", "livenessProbe"):
        command = probe_command(coordinator, kind)
        assert command[:3] == ["python", "-m", "trainer_runtime.protocol.health_probe"]
        assert command[command.index("--port") + 1] == "7070"
        assert "--host" not in command  # bound to every interface: the loopback answers
    assert coordinator["livenessProbe"]["initialDelaySeconds"] > 0
    # The interpreter that runs the coordinator runs its probe; a bound address is probed.
    own = dataclasses.replace(
        CONFIG,
        coordinator_command=("/venv/bin/python", "-m", "trainer_runtime.coordinator"),
        coordinator_bind="10.0.0.5",
    )
    bound = coordinator_pod(tj, "n1", 7070, own, None)["spec"]["containers"][0]
    command = probe_command(bound, "livenessProbe")
    assert command[0] == "/venv/bin/python"
    assert command[command.index("--host") + 1] == "10.0.0.5"
    assert interpreter_of(("sh", "-c", "serve")) == ("python",)
    service = coordinator_service(tj, 7070)
    assert service["spec"]["publishNotReadyAddresses"] is True

    ps = load_training_job(ps_body())
    server = replica_pod(ps, "j-pserver-1", "n1", Role.PSERVER, "h:1", CONFIG)
    (main,) = server["spec"]["containers"]
    assert main["command"][main["command"].index("--port") + 1] == "7071"
    for kind in ("readinessProbe", "livenessProbe"):
        command = probe_command(main, kind)
        assert command[command.index("--port") + 1] == "7071"
        # It listens on the pod's IP, which only the container's environment holds.
        assert command[command.index("--host-env") + 1] == "EDL_WORKER_HOST"
    unprobed = replica_pod(
        ps, "j-pserver-1", "n1", Role.PSERVER, "h:1", dataclasses.replace(CONFIG, pserver_port=0)
    )["spec"]
    assert not {"readinessProbe", "livenessProbe"} & unprobed["containers"][0].keys()


def test_workers_keep_the_templates_probes_and_get_none_of_ours() -> None:
    plain = replica_pod(load_training_job(body()), "j-worker-1", "n1", Role.WORKER, "h:1", CONFIG)
    for container in plain["spec"]["containers"]:
        assert not {"readinessProbe", "livenessProbe", "startupProbe"} & container.keys()
    own = {"exec": {"command": ["cat", "/tmp/alive"]}, "periodSeconds": 30}
    raw = body()
    raw["spec"]["template"]["spec"]["containers"][0]["livenessProbe"] = own
    kept = replica_pod(load_training_job(raw), "j-worker-1", "n1", Role.WORKER, "h:1", CONFIG)
    assert kept["spec"]["containers"][0]["livenessProbe"] == own
    ps = ps_body()
    ps["spec"]["template"]["spec"]["containers"][0]["livenessProbe"] = own
    server = replica_pod(load_training_job(ps), "j-pserver-1", "n1", Role.PSERVER, "h:1", CONFIG)
    assert server["spec"]["containers"][0]["livenessProbe"] != own


def test_network_policy_admits_only_the_jobs_pods_and_the_controllers() -> None:
    tj = load_training_job(body())
    policy = network_policy(tj, CONFIG)
    assert policy["apiVersion"] == "networking.k8s.io/v1" and policy["kind"] == "NetworkPolicy"
    meta = policy["metadata"]
    assert (meta["name"], meta["namespace"]) == ("j-servers", "ns")
    assert meta["labels"]["edl.dev/job"] == "j"
    (owner,) = meta["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["uid"]) == ("TrainingJob", "j", "u")
    assert owner["controller"] is True and owner["blockOwnerDeletion"] is True
    spec = policy["spec"]
    assert spec["policyTypes"] == ["Ingress"]
    assert spec["podSelector"] == {
        "matchLabels": {"edl.dev/job": "j"},
        "matchExpressions": [
            {"key": "edl.dev/role", "operator": "In", "values": ["coordinator", "pserver"]}
        ],
    }
    (rule,) = spec["ingress"]
    assert "ports" not in rule  # every port of the servers, from these peers only
    job_pods, controller = rule["from"]
    own = {"edl.dev/job": "j", "edl.dev/managed": "true"}
    assert job_pods == {"podSelector": {"matchLabels": own}}
    assert controller == {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "edl-system"}},
        "podSelector": {
            "matchLabels": {
                "app.kubernetes.io/name": "edl-controller",
                "app.kubernetes.io/component": "controller",
            }
        },
    }
    custom = ControllerConfig(
        operator_namespace_labels=(("team", "platform"),),
        operator_pod_labels=(("app", "edl"),),
    )
    _, theirs = network_policy(tj, custom)["spec"]["ingress"][0]["from"]
    assert theirs["namespaceSelector"]["matchLabels"] == {"team": "platform"}
    assert theirs["podSelector"]["matchLabels"] == {"app": "edl"}
    assert job_network_policies(tj, ControllerConfig(network_policies=False)) == ()
