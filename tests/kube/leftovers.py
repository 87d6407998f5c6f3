"""Which TrainingJobs are on the test API server, and refusing to start a cluster-wide
operator beside another test's unfinished ones: the operator would plan them too, and a
failure would show far from its cause. Removing a test's jobs after it is
``controller_harness.remove_jobs`` (it stops their pods' processes first).
"""

from __future__ import annotations

from typing import Any

import kubernetes
from kubernetes.client import ApiException

from .testenv import KubeAPI

GROUP, VERSION, PLURAL = "edl.dev", "v1alpha1", "trainingjobs"


def all_jobs(api: KubeAPI) -> list[dict[str, Any]]:
    """Every TrainingJob on the API server, in all namespaces (none before the CRD exists)."""
    custom = kubernetes.client.CustomObjectsApi(api.api_client)
    try:
        found = custom.list_cluster_custom_object(GROUP, VERSION, PLURAL)
    except ApiException as error:
        if error.status == 404:
            return []
        raise
    return list(found["items"])


def _key(job: dict[str, Any]) -> tuple[str, str]:
    return (job["metadata"]["namespace"], job["metadata"]["name"])


def job_keys(api: KubeAPI) -> set[tuple[str, str]]:
    """(namespace, name) of every TrainingJob on the API server."""
    return {_key(job) for job in all_jobs(api)}


def orphaned_job_keys(api: KubeAPI) -> set[tuple[str, str]]:
    """(namespace, job) of every pod of ours whose TrainingJob is gone: a job a test deleted
    whose pods the garbage collector has not removed yet. Such a pod is still there for the
    next test (its Secret may be gone already), so it is waited out like a job's."""
    core = kubernetes.client.CoreV1Api(api.api_client)
    pods = core.list_pod_for_all_namespaces(label_selector="edl.dev/job").items
    owners = {(p.metadata.namespace, (p.metadata.labels or {})["edl.dev/job"]) for p in pods}
    return owners - job_keys(api)


class OtherTestsJobs(AssertionError):
    """Unfinished TrainingJobs of another test are on the API server."""


def refuse_other_tests_jobs(api: KubeAPI, namespace: str) -> None:
    """Fails at once, naming them, when unfinished TrainingJobs outside ``namespace`` exist.

    The operator is cluster-wide: it plans every TrainingJob, so another test's left-over
    jobs would take this test's GPUs, preempt its jobs or be preempted by them, and the
    failure would show far from its cause (a test that failed before cleaning up, or one
    that does not delete its jobs; ``tests/conftest.py`` removes each test's jobs after it).
    """
    others = sorted(
        f"{ns}/{name} ({job.get('status', {}).get('phase') or 'no status'})"
        for job in all_jobs(api)
        for ns, name in [_key(job)]
        if ns != namespace and job.get("status", {}).get("phase") not in ("Succeeded", "Failed")
    )
    if others:
        raise OtherTestsJobs(
            f"the controller for namespace {namespace} would also plan {len(others)} "
            f"unfinished TrainingJob(s) of other tests: {', '.join(others)}; whatever it then "
            "did would not be this test's doing. The test that created them failed to remove "
            "them: fix its cleanup (see remove_jobs), or delete them before this test."
        )
