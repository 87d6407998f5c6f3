"""``edlctl demo``: elasticity on a 4-slot local cluster, measured end to end.

1. A private local service starts with 4 slots (in a temporary home).
2. ``research``, a low-priority elastic PyTorch job (1 to 4 workers), fills the cluster.
3. ``urgent``, a high-priority job of exactly 2 workers, arrives: the planner shrinks
   ``research`` to 2, gracefully (its survivors keep their processes: same PIDs).
4. ``urgent`` finishes; ``research`` grows back to 4 and finishes.

Everything reported is measured: utilization from the slots held over the run, each
resize's pause from rank 0's step trace (the gap between the last step of one group and the
first of the next), samples lost and repeated from the model's own per-sample counters
(see ``demo_worker``) and cross-checked with the coordinator's ledger. The last line is JSON.
"""

from __future__ import annotations

import importlib.util
import itertools
import json
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from rich.console import Console, Group
from rich.live import Live
from rich.text import Text

from edl_scheduler.cli.rendering import cluster_panel
from edl_scheduler.sdk import EdlError, JobDetails, ResizeView
from edl_scheduler.sdk.local import LocalClient, start_service, stop_service

SLOTS = 4


@dataclass(frozen=True, slots=True)
class DemoJob:
    name: str
    priority: int
    min_replicas: int
    max_replicas: int
    samples: int
    epochs: int


def scenario() -> tuple[DemoJob, DemoJob]:
    """``research``: 1,536 steps of 32 samples; ``urgent``: 32 steps."""
    return (
        DemoJob("research", 10, 1, 4, 1024, 48),
        DemoJob("urgent", 100, 2, 2, 512, 2),
    )


SLOW_PACE_S = 0.02
"""Simulated compute per sample of ``research`` until it has grown back (then none)."""


def manifest(job: DemoJob, work: Path) -> str:
    argv = [
        sys.executable,
        "-m",
        "edl_scheduler.cli.demo_worker",
        "--samples",
        str(job.samples),
        "--epochs",
        str(job.epochs),
        "--pace-file",
        str(work / "pace"),
        "--out",
        str(work / job.name),
        "--trace",
        str(work / f"{job.name}.trace"),
    ]
    document = {
        "apiVersion": "edl.dev/v1alpha1",
        "kind": "TrainingJob",
        "metadata": {
            "name": job.name,
            "annotations": {
                "edl.dev/coordinator-args": (
                    f"--samples {job.samples} --epochs {job.epochs} --shard-size 32 "
                    "--lease-timeout-s 60"
                )
            },
        },
        "spec": {
            "minReplicas": job.min_replicas,
            "maxReplicas": job.max_replicas,
            "priority": job.priority,
            "framework": "torch",
            # On an overloaded machine a first group can stall until the join bound
            # (timeouts.joinSeconds, 60 s) and its workers fail; they are replaced (and
            # the summary says how many), rather than failing the demo.
            "failurePolicy": {"maxRestarts": 8},
            "template": {
                "spec": {
                    "containers": [
                        {
                            "name": "worker",
                            "image": "local",
                            "command": argv,
                            "env": [{"name": "OMP_NUM_THREADS", "value": "1"}],
                        }
                    ]
                }
            },
        },
    }
    return yaml.safe_dump(document, sort_keys=False)


@dataclass(slots=True)
class Watch:
    """What the demo observes while it runs."""

    started: float = field(default_factory=time.time)
    samples: list[tuple[float, int]] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)
    seen_events: set[tuple[str, float, str]] = field(default_factory=set)

    def note(self, details: JobDetails) -> None:
        for e in details.events:
            key = (details.summary.name, e.time, e.reason)
            if key in self.seen_events or e.reason in ("WorkerStarted",):
                continue
            self.seen_events.add(key)
            if e.reason in ("Started", "Grew", "Shrunk", "Succeeded", "Failed", "WorkerFailed"):
                self.lines.append(
                    f"t={e.time - self.started:5.1f}s  {details.summary.name:<9}"
                    f" {e.reason:<9} {e.message}"
                )


def group_changes(trace: Path) -> list[tuple[float, float]]:
    """(time, pause) of each new worker group in rank 0's step trace: the gap between the
    last step of one group and the first step of the next is the stall the job saw."""
    if not trace.exists():
        return []
    steps = []
    for line in trace.read_text().splitlines():
        parts = line.split()
        if len(parts) == 5 and parts[0] == "step":
            steps.append((float(parts[1]), int(parts[2])))
    steps.sort()
    return [(t1, t1 - t0) for (t0, g0), (t1, g1) in itertools.pairwise(steps) if g1 != g0]


def resize_pauses(resizes: list[ResizeView], changes: list[tuple[float, float]]) -> list[float]:
    """The pause of each resize: that of the first new group formed after it was made."""
    found = []
    for r in resizes:
        after = [pause for t, pause in changes if t > r.time]
        if after:
            found.append(after[0])
    return found


def ledger(out: Path) -> tuple[int, int, set[int]]:
    """(lost, repeated, pids) from the workers that saw the job finish."""
    reports = [json.loads(p.read_text()) for p in sorted(out.glob("*.json"))]
    if not reports:
        raise EdlError(f"no worker of the job wrote its ledger to {out}")
    lost = max(r["lost"] for r in reports)
    repeated = max(r["repeated"] for r in reports)
    return lost, repeated, {int(r["pid"]) for r in reports}


def run_demo(home: Path | None, console: Console) -> int:
    missing = [m for m in ("torch", "grpc") if importlib.util.find_spec(m) is None]
    if missing:
        console.print(
            f"[red]error:[/] the demo trains PyTorch jobs and needs {', '.join(missing)}: "
            "pip install 'edl[torch]' (on a CPU machine install torch==2.13.0 first, as "
            "scripts/demo.sh does)"
        )
        return 2
    temporary = home is None
    work = Path(tempfile.mkdtemp(prefix="edl-demo-")) if home is None else home
    research, urgent = scenario()
    console.print(
        f"EDL demo: a {SLOTS}-slot local cluster; '{research.name}' (priority "
        f"{research.priority}, {research.min_replicas}-{research.max_replicas} workers) fills "
        f"it; '{urgent.name}' (priority {urgent.priority}, {urgent.min_replicas} workers) "
        "arrives.",
        highlight=False,
    )
    try:
        client = start_service(work / "service", SLOTS, period_s=0.25)
    except EdlError as error:
        console.print(f"[red]error:[/] {error}")
        return 1
    code = 1
    try:
        code = _drive(client, work, research, urgent, console)
        return code
    except EdlError as error:
        console.print(f"[red]error:[/] {error}")
        return 1
    finally:
        stop_service(work / "service")
        client.close()
        if temporary and code == 0:
            shutil.rmtree(work, ignore_errors=True)
        elif code != 0:
            console.print(f"logs and state kept in {work}", highlight=False)


def _drive(
    client: LocalClient, work: Path, research: DemoJob, urgent: DemoJob, console: Console
) -> int:
    watch = Watch()
    (work / "pace").write_text(str(SLOW_PACE_S))
    client.submit(manifest(research, work), work)
    urgent_sent = False
    first_pids: set[int] = set()
    survivor_pids: set[int] = set()
    deadline = time.monotonic() + 600
    view = Text("starting...")
    with Live(view, console=console, refresh_per_second=4, transient=True) as live:
        while time.monotonic() < deadline:
            top = client.top()
            now = time.time()
            watch.samples.append((now, top.used))
            details = {j.name: client.describe(j.name) for j in top.jobs}
            for d in details.values():
                watch.note(d)
            r = details[research.name]
            live_workers = {w.pid for w in r.workers if not w.draining and w.pid}
            if not urgent_sent:
                first_pids = live_workers
            if (
                urgent_sent
                and urgent.name in details
                and not survivor_pids
                and details[urgent.name].summary.replicas
                and r.summary.replicas == 2
            ):
                survivor_pids = live_workers
            live.update(Group(cluster_panel(top), Text("\n".join(watch.lines[-8:]))))
            progress = r.progress
            if (
                not urgent_sent
                and r.summary.replicas == research.max_replicas
                and r.summary.phase == "Running"
                and progress.get("committedStep", 0) >= 20
            ):
                client.submit(manifest(urgent, work), work)
                urgent_sent = True
            ready = int(r.manifest.get("status", {}).get("readyReplicas", 0))
            if survivor_pids and ready == research.max_replicas:
                (work / "pace").write_text("0")  # grown back and joined: let it finish
            phases = {d.summary.phase for d in details.values()}
            if urgent_sent and len(details) == 2 and phases <= {"Succeeded", "Failed"}:
                break
            if r.summary.phase == "Failed":
                break
            time.sleep(0.25)
        else:
            raise EdlError("the demo did not finish within 10 minutes")
    for line in watch.lines:
        console.print(line, highlight=False)
    return _summarize(client, work, research, urgent, watch, first_pids, survivor_pids, console)


def _summarize(
    client: LocalClient,
    work: Path,
    research: DemoJob,
    urgent: DemoJob,
    watch: Watch,
    first_pids: set[int],
    survivor_pids: set[int],
    console: Console,
) -> int:
    r = client.describe(research.name)
    u = client.describe(urgent.name)
    if r.summary.phase != "Succeeded" or u.summary.phase != "Succeeded":
        console.print(
            f"[red]a job did not succeed:[/] {research.name} {r.summary.phase}, "
            f"{urgent.name} {u.summary.phase}; see `edlctl --home {work / 'service'} describe`"
        )
        return 1
    used = [u_ for _, u_ in watch.samples]
    utilization = sum(used) / (SLOTS * len(used)) if used else 0.0
    resizes = [x for x in r.resizes if x.from_replicas > 0]
    changes = group_changes(work / f"{research.name}.trace")
    measured = resize_pauses(resizes, changes)
    lost, repeated, _ = ledger(work / research.name)
    u_lost, u_repeated, _ = ledger(work / urgent.name)
    expected = research.samples * research.epochs
    done = int(r.progress.get("samplesDone", -1))
    same_pids = bool(survivor_pids) and survivor_pids <= first_pids
    console.print()
    console.print("[bold]Summary[/]")
    console.print(f"  utilization of the {SLOTS} slots: {utilization:.0%}", highlight=False)
    for x, pause in zip(resizes, measured, strict=False):
        console.print(
            f"  resize {x.from_replicas} -> {x.to_replicas}: pause {pause:.3f} s ({x.reason})",
            highlight=False,
        )
    console.print(
        "  every new worker group of research (joins at start included), pause in s: "
        + ", ".join(f"{p:.3f}" for _, p in changes),
        highlight=False,
    )
    console.print(
        f"  workers that failed and were replaced: {r.summary.restarts + u.summary.restarts}",
        highlight=False,
    )
    console.print(
        f"  research survivors kept their processes: {same_pids} (PIDs {sorted(survivor_pids)})",
        highlight=False,
    )
    console.print(
        f"  samples lost {lost}, repeated {repeated} (model ledger of {research.name}); "
        f"{urgent.name}: lost {u_lost}, repeated {u_repeated}; coordinator ledger "
        f"{done}/{expected} samples committed",
        highlight=False,
    )
    summary = {
        "resizes": len(resizes),
        "max_pause_s": round(max(measured), 3) if measured else None,
        "samples_lost": lost + u_lost + max(0, expected - done),
        "samples_repeated": repeated + u_repeated + max(0, done - expected),
        "utilization": round(utilization, 3),
        "same_pids": same_pids,
        "worker_restarts": r.summary.restarts + u.summary.restarts,
    }
    print(json.dumps(summary), flush=True)
    return 0
