"""How fast the operator admits a high-priority job into a full cluster, on a real API server.

`python benchmarks/controller_latency.py` starts a Kubernetes 1.20 control plane on 127.0.0.1
(the tests' own, `tests/kube/testenv.py`), the operator as a process, 100 nodes x 8 GPUs and
200 `framework: none` TrainingJobs that fill every GPU, then creates a high-priority job and
measures T, from its creation to all of its minimum workers Running, the graceful shrink of
its victims through their coordinators included. Each round adds one more high-priority job,
which takes its GPUs from what the low-priority jobs kept. It prints one JSON line:
`{"nodes": 100, "jobs": 200, "admit_high_priority_s": T, "cycle_s": C, ...}` where T is the
median over the rounds and C the mean planning cycle (observe, plan, decide, act) from the
operator's own `edl_planner_cycle_seconds`, over the whole run (`rounds_cycle_s`: over the
rounds only, without the start's hundreds of status writes; `rounds_cycle_phases_s`: the
mean of each step of a cycle over the rounds, from `edl_planner_cycle_phase_seconds`), and
`phases_s`, when each step of each admission was first seen (from a watch on the real
nodes' pods, timed as the API delivers each change) and the kubelet in miniature's own lag
(`kubelet_s`: a worker's creation to its process, its process to Running in the API). Pods
run the runtime of the tree the script is in, so a copy of the tree at another commit
measures that commit whole.

So that it fits on a small machine, only the nodes the high-priority job may use (its
nodeSelector names them: `--real-nodes`, default 1) run their pods for real, through the
kubelet in miniature in a process of its own: real coordinators and real framework-free
workers, which the victims' drains go through. The other nodes' pods are reported Running
without a process (a kubelet played by this script; their coordinators answer from small
gRPC servers in this process), so their jobs are planned, placed and counted like any
other, but never train.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.played_cluster import (  # noqa: E402
    THIS_TREE,
    KubeletProcess,
    PlayedCoordinators,
    PlayedKubelet,
    cycle_mean,
    cycle_totals,
    operator_options,
    phase_means,
    phase_totals,
)
from tests.kube.controller_harness import (  # noqa: E402
    Cluster,
    apply_crd,
    ensure_namespace,
    eventually,
    running_controller,
    training_job,
)
from tests.kube.listing import Listings  # noqa: E402
from tests.kube.nodes import create_node  # noqa: E402
from tests.kube.testenv import ensure_binaries, running_control_plane  # noqa: E402

NS = "bench"
POOL = "edl.bench/pool"


#: The jobs' dataset: 2,000 shards of 10,000 samples an epoch, for 1,000 epochs, so that no
#: job ends during a run. A coordinator keeps each epoch's shard order in memory and
#: builds it before it listens: 10**9 samples in shards of 10 (what this script used
#: first) are 10**8 shards, which it did not finish building in minutes, so every drain
#: was refused and the victims left only at their drain deadline.
DATASET = "--samples 20000000 --shard-size 10000 --epochs 1000"


def job(name: str, pool: str, **kwargs: Any) -> dict[str, Any]:
    manifest = training_job(name, NS, **kwargs)
    manifest["metadata"]["annotations"]["edl.dev/coordinator-args"] = DATASET
    manifest["spec"]["template"]["spec"]["nodeSelector"] = {POOL: pool}
    manifest["spec"]["timeouts"] = {"drainSeconds": 10}
    manifest["spec"]["template"]["spec"]["containers"][0]["command"] = [
        *THIS_TREE, "-m", "trainer_runtime.plain_worker", "--step-time-s", "0.05",
    ]  # fmt: skip
    return manifest


class PodTimes(dict[str, dict[str, Any]]):
    """The store of a list-then-watch (``tests/kube/listing.keep_listed``) that notes when
    each pod was first seen in each state, the moment its event was read: created, marked
    draining, Running, finished (Succeeded or Failed), gone (deleted). Times are
    ``time.monotonic()``; a pod is named by its name (names are not reused in a run)."""

    def __init__(self) -> None:
        super().__init__()
        self.first: dict[str, dict[str, float]] = {}
        self.labels: dict[str, dict[str, str]] = {}
        self.names: dict[str, str] = {}  # uid -> name

    def _note(self, obj: dict[str, Any], now: float) -> None:
        meta = obj["metadata"]
        name = meta["name"]
        self.names[meta["uid"]] = name
        self.labels[name] = meta.get("labels") or {}
        seen = self.first.setdefault(name, {})
        seen.setdefault("created", now)
        if (meta.get("annotations") or {}).get("edl.dev/draining") == "true":
            seen.setdefault("draining", now)
        phase = (obj.get("status") or {}).get("phase")
        if phase == "Running":
            seen.setdefault("running", now)
        elif phase in ("Succeeded", "Failed"):
            seen.setdefault("finished", now)
        if meta.get("deletionTimestamp"):
            seen.setdefault("deleting", now)

    def __setitem__(self, uid: str, obj: dict[str, Any]) -> None:
        self._note(obj, time.monotonic())
        super().__setitem__(uid, obj)

    def update(self, items: Any = (), **_: Any) -> None:  # type: ignore[override]
        for uid, obj in items:
            self[uid] = obj

    def pop(self, uid: str, default: Any = None) -> Any:  # type: ignore[override]
        name = self.names.get(uid)
        if name is not None:
            self.first.setdefault(name, {}).setdefault("gone", time.monotonic())
        return super().pop(uid, default)


class PodWatch(Listings):
    """The pods of the real nodes, seen through a watch (one per node: a field selector
    names one node), so that each state is timed when the API delivers it, not when a
    poll from this loaded process gets round to listing a thousand pods."""

    def __init__(self, cluster: Cluster, nodes: set[str]) -> None:
        super().__init__()
        self.times = PodTimes()
        for node in sorted(nodes):
            self.listing(
                functools.partial(cluster.core.list_namespaced_pod, NS),
                self.times,
                field_selector=f"spec.nodeName={node}",
            )

    def of_job(self, job: str) -> dict[str, tuple[str, dict[str, float]]]:
        """name -> (role, first times) of the job's pods seen so far."""
        with self.lock:
            return {
                name: (labels.get("edl.dev/role", ""), dict(self.times.first.get(name, {})))
                for name, labels in self.times.labels.items()
                if labels.get("edl.dev/job") == job
            }


def process_started(pid: int) -> float | None:
    """When a process started, on ``time.monotonic()``'s clock (both count from boot here;
    /proc gives the start in clock ticks since boot, to 10 ms)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        uptime = float(Path("/proc/uptime").read_text().split()[0])
    except OSError:
        return None
    ticks = int(stat.rsplit(")", 1)[1].split()[19])
    age = uptime - ticks / os.sysconf("SC_CLK_TCK")
    return time.monotonic() - age


class Phases:
    """When each step of one admission was first seen, in seconds from the job's creation,
    from the watch's times: victims marked draining, victims gone (exited or deleted), the
    new job's coordinator Running, its workers created, all of them Running. And the kubelet
    in miniature's own lag, apart (``kubelet_s``): from a worker's creation to its process
    (``start``, the process's start time from /proc) and from the process to Running in
    the API (``report``), the slowest of the job's workers each."""

    def __init__(self, pods: PodWatch, kubelet: KubeletProcess, victim_job: str, job: str,
                 workers: int) -> None:  # fmt: skip
        self.pods = pods
        self.kubelet = kubelet
        self.victim_job = victim_job
        self.job = job
        self.workers = workers
        self.started = time.monotonic()
        #: The wall clock at creation, to compare with the operator's log.
        self.seen: dict[str, Any] = {"created_unix": round(time.time(), 3)}
        self.finished_at: float | None = None

    def _at(self, phase: str, when: float) -> None:
        self.seen.setdefault(phase, round(when - self.started, 3))

    def admitted(self) -> bool:
        theirs = self.pods.of_job(self.victim_job)
        victims = sorted(
            (t["draining"], t) for _, t in theirs.values() if t.get("draining", 0) >= self.started
        )
        if len(victims) >= self.workers:
            self._at("victims_marked_s", victims[self.workers - 1][0])
            gone = [min(t.get("finished", math.inf), t.get("gone", math.inf))
                    for _, t in victims]  # fmt: skip
            if max(gone) < math.inf:
                self._at("victims_gone_s", max(gone))
        mine = self.pods.of_job(self.job)
        for role, t in mine.values():
            if role == "coordinator":
                self._at("coordinator_created_s", t["created"])
                if "running" in t:
                    self._at("coordinator_running_s", t["running"])
        workers = {
            n: t for n, (role, t) in mine.items() if role == "worker" and "deleting" not in t
        }
        if len(workers) < self.workers:
            return False
        self._at(
            "workers_created_s", sorted(t["created"] for t in workers.values())[self.workers - 1]
        )
        running = sorted((t["running"], n) for n, t in workers.items() if "running" in t)
        if len(running) < self.workers:
            return False
        self.finished_at = running[self.workers - 1][0]
        self._at("workers_running_s", self.finished_at)
        start = report = 0.0
        for _, name in running[: self.workers]:
            pid = min(self.kubelet.pids(NS, name).values(), default=None)
            began = process_started(pid) if pid is not None else None
            if began is None:
                continue
            t = workers[name]
            start, report = max(start, began - t["created"]), max(report, t["running"] - began)
            self.seen.setdefault("worker_processes_s", []).append(round(began - self.started, 3))
        self.seen["kubelet_s"] = {"start": round(start, 3), "report": round(report, 3)}
        return True


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--jobs", type=int, default=200)
    parser.add_argument("--real-nodes", type=int, default=1)
    parser.add_argument("--high-workers", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3, help="high-priority jobs, one by one")
    parser.add_argument(
        "--workdir",
        type=Path,
        help="keep the controller's log and the pods' logs here (default: a temporary folder)",
    )
    args = parser.parse_args()
    if args.rounds * args.high_workers > args.real_nodes * args.gpus - args.real_nodes:
        parser.error("--rounds x --high-workers must leave each real low job one GPU")
    bin_dir = ensure_binaries()
    with contextlib.ExitStack() as stack:
        if args.workdir is not None:
            args.workdir.mkdir(parents=True, exist_ok=True)
            workdir = args.workdir
        else:
            workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="edl-bench-")))
        api = stack.enter_context(running_control_plane(bin_dir))
        apply_crd(api)
        ensure_namespace(api, NS)
        cluster = Cluster(api)
        real = {f"real-{i}" for i in range(args.real_nodes)}
        for name in sorted(real):
            create_node(api.api_client, name, gpus=args.gpus, labels={POOL: "real"},
                        kubelet=True)  # fmt: skip
        for i in range(args.nodes - args.real_nodes):
            create_node(api.api_client, f"played-{i}", gpus=args.gpus, labels={POOL: "played"})
        # Real elastic jobs fill the real nodes; played rigid-ish jobs fill the rest.
        real_jobs = args.real_nodes
        played_jobs = args.jobs - real_jobs
        played_gpus = (args.nodes - args.real_nodes) * args.gpus
        per_job = max(1, -(-played_gpus // played_jobs))
        kube_client = api.new_client()
        played = {f"played-{i}" for i in range(args.nodes - args.real_nodes)}
        kubelet = KubeletProcess(api.kubeconfig, workdir / "kubelet")
        stack.callback(kubelet.close)
        operator = running_controller(
            api, workdir, "bench", NS, ports="25000-25999", extra=operator_options()
        )
        player = PlayedKubelet(cluster, NS, played, PlayedCoordinators())
        with operator as ctrl, PodWatch(cluster, real) as pods, player:
            try:
                eventually(ctrl.healthy, 60, "the controller")
                for i in range(played_jobs):
                    cluster.create_job(
                        job(f"bg-{i}", "played", min_replicas=1, max_replicas=per_job,
                            priority=1)
                    )  # fmt: skip

                def running(at_least: int) -> bool:
                    live = sum(
                        1 for p in cluster.core.list_namespaced_pod(
                            NS, label_selector="edl.dev/role=worker").items
                        if p.status.phase == "Running" and not p.metadata.deletion_timestamp
                    )  # fmt: skip
                    return live >= at_least

                # The played part first: its hundreds of status writes load the machine, and
                # real workers give up on a coordinator that cannot start in time.
                played_gpus_total = (args.nodes - args.real_nodes) * args.gpus
                eventually(lambda: running(played_gpus_total), 600, "the played GPUs in use")
                for i in range(real_jobs):
                    cluster.create_job(
                        job(f"low-{i}", "real", min_replicas=1, max_replicas=args.gpus,
                            priority=1)
                    )  # fmt: skip
                eventually(lambda: running(args.nodes * args.gpus), 300, "every GPU in use")
                times: list[float] = []
                phases: list[dict[str, float]] = []
                before_rounds = cycle_totals(ctrl.metrics())
                phases_before = phase_totals(ctrl.metrics())
                for r in range(args.rounds):
                    name = f"high-{r}"
                    watch = Phases(pods, kubelet, "low-0", name, args.high_workers)
                    cluster.create_job(
                        job(name, "real", min_replicas=args.high_workers,
                            max_replicas=args.high_workers, priority=1000)
                    )  # fmt: skip
                    eventually(watch.admitted, 120, f"{name}'s workers Running")
                    assert watch.finished_at is not None
                    times.append(watch.finished_at - watch.started)
                    phases.append(watch.seen)
                    # The next round's job takes its workers from what the low jobs kept.
                result = {
                    "nodes": args.nodes,
                    "jobs": args.jobs,
                    "admit_high_priority_s": round(statistics.median(times), 3),
                    "cycle_s": round(cycle_mean(ctrl.metrics()), 4),
                    # The cycles while the rounds ran, the start's status writes left out.
                    "rounds_cycle_s": round(cycle_mean(ctrl.metrics(), before_rounds), 4),
                    # The mean of each step of a cycle over the rounds.
                    "rounds_cycle_phases_s": phase_means(ctrl.metrics(), phases_before),
                    "admit_rounds_s": [round(t, 3) for t in times],
                    "phases_s": phases,
                    "real_nodes": args.real_nodes,
                    "high_workers": args.high_workers,
                }
                print(json.dumps(result), flush=True)
            finally:
                if os.environ.get("EDL_BENCH_LOG"):
                    print(ctrl.log_tail(80), file=sys.stderr)
        kube_client.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
