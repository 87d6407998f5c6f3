"""Fixtures of the tests on a real API server (see `testenv.py`).

The binaries are built, when missing, right after collection and before any test runs, so a
cold build (minutes) never counts against a test's timeout; a failure to build is raised by
the `kube_api` fixture, in every test that uses it.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from .testenv import ControlPlaneError, KubeAPI, ensure_binaries, running_control_plane

_binaries: Path | ControlPlaneError | None = None


def pytest_collection_finish(session: pytest.Session) -> None:
    global _binaries
    if session.config.option.collectonly:
        return
    wanted = {"kube_api", "kube_bin_dir"}
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
