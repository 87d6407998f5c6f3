"""The real API server of tests/kube, for the Kubernetes backend's CLI tests."""

from ..kube.conftest import kube_api, kube_bin_dir

__all__ = ["kube_api", "kube_bin_dir"]
