"""How fast the operator re-converges after a SIGKILL during a busy run, on a real API server.

`python benchmarks/controller_recovery.py` starts the tests' Kubernetes 1.20 control plane
on 127.0.0.1 (``tests/kube/testenv.py``), played nodes and one real node (``played_cluster``:
the real node's pods run through the kubelet in miniature, real coordinators and real
framework-free workers; the played nodes' pods are reported Running without a process and
their coordinators answer from this process), and the operator as a process with the
deployed Lease duration and periods. A seeded driver keeps the cluster busy: elastic jobs
of mixed priorities (1, 10, 100) arrive; played jobs end after a random time (their
coordinator reports the last epoch committed, or the user deletes the job), real ones when
they have trained their samples; the planner shrinks jobs for higher-priority arrivals
(victims drained through their coordinators) and grows them into what others free. The
operator is SIGKILLed at random points (seeded) many times, each time restarted at once or
after up to a second; every check below runs on every run. It prints one JSON line:
``{"nodes": N, "jobs": J, "kills": K, "reconverge_s": median, "reconverge_p95_s": ...,
"reconverge_max_s": ..., "first_cycle_s": median, "reconverge_all_s": [...],
"violations": 0, "samples_lost": 0, "samples_repeated": 0, ...}`` and exits non-zero on a
violation. ``reconverge_p95_s`` is the nearest-rank 95th percentile of the restarts that
re-converged.

Re-convergence, defined: from the new process's start (``Popen``) to the first moment t
such that
(a) the new process has completed a planning cycle as leader (``first_cycle_s``: the same
    start to the first cycle, through ``edl_planner_cycle_seconds_count``), and
(b) from t on, the cluster matches what the operator plans for it: every job has a status
    written by the operator for its current generation; for a job not finished, its
    status names exactly its live workers (``status.allocation``: not draining, not being
    deleted, each on the node named), each Running, ``status.replicas`` counts them, and
    its coordinator is Running when it has workers; no exited replica is left; no draining
    victim is left past its drain deadline; no pod of a finished job is left past the drain
    deadline after its completion, and none of a deleted job; and
(c) the operator wants no move in that world: every planning cycle that ended between t and
    the confirmation was quiet (its plan wanted no change, and it made no move: no pod
    created or deleted, no drain mark or drain, no target, no coordinator, Secret or
    Service: ``edl_planner_quiet_cycles``, consecutive quiet cycles up to the last), and
    at least one of them started after t.
While it is measured, the driver changes nothing (no job arrives, ends or is deleted; it
keeps acting between kills and while the operator is down); a real job may still finish on
its own, which the operator must then act on too.

How it is observed, and why that is sound: (b) is evaluated on two list-then-watch caches
(this namespace's pods and TrainingJobs), each an exact past state of the API server,
since a watch delivers every change of its resource in resourceVersion order; (a) and (c)
come from one answer of the operator's ``/metrics`` each 0.1 s (the cycle count and the
quiet streak in one answer are consistent). t is the first poll from which (b) held at
every poll; with N the cycle count read at t, the confirmation is a later answer with
count >= N + 2 and a quiet streak >= count - N: cycle N + 2 started after cycle N + 1
ended, which was after t, and no cycle since t wanted a move. A change that broke (b) and
healed between two polls could hide from the watch check, not from (c): a change the plan
wants and a move of the operator break the streak.

The invariants, checked on every change the pod watch delivers (every state of the
namespace's pods, not samples): no node over-committed (GPUs of pods not finished, those
being deleted included, against the node's), no job with more live workers than its
``maxReplicas`` (a duplicate); at the end, every job the driver did not delete Succeeded
and nothing of them is left (no orphan); and every real job that Succeeded trained each of
its samples exactly once (``samples_lost``, ``samples_repeated``), as its workers' ledger
files say (``plain_worker --ledger-dir``: the commits each worker saw answered; a commit
sent and never answered counts only if no other worker trained its samples, see
``tests/runtime/ledger_files.py``; how many were so decided is ``unknown_intents``). Its
coordinator's own ledger cannot say it: it counts each sample done once by construction,
and a sample trained twice would show only in the workers. They are printed in the JSON
line.

The Lease: with ``--identity same`` (the default) the restarted process has the old one's
identity, as a container restarted in its pod has (the Deployment names each replica after
its pod), and takes its own Lease at once. With ``--identity fresh`` each restart is a new
replica, which must wait for the dead leader's Lease to lapse (``--lease-duration``, 10 s as
deployed, counted from its last renewal).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import random
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.played_cluster import (  # noqa: E402
    KubeletProcess,
    PlayedCoordinators,
    PlayedKubelet,
    operator_options,
    sample,
)
from benchmarks.recovery_checks import (  # noqa: E402
    CheckedPods,
    Violations,
    labels_of,
    trained_exactly_once,
    unsettled,
)
from benchmarks.recovery_driver import DRAIN_S, POOL, Driver, Settings, Watched  # noqa: E402
from benchmarks.runtime_soak import nearest_rank  # noqa: E402
from tests.kube.controller_harness import (  # noqa: E402
    Cluster,
    ControllerProcess,
    apply_crd,
    ensure_namespace,
    eventually,
    running_controller,
)
from tests.kube.nodes import create_node  # noqa: E402
from tests.kube.testenv import KubeAPI, ensure_binaries, running_control_plane  # noqa: E402


@dataclass(slots=True)
class Restart:
    """One restart, seconds from the new process's start."""

    serving_s: float | None = None  # /metrics answers (imports, kopf's start)
    first_cycle_s: float | None = None  # its first planning cycle as leader
    reconverge_s: float | None = None  # the definition in the module's docstring
    waited_for: str = ""  # the last reason (b) did not hold
    #: From the operator's log: its startup handler ran (imports, kopf's start), every
    #: watched object listed, the Lease taken, and its first cycle's own duration.
    log_s: dict[str, float] = field(default_factory=dict)
    #: (seconds, why (b) did not hold) each time the reason changed; (seconds, "") when it
    #: held; (seconds, "moved") when a cycle wanted a move after it held.
    trace: list[tuple[float, str]] = field(default_factory=list)

    def note(self, at: float, why: str) -> None:
        if not self.trace or self.trace[-1][1] != why:
            self.trace.append((round(at, 2), why))


def measure(ctrl: ControllerProcess, watched: Watched, timeout_s: float) -> Restart:
    """Polls the new process's /metrics and the watch caches until re-convergence (see the
    module's docstring) or ``timeout_s``."""
    started = time.monotonic()
    found = Restart()
    streak: tuple[float, float] | None = None  # (t, cycle count read at t)
    while time.monotonic() - started < timeout_s:
        try:
            text = ctrl.metrics()
        except OSError:
            time.sleep(0.05)
            continue
        now = time.monotonic()
        if found.serving_s is None:
            found.serving_s = now - started
        cycles = sample(text, "edl_planner_cycle_seconds_count") or 0.0
        quiet = sample(text, "edl_planner_quiet_cycles") or 0.0
        if cycles < 1:
            time.sleep(0.05)
            continue
        if found.first_cycle_s is None:
            found.first_cycle_s = now - started
        pods, jobs = watched.state()
        why = unsettled(pods, jobs, time.time())
        if why is None and streak is not None and quiet < cycles - streak[1]:
            why = "moved"  # a cycle since t wanted a move: t was not the end
        found.note(now - started, why or "")
        if why is not None:
            streak = None
            found.waited_for = why
        elif streak is None:
            streak = (now, cycles)
        elif cycles >= streak[1] + 2:
            found.reconverge_s = streak[0] - started
            return found
        time.sleep(0.1)
    return found


#: The operator's log lines that mark its start, from ``app`` and ``looping``.
LOG_MARKS = {
    "started": " started",
    "listed": "every watched object listed",
    "leading": "leading: the Lease",
    "first_cycle": "first cycle as leader done",
}


def startup_from_log(log: str, started_wall: float) -> dict[str, float]:
    """Seconds from ``started_wall`` to each of ``LOG_MARKS`` in a restart's log (the log's
    clock is the local wall clock, to the millisecond), and the first cycle's own duration
    (``first_cycle_own``)."""
    found: dict[str, float] = {}
    for line in log.splitlines():
        for name, mark in LOG_MARKS.items():
            if name in found or mark not in line:
                continue
            if name == "started" and "edl.controller INFO controller" not in line:
                continue
            with contextlib.suppress(ValueError):
                at = datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()
                found[name] = round(at - started_wall, 3)
                if name == "first_cycle":
                    found["first_cycle_own"] = float(line.rsplit(" in ", 1)[1].split()[0])
    return found


def _median(values: list[float]) -> float | None:
    return round(statistics.median(values), 3) if values else None


def run(
    api: KubeAPI,
    workdir: Path,
    settings: Settings,
    *,
    ns: str = "recovery",
    prefix: str = "",
    ports: str = "28000-28999",
) -> dict[str, Any]:
    """The benchmark's core on ``api``, whose kubelet in miniature must serve the nodes it
    creates with ``kubelet=True`` (the benchmark's own process, or the tests' fixture)."""
    load_before = os.getloadavg()
    apply_crd(api)
    ensure_namespace(api, ns)
    cluster = Cluster(api)
    capacity: dict[str, int] = {}
    for i in range(settings.real_nodes):
        name = f"{prefix}real-{i}"
        create_node(api.api_client, name, gpus=settings.real_gpus, labels={POOL: f"{ns}-real"},
                    kubelet=True)  # fmt: skip
        capacity[name] = settings.real_gpus
    played = {f"{prefix}played-{i}" for i in range(settings.played_nodes)}
    for name in sorted(played):
        create_node(api.api_client, name, gpus=settings.gpus, labels={POOL: f"{ns}-played"})
        capacity[name] = settings.gpus
    violations = Violations()
    max_replicas: dict[str, int] = {}
    coordinators = PlayedCoordinators()
    restarts: list[Restart] = []
    operator = running_controller(
        api, workdir, f"{ns}-0", ns, ports=ports, extra=operator_options()
    )
    watched = Watched(cluster, ns, CheckedPods(capacity, max_replicas, violations))
    player = PlayedKubelet(cluster, ns, played, coordinators, exits=True, members=True)
    driver = Driver(
        cluster, ns, settings, coordinators, watched, max_replicas, workdir / f"{ns}-ledgers"
    )
    rng = random.Random(settings.seed + 1)
    with operator as ctrl, watched, player, driver:
        eventually(ctrl.healthy, 120, "the controller's /healthz")
        # Fill the cluster, then let it settle once before the first kill.
        while len(driver.ends) < settings.played_jobs:
            driver.step()
        warm = measure(ctrl, watched, settings.reconverge_timeout_s)
        if warm.reconverge_s is None:
            violations.add("not_reconverged", f"the start: {warm.waited_for}")
        for k in range(settings.kills):
            driver.running.set()
            time.sleep(rng.uniform(*settings.busy_s))
            ctrl.kill()
            time.sleep(rng.uniform(*settings.down_s))
            if settings.identity == "fresh":
                at = ctrl.argv.index("--identity") + 1
                ctrl.argv[at] = f"{ns}-{k + 1}"
            offset, started_wall = ctrl.log_path.stat().st_size, time.time()
            ctrl.start()
            driver.pause()
            found = measure(ctrl, watched, settings.reconverge_timeout_s)
            with ctrl.log_path.open(errors="replace") as log:
                log.seek(offset)
                found.log_s = startup_from_log(log.read(), started_wall)
            restarts.append(found)
            if os.environ.get("EDL_BENCH_LOG"):
                print(f"restart {k + 1}: {asdict(found)}", file=sys.stderr, flush=True)
            if found.reconverge_s is None:
                violations.add("not_reconverged", f"restart {k + 1}: {found.waited_for}")
        # Every job completes: no more arrivals, the played jobs end, the real ones finish.
        driver.pause()
        driver.end_all()
        wanted = [n for n in driver.created if n not in driver.deleted]

        def all_done() -> bool:
            phases = watched.phases()
            return all(phases.get(n) in ("Succeeded", "Failed") for n in wanted)

        with contextlib.suppress(AssertionError):
            eventually(all_done, settings.end_timeout_s, "every job finished")
        phases = watched.phases()
        for name in wanted:
            if phases.get(name) != "Succeeded":
                violations.add("unfinished", f"{name}: {phases.get(name) or 'gone'}")
        succeeded = {n: k for n, k in driver.samples.items() if phases.get(n) == "Succeeded"}
        exact = trained_exactly_once(driver.ledgers, succeeded, violations)

        def nothing_left() -> list[str]:
            pods, _ = watched.state()
            return [p["metadata"]["name"] for p in pods if labels_of(p).get("edl.dev/job")]

        deadline = time.monotonic() + DRAIN_S + 60
        while nothing_left() and time.monotonic() < deadline:
            time.sleep(0.2)
        for name in nothing_left():
            violations.add("orphans", f"{name} left after its job ended")
        for error in driver.errors[:3]:
            violations.add("driver", error)
        metrics = ctrl.metrics()
        log_tail = [
            line for line in ctrl.log_tail(400).splitlines() if "aiohttp.access" not in line
        ][-60:]
    reconverged = [r.reconverge_s for r in restarts if r.reconverge_s is not None]
    first = [r.first_cycle_s for r in restarts if r.first_cycle_s is not None]
    serving = [r.serving_s for r in restarts if r.serving_s is not None]
    return {
        "nodes": settings.played_nodes + settings.real_nodes,
        "jobs": len(driver.created),
        "kills": settings.kills,
        "reconverge_s": _median(reconverged),
        "reconverge_p95_s": _round(nearest_rank(reconverged, 0.95)),
        "reconverge_max_s": round(max(reconverged), 3) if reconverged else None,
        "first_cycle_s": _median(first),
        "first_cycle_max_s": round(max(first), 3) if first else None,
        "serving_s": _median(serving),
        # Medians, from the operator's log: startup handler run, every object listed, the
        # Lease taken, first cycle done (from the process's start), the first cycle's own time.
        "startup_s": {
            name: _median([r.log_s[name] for r in restarts if name in r.log_s])
            for name in (*LOG_MARKS, "first_cycle_own")
        },
        "reconverge_all_s": [_round(r.reconverge_s) for r in restarts],
        # What each restart waited for last, before the cluster matched the plan.
        "last_waits": [r.waited_for for r in restarts],
        "first_cycle_all_s": [_round(r.first_cycle_s) for r in restarts],
        # The first settling, after the driver filled the cluster (from the fill's end).
        "fill_settled_s": _round(warm.reconverge_s),
        "violations": violations.total,
        "violation_counts": dict(violations.counts),
        "violation_examples": list(violations.examples),
        # Over the real jobs that Succeeded (the docstring says how they are counted).
        "real_jobs": len(succeeded),
        "samples_lost": exact.lost,
        "samples_repeated": exact.repeated,
        "unknown_intents": exact.unknown,
        "deleted_jobs": len(driver.deleted),
        # The operator's last lines (its /metrics requests left out), when something broke.
        **({"log_tail": log_tail} if violations.total else {}),
        "cycles": sample(metrics, "edl_planner_cycle_seconds_count"),
        "load": [round(x, 2) for x in (*load_before[:1], *os.getloadavg()[:1])],
        "settings": {k: v for k, v in asdict(settings).items() if not isinstance(v, tuple)},
    }


def _round(value: float | None) -> float | None:
    return None if value is None or math.isnan(value) else round(value, 3)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    defaults = Settings()
    parser.add_argument("--played-nodes", type=int, default=defaults.played_nodes)
    parser.add_argument("--real-nodes", type=int, default=defaults.real_nodes)
    parser.add_argument("--gpus", type=int, default=defaults.gpus, help="per played node")
    parser.add_argument("--real-gpus", type=int, default=defaults.real_gpus, help="per real node")
    parser.add_argument("--played-jobs", type=int, default=defaults.played_jobs)
    parser.add_argument("--real-jobs", type=int, default=defaults.real_jobs)
    parser.add_argument("--kills", type=int, default=defaults.kills)
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument("--identity", choices=("same", "fresh"), default=defaults.identity)
    parser.add_argument(
        "--workdir",
        type=Path,
        help="keep the controller's log and the pods' logs here (default: a temporary folder)",
    )
    args = parser.parse_args()
    if args.real_nodes < 1 or args.kills < 1:
        parser.error("--real-nodes and --kills must be at least 1")
    settings = Settings(
        played_nodes=args.played_nodes,
        real_nodes=args.real_nodes,
        gpus=args.gpus,
        real_gpus=args.real_gpus,
        played_jobs=args.played_jobs,
        real_jobs=args.real_jobs,
        kills=args.kills,
        seed=args.seed,
        identity=args.identity,
    )
    bin_dir = ensure_binaries()
    with contextlib.ExitStack() as stack:
        if args.workdir is not None:
            args.workdir.mkdir(parents=True, exist_ok=True)
            workdir = args.workdir
        else:
            workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="edl-bench-")))
        api = stack.enter_context(running_control_plane(bin_dir))
        kubelet = KubeletProcess(api.kubeconfig, workdir / "kubelet")
        stack.callback(kubelet.close)
        result = run(api, workdir, settings)
    print(json.dumps(result), flush=True)
    return 1 if result["violations"] else 0


if __name__ == "__main__":
    sys.exit(main())
