"""What the controller benchmarks share: a cluster of played and real nodes on the tests' own
API server, and readers of the operator's metrics.

`controller_latency.py` and `controller_recovery.py` run hundreds of pods on a small
machine. Only the real nodes (`create_node(..., kubelet=True)`) run their pods, through the
kubelet in miniature (``tests/kube/kubelet.py``) in a process of its own
(``KubeletProcess``): real coordinators and real framework-free workers. The played nodes'
pods are reported Running without a process (``PlayedKubelet``), and their coordinators are
small gRPC servers in the benchmark's process (``PlayedCoordinators``), so their jobs are
planned, placed, drained and counted like any other, but never train.

What must stay true: the played kubelet acts only on the pods of the played nodes it was
given, so it and the kubelet in miniature never act on the same pod; a played coordinator
answers for one coordinator pod (by uid) and stops listening when that pod is deleted, so a
later job's coordinator given the same port (the controller gives out the lowest free one)
never meets it. Run as a script (``--kubelet-only KUBECONFIG WORKDIR``), this module is the
kubelet in miniature's process.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from kubernetes.client import ApiException

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tests.kube.controller_harness import Cluster  # noqa: E402
from tests.kube.kubelet import running_kubelet  # noqa: E402
from tests.kube.nodes import KUBELET_LABELS  # noqa: E402
from trainer_runtime.protocol import METHODS, SERVICE, pb  # noqa: E402

#: Pods run this tree's runtime (the kubelet in miniature gives a process only the pod's
#: environment, where the installed package may be another checkout): a copy of the tree at
#: an older commit then measures that commit's coordinator and workers too.
THIS_TREE = ["/usr/bin/env", f"PYTHONPATH={REPO}", sys.executable]

#: The operator's options as deployed (``manifests/base/deployment.yaml`` leaves them at
#: their defaults): the tests' 4 s Lease lapsed under load (a cycle that outlived it acted
#: on nothing), and their 0.1 s period let back-to-back cycles take a core from the
#: processes an admission waits for (what it waits for starts a cycle at once anyway).
DEPLOYED_OPTIONS = ("--lease-duration", "10", "--min-period", "0.3", "--max-period", "3")


def operator_options() -> tuple[str, ...]:
    """The deployed options, and coordinators that run this tree's runtime."""
    coordinator = shlex.join([*THIS_TREE, "-m", "trainer_runtime.coordinator"])
    return (*DEPLOYED_OPTIONS, "--coordinator-command", coordinator)


@dataclass(slots=True)
class _PlayedJob:
    """What one played coordinator knows: its pod, its members, whether it finished."""

    job: str
    uid: str
    finished: bool = False
    members: set[str] = field(default_factory=set)
    drained: set[str] = field(default_factory=set)
    generation: int = 0


class PlayedCoordinators:
    """The coordinators of the played nodes' jobs: one small gRPC server per coordinator pod
    in this process, on the pod's port, answering what the controller asks: progress (not
    finished until ``finish``; its members, when the played kubelet reports them), drains
    (the victim is then reported to have left: ``drained``), targets, and the same state
    snapshot each time. The controller creates a job's workers only once its coordinator
    answers; a real coordinator per played job would not fit on a small machine."""

    def __init__(self) -> None:
        self.servers: dict[int, grpc.Server] = {}
        self._jobs: dict[int, _PlayedJob] = {}
        #: Jobs told to finish: a coordinator of theirs started later reports it at once.
        self._finished: set[str] = set()
        self._lock = threading.Lock()

    def _handlers(self, port: int) -> dict[str, grpc.RpcMethodHandler]:
        """The answers of the server on ``port``."""
        answers: dict[str, Callable[[Any, Any], Any]] = {
            "Drain": lambda request, _context: self._drain(port, request),
            "SetTarget": lambda _request, _context: pb.Empty(),
            "GetProgress": lambda _request, _context: self._progress(port),
            "GetSnapshot": lambda _request, _context: pb.Snapshot(state_json="{}"),
        }
        return {
            name: grpc.unary_unary_rpc_method_handler(
                answer,
                request_deserializer=METHODS[name].request.FromString,
                response_serializer=METHODS[name].reply.SerializeToString,
            )
            for name, answer in answers.items()
        }

    def _progress(self, port: int) -> Any:
        with self._lock:
            state = self._jobs.get(port)
            if state is None:
                return pb.Progress(epochs=1000)
            members = [pb.Member(worker_id=m, rank=i) for i, m in enumerate(sorted(state.members))]
            return pb.Progress(
                epochs=1000, generation=state.generation, finished=state.finished, members=members
            )

    def _drain(self, port: int, request: Any) -> Any:
        with self._lock:
            state = self._jobs.get(port)
            if state is not None:
                state.drained.add(str(request.worker_id))
        return pb.Empty()

    def serve(self, port: int, job: str = "", uid: str = "") -> None:
        """Answers on ``port`` for the coordinator pod ``uid`` of ``job`` (a new pod on a
        port answers afresh: nothing finished, no members)."""
        with self._lock:
            known = self._jobs.get(port)
            if known is None or known.uid != uid:
                self._jobs[port] = _PlayedJob(job, uid, finished=job in self._finished)
        if port in self.servers:
            return
        server = grpc.server(
            ThreadPoolExecutor(max_workers=1),
            # A stale server must make a real coordinator given this port fail to bind, not
            # share the port with it and answer for it.
            options=[("grpc.so_reuseport", 0)],
        )
        server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler(SERVICE, self._handlers(port)),)
        )
        if server.add_insecure_port(f"127.0.0.1:{port}") == 0:
            raise RuntimeError(f"port {port} is taken")
        server.start()
        self.servers[port] = server

    def release(self, port: int, uid: str) -> None:
        """The coordinator pod ``uid`` is gone: its server stops (if it still answers for it)."""
        with self._lock:
            known = self._jobs.get(port)
            if known is None or known.uid != uid:
                return
            del self._jobs[port]
        server = self.servers.pop(port, None)
        if server is not None:
            server.stop(grace=None)

    def finish(self, job: str) -> None:
        """``job``'s coordinator reports the last epoch committed from now on."""
        with self._lock:
            self._finished.add(job)
            for state in self._jobs.values():
                if state.job == job:
                    state.finished = True

    def finished(self, job: str) -> bool:
        with self._lock:
            return job in self._finished

    def drained(self, job: str, worker: str) -> bool:
        """Whether ``job``'s coordinator was asked to drain ``worker``."""
        with self._lock:
            return any(worker in s.drained for s in self._jobs.values() if s.job == job)

    def set_member(self, job: str, worker: str, member: bool) -> None:
        """The played kubelet reports ``worker`` joined (Running) or left ``job``."""
        with self._lock:
            for state in self._jobs.values():
                if state.job == job and (worker in state.members) != member:
                    (state.members.add if member else state.members.discard)(worker)
                    state.generation += 1

    def stop(self) -> None:
        for server in self.servers.values():
            server.stop(grace=None)
        self.servers.clear()


class PlayedKubelet:
    """Plays the kubelet of the ``played`` nodes in a thread of its own: reports their pods
    Running (a coordinator pod's server started first), removes deleted pods at once (a
    coordinator's server stopped first), and, with ``exits=True``, lets a worker exit 0
    (Succeeded) when its coordinator drained it or reports the job finished, as a real
    worker does. With ``members=True`` a Running worker counts as a member of its job's
    coordinator.

    It reads the pod list as plain JSON every 0.3 s: turning a thousand pods into the
    client's models that often took this process's CPU (and the GIL) from the watches that
    time what the benchmarks measure."""

    def __init__(
        self,
        cluster: Cluster,
        namespace: str,
        played: set[str],
        coordinators: PlayedCoordinators,
        *,
        exits: bool = False,
        members: bool = False,
    ) -> None:
        self.cluster = cluster
        self.namespace = namespace
        self.played = played
        self.coordinators = coordinators
        self.exits = exits
        self.members = members
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, name="played-kubelet", daemon=True)

    def __enter__(self) -> PlayedKubelet:
        self.thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stopping.set()
        self.thread.join(5)
        self.coordinators.stop()

    def _settle(self, pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        name, labels = meta["name"], meta.get("labels") or {}
        job, role = labels.get("edl.dev/job", ""), labels.get("edl.dev/role")
        port = (meta.get("annotations") or {}).get("edl.dev/coordinator-port")
        ns = self.namespace
        try:
            if meta.get("deletionTimestamp"):
                if role == "coordinator" and port:
                    self.coordinators.release(int(port), meta["uid"])
                elif self.members:
                    self.coordinators.set_member(job, name, False)
                self.cluster.core.delete_namespaced_pod(name, ns, grace_period_seconds=0)
            elif pod.get("status", {}).get("phase", "Pending") == "Pending":
                if role == "coordinator" and port:
                    self.coordinators.serve(int(port), job, meta["uid"])
                self.cluster.set_pod_phase(ns, name, "Running")
                if self.members and role == "worker":
                    self.coordinators.set_member(job, name, True)
            else:  # a Running worker that leaves: drained, or its job finished
                if self.members:
                    self.coordinators.set_member(job, name, False)
                self.cluster.set_pod_phase(ns, name, "Succeeded")
        except ApiException as error:
            # 404 and 409: the pod went or changed meanwhile; the next round sees it again.
            if error.status not in (404, 409):
                print(f"played kubelet: {name}: {error.status} {error.reason}",
                      file=sys.stderr, flush=True)  # fmt: skip
        except RuntimeError as error:  # grpc: the port is taken; the next round tries again
            print(f"played kubelet: {name}: {error}", file=sys.stderr, flush=True)

    def _todo(self, pod: dict[str, Any]) -> bool:
        node = pod.get("spec", {}).get("nodeName")
        if not node or node not in self.played:
            return False
        meta = pod["metadata"]
        phase = pod.get("status", {}).get("phase", "Pending")
        if meta.get("deletionTimestamp") or phase == "Pending":
            return True
        if not self.exits or phase != "Running":
            return False
        labels = meta.get("labels") or {}
        job = labels.get("edl.dev/job", "")
        return labels.get("edl.dev/role") == "worker" and (
            self.coordinators.finished(job) or self.coordinators.drained(job, meta["name"])
        )

    def _run(self) -> None:
        core = self.cluster.core
        with ThreadPoolExecutor(max_workers=8) as pool:
            while not self.stopping.is_set():
                try:
                    answer = core.list_namespaced_pod(self.namespace, _preload_content=False)
                    pods = json.loads(answer.data)["items"]
                except (ApiException, OSError, ValueError):
                    self.stopping.wait(0.3)
                    continue
                list(pool.map(self._settle, [p for p in pods if self._todo(p)]))
                self.stopping.wait(0.3)


class KubeletProcess:
    """The kubelet in miniature in a process of its own (this module with
    ``--kubelet-only``), as a node's kubelet is: in the benchmark's process it shared the
    GIL with the played kubelet and hundreds of played coordinators, and started a worker's
    process 2 to 6 s after the pod was created while the machine was loaded. It serves the
    nodes labelled ``KUBELET_LABELS``. Its pods' processes run with their pod's directory
    under ``workdir`` as their working directory, by which ``pids`` finds them."""

    def __init__(self, kubeconfig: Path, workdir: Path) -> None:
        self.workdir = workdir
        self.process = subprocess.Popen(
            [sys.executable, __file__, "--kubelet-only", str(kubeconfig), str(workdir)],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.process.stdout is not None
        if self.process.stdout.readline().strip() != "ready":
            self.close()
            raise RuntimeError("the kubelet in miniature did not start")

    def pids(self, namespace: str, name: str) -> dict[str, int]:
        """The processes whose working directory is the pod's (the kubelet's `pids`)."""
        prefix = str(self.workdir / f"{namespace}_{name}_")
        found = {}
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            with contextlib.suppress(OSError):
                if os.readlink(entry / "cwd").startswith(prefix):
                    found[entry.name] = int(entry.name)
        return found

    def close(self) -> None:
        """Stops it (it stops its pods' processes first, within their grace periods)."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(90)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)


def serve_kubelet(kubeconfig: Path, workdir: Path) -> int:
    """``--kubelet-only``: runs the kubelet in miniature until SIGTERM or its parent ends."""
    import kubernetes

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    parent = os.getppid()
    client = kubernetes.config.new_client_from_config(config_file=str(kubeconfig))
    with running_kubelet(client, workdir, node_labels=KUBELET_LABELS):
        print("ready", flush=True)
        while not stop.wait(0.5) and os.getppid() == parent:
            pass
    client.close()
    return 0


# ----- the operator's metrics -----


def sample(metrics: str, name: str) -> float | None:
    """The value of the unlabelled sample ``name`` in a /metrics answer (None: absent)."""
    for line in metrics.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    return None


def cycle_totals(metrics: str) -> tuple[float, float]:
    """(seconds, cycles) so far, from the operator's ``edl_planner_cycle_seconds``."""
    total = sample(metrics, "edl_planner_cycle_seconds_sum") or 0.0
    count = sample(metrics, "edl_planner_cycle_seconds_count") or 0.0
    return total, count


def cycle_mean(metrics: str, since: tuple[float, float] = (0.0, 0.0)) -> float:
    total, count = cycle_totals(metrics)
    total, count = total - since[0], count - since[1]
    return total / count if count else float("nan")


PhaseTotals = dict[str, tuple[float, float]]


def phase_totals(metrics: str) -> PhaseTotals:
    """phase -> (seconds, cycles) so far, from ``edl_planner_cycle_phase_seconds`` (empty
    for an operator without it)."""
    found: dict[str, list[float]] = {}
    for line in metrics.splitlines():
        for suffix, slot in (("_sum{", 0), ("_count{", 1)):
            if line.startswith(f"edl_planner_cycle_phase_seconds{suffix}"):
                phase = line.split('phase="', 1)[1].split('"', 1)[0]
                found.setdefault(phase, [0.0, 0.0])[slot] = float(line.split()[-1])
    return {phase: (total, count) for phase, (total, count) in found.items()}


def phase_means(metrics: str, since: PhaseTotals) -> dict[str, float]:
    """The mean time of each step of a cycle since ``since``."""
    means: dict[str, float] = {}
    for phase, (total, count) in phase_totals(metrics).items():
        before = since.get(phase, (0.0, 0.0))
        if count > before[1]:
            means[phase] = round((total - before[0]) / (count - before[1]), 4)
    return means


def main(argv: list[str]) -> int:
    if argv[:1] == ["--kubelet-only"] and len(argv) == 3:
        return serve_kubelet(Path(argv[1]), Path(argv[2]))
    print("usage: played_cluster.py --kubelet-only KUBECONFIG WORKDIR", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
