"""The NetworkPolicy around each job's servers, as a pure function returning its manifest.

Why: a job's coordinator hands out its data shards and its members' addresses, and its
parameter servers hold the model; each checks the caller's credential on every call, but
anything in the cluster could still reach their ports (to probe them, or to load them). The policy
admits, to the job's coordinator pod and parameter-server pods only (``podSelector``):

- the job's own pods, in the job's namespace (``edl.dev/job=<job>``, ``edl.dev/managed``):
  its workers, parameter servers and coordinator;
- the controller's pods, in the controller's namespace (``ControllerConfig``'s operator
  namespace and pod labels): it asks the coordinator for progress, drains and the size.

Worker pods are not selected: what reaches them (the collective's peers, a framework's own
store) is the framework's and the template's business. Only ingress is limited: the servers
call nothing but the coordinator. The kubelet's probes run inside the pod (``probing``), so
no rule is needed for them.

What must stay true: the policy carries the job's labels and its owner reference
(controller, blockOwnerDeletion), like every object of the job (``shaping``), so that the
garbage collector removes it with the job; it selects the job's coordinator and parameter
servers and no other pod. It is enforced only where the cluster's network plugin enforces
NetworkPolicies; ``--no-network-policies`` leaves it out where none does.
"""

from __future__ import annotations

from edl_scheduler.api import TrainingJob
from edl_scheduler.controller.config import ControllerConfig
from edl_scheduler.controller.naming import (
    LABEL_JOB,
    LABEL_MANAGED,
    LABEL_ROLE,
    ROLE_COORDINATOR,
    network_policy_name,
)
from edl_scheduler.controller.shaping import Manifest, labels_for, owner_reference
from edl_scheduler.core import Role


def network_policy(tj: TrainingJob, config: ControllerConfig) -> Manifest:
    """The job's NetworkPolicy: only its own pods and the controller's reach its servers."""
    job = tj.metadata.name
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {
            "name": network_policy_name(job),
            "namespace": tj.metadata.namespace,
            "labels": labels_for(tj, ROLE_COORDINATOR),
            "ownerReferences": [owner_reference(tj)],
        },
        "spec": {
            "podSelector": {
                "matchLabels": {LABEL_JOB: job},
                "matchExpressions": [
                    {
                        "key": LABEL_ROLE,
                        "operator": "In",
                        "values": [ROLE_COORDINATOR, Role.PSERVER.value],
                    }
                ],
            },
            "policyTypes": ["Ingress"],
            "ingress": [
                {
                    "from": [
                        {"podSelector": {"matchLabels": {LABEL_JOB: job, LABEL_MANAGED: "true"}}},
                        {
                            "namespaceSelector": {
                                "matchLabels": config.operator_namespace_selector()
                            },
                            "podSelector": {"matchLabels": dict(config.operator_pod_labels)},
                        },
                    ]
                }
            ],
        },
    }


def job_network_policies(tj: TrainingJob, config: ControllerConfig) -> tuple[Manifest, ...]:
    """The job's NetworkPolicy, or none where ``--no-network-policies`` is set."""
    return (network_policy(tj, config),) if config.network_policies else ()
