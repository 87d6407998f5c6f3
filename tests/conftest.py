"""Session fixtures of the tests on a real API server (see `tests/kube/testenv.py`), here at
the root so that every directory (tests/kube, tests/cli) shares one control plane.

The binaries are built, when missing, right after collection and before any test runs, so a
cold build (minutes) never counts against a test's timeout; a failure to build is raised by
the `kube_api` fixture, in every test that uses it.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.kube.controller_harness import remove_jobs
from tests.kube.kubelet import MiniKubelet, running_kubelet
from tests.kube.leftovers import job_keys, orphaned_job_keys
from tests.kube.nodes import KUBELET_LABELS
from tests.kube.testenv import ControlPlaneError, KubeAPI, ensure_binaries, running_control_plane

_binaries: Path | ControlPlaneError | None = None


def pytest_collection_finish(session: pytest.Session) -> None:
    global _binaries
    if session.config.option.collectonly:
        return
    wanted = {"kube_api", "kube_bin_dir", "kubelet"}
    if any(wanted & set(getattr(item, "fixturenames", ())) for item in session.items):
        try:
            _binaries = ensure_binaries()
        except ControlPlaneError as error:
            _binaries = error


@pytest.fixture(scope="session")
def kube_bin_dir() -> Path:
    """The directory of the built binaries, for tests that start a control plane of their own
    (`testenv.running_control_plane`)."""
    bin_dir = _binaries if _binaries is not None else ensure_binaries()
    if isinstance(bin_dir, ControlPlaneError):
        raise bin_dir
    return bin_dir


@pytest.fixture(scope="session")
def kube_api(kube_bin_dir: Path) -> Iterator[KubeAPI]:
    """etcd, kube-apiserver and kube-controller-manager 1.20 on 127.0.0.1 for the session."""
    with running_control_plane(kube_bin_dir) as api:
        yield api


@pytest.fixture(scope="session")
def kubelet(kube_api: KubeAPI, tmp_path_factory: pytest.TempPathFactory) -> Iterator[MiniKubelet]:
    """The kubelet in miniature (`tests/kube/kubelet.py`) for the session's cluster.

    It serves the nodes made with `nodes.create_node(..., kubelet=True)` (labelled
    `nodes.KUBELET_LABELS`; other nodes are left to tests that play the kubelet by hand).
    Each pod bound to one (the controller sets `spec.nodeName`) has its containers'
    commands run as local processes, and its status reported Running, Succeeded or Failed;
    a deleted pod's processes are stopped after its grace period and the pod is then
    removed. For example::

        def test_job_runs(kube_api, kubelet):
            create_node(kube_api.api_client, "node-a", gpus=8, kubelet=True)
            ...  # create the TrainingJob, run the controller, wait for the pods
            print(kubelet.logs("research", "job-worker-0"))  # what `kubectl logs` would show

    Containers must give `command` (there are no images), run with this test interpreter's
    `python` first on PATH, and all pods share 127.0.0.1. `kubelet.fail_node(name)` plays a
    node that dies (processes SIGKILLed, nothing more reported). It runs on a client of its
    own and stops, ending every process it started, when the session ends.
    """
    client = kube_api.new_client()
    try:
        workdir = tmp_path_factory.mktemp("kubelet")
        with running_kubelet(client, workdir, node_labels=KUBELET_LABELS) as running:
            yield running
    finally:
        client.close()


@pytest.fixture(autouse=True)
def _test_jobs_removed(request: pytest.FixtureRequest) -> Iterator[None]:
    """Each test on the session's API server has the TrainingJobs it created removed after
    it, passed or failed, with their pods and the pods left by the jobs it deleted
    (`controller_harness.remove_jobs`): every later test runs a
    cluster-wide operator, which would plan them (and refuses to start while unfinished ones
    of other namespaces are there: `leftovers.refuse_other_tests_jobs`)."""
    if "kube_api" not in request.fixturenames:
        yield
        return
    api: KubeAPI = request.getfixturevalue("kube_api")
    before = job_keys(api)
    yield
    # And the pods of jobs it deleted itself that are still there (the garbage collector
    # removes them in its own time): the next test must not meet them.
    remove_jobs(api, (job_keys(api) - before) | orphaned_job_keys(api))
