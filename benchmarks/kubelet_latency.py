"""The tests' kubelet in miniature at scale: how soon a bound pod is reported Running.

    python benchmarks/kubelet_latency.py [--nodes 100] [--pods 200]

A real API server of its own (`tests/kube/testenv.py`), `--nodes` nodes served by one
`tests/kube/kubelet.py` kubelet, and `--pods` pods bound round-robin to them, each running
`sleep 60`, created one after another while another thread polls the pods (raw JSON, every
0.1 s). Prints one JSON line: the time to create them all (`create_s`, the API server's
share), from the first creation until all are Running (`all_running_s`), the median and
worst time from one pod's creation to its being seen Running, and the time to delete them
all (SIGTERM, then the kubelet's force deletion). All of it shares this machine, so compare
`all_running_s` with `create_s` of the same run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import kubernetes

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.kube.kubelet import running_kubelet
from tests.kube.nodes import create_node
from tests.kube.testenv import ensure_binaries, running_control_plane

NAMESPACE = "default"


def _pod(name: str, node: str) -> dict[str, Any]:
    container = {"name": "main", "image": "none", "command": ["sleep", "60"]}
    spec = {
        "nodeName": node,
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": 2,
        "containers": [container],
    }
    return {"metadata": {"name": name}, "spec": spec}


def _items(core: kubernetes.client.CoreV1Api) -> list[dict[str, Any]]:
    answer = core.list_namespaced_pod(NAMESPACE, _preload_content=False)
    items: list[dict[str, Any]] = json.loads(answer.data)["items"]
    return items


def measure(nodes: int, pods: int, timeout_s: float) -> dict[str, Any]:
    with (
        running_control_plane(ensure_binaries()) as api,
        tempfile.TemporaryDirectory() as workdir,
    ):
        core = kubernetes.client.CoreV1Api(api.api_client)
        for i in range(nodes):
            create_node(api.api_client, f"node-{i}", gpus=8)
        client = api.new_client()
        with running_kubelet(client, Path(workdir)):
            created: dict[str, float] = {}
            running: dict[str, float] = {}

            def poll() -> None:
                deadline = time.monotonic() + timeout_s
                while len(running) < pods and time.monotonic() < deadline:
                    items = _items(core)
                    now = time.monotonic()
                    for pod in items:
                        name = pod["metadata"]["name"]
                        if pod["status"].get("phase") == "Running" and name not in running:
                            running[name] = now
                    time.sleep(0.1)

            poller = threading.Thread(target=poll, name="poll")
            poller.start()
            started = time.monotonic()
            for i in range(pods):
                core.create_namespaced_pod(NAMESPACE, _pod(f"pod-{i}", f"node-{i % nodes}"))
                created[f"pod-{i}"] = time.monotonic()
            create_s = time.monotonic() - started
            poller.join()
            latencies = sorted(running[n] - created[n] for n in running)
            deleting = time.monotonic()
            core.delete_collection_namespaced_pod(NAMESPACE)
            while _items(core) and time.monotonic() < deleting + timeout_s:
                time.sleep(0.1)
            delete_s = time.monotonic() - deleting
        client.close()
    return {
        "nodes": nodes,
        "pods": pods,
        "running": len(running),
        "create_s": round(create_s, 2),
        "all_running_s": round(max(running.values()) - started, 2) if running else None,
        "median_create_to_running_s": round(statistics.median(latencies), 3) if latencies else None,
        "max_create_to_running_s": round(latencies[-1], 3) if latencies else None,
        "delete_all_s": round(delete_s, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--pods", type=int, default=200)
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per phase")
    args = parser.parse_args()
    print(json.dumps(measure(args.nodes, args.pods, args.timeout)))


if __name__ == "__main__":
    main()
