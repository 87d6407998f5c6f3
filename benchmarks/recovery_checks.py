"""What the recovery benchmark (``controller_recovery.py``) checks, as pure functions of the
objects its watches hold: the invariants on every pod change (``CheckedPods``: no node
over-committed, no job with more live workers than its maximum) and whether the cluster
matches what the operator plans for it (``unsettled``, condition (b) of the benchmark's
definition of re-convergence), and that every real job trained each of its samples
exactly once (``trained_exactly_once``, from its workers' ledger files). No API call here:
the caller's watches feed them.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from tests.kube.nodes import GPU
from tests.runtime.ledger_files import Exactness, counting_trained, exactness


def _time(raw: object) -> float | None:
    if not raw:
        return None
    return datetime.fromisoformat(str(raw).replace("Z", "+00:00")).timestamp()


def labels_of(obj: dict[str, Any]) -> dict[str, str]:
    return obj["metadata"].get("labels") or {}


def _deleting(obj: dict[str, Any]) -> bool:
    return bool(obj["metadata"].get("deletionTimestamp"))


def phase_of(obj: dict[str, Any]) -> str:
    return str((obj.get("status") or {}).get("phase") or "")


def _gpus(pod: dict[str, Any]) -> int:
    total = 0
    for container in pod.get("spec", {}).get("containers", []):
        resources = container.get("resources") or {}
        wanted = (resources.get("requests") or {}).get(GPU) or (resources.get("limits") or {}).get(
            GPU
        )
        total += int(wanted or 0)
    return total


def _draining_since(pod: dict[str, Any]) -> float | None:
    annotations = pod["metadata"].get("annotations") or {}
    if annotations.get("edl.dev/draining") != "true":
        return None
    try:
        return float(annotations.get("edl.dev/drain-since", "0"))
    except ValueError:
        return 0.0


@dataclass(slots=True)
class Violations:
    """What broke an invariant, counted by kind, with the first few examples."""

    counts: dict[str, int] = field(default_factory=dict)
    examples: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, kind: str, what: str) -> None:
        with self.lock:
            self.counts[kind] = self.counts.get(kind, 0) + 1
            if len(self.examples) < 10:
                self.examples.append(f"{kind}: {what}")

    @property
    def total(self) -> int:
        return sum(self.counts.values())


def trained_exactly_once(
    ledgers: Path, samples: dict[str, int], violations: Violations
) -> Exactness:
    """Lost and repeated samples over the real jobs ``samples`` names (job -> samples, one
    epoch), from their workers' ledger files in ``ledgers / <job>``; a job with any is a
    violation ``exactly_once``."""
    lost = repeated = unknown = 0
    for name, count in sorted(samples.items()):
        trained, guessed = counting_trained(ledgers / name, epochs=1)
        exact = exactness(trained, count, guessed)
        lost, repeated, unknown = lost + exact.lost, repeated + exact.repeated, unknown + guessed
        if exact.lost or exact.repeated:
            violations.add("exactly_once", f"{name}: {exact.lost} lost, {exact.repeated} repeated")
    return Exactness(lost, repeated, unknown)


class CheckedPods(dict[str, dict[str, Any]]):
    """The store of a list-then-watch of the namespace's pods (``keep_listed``) that checks
    the invariants on every change: no node over-committed, no job with more live workers
    than its ``maxReplicas``. ``capacity``: node -> GPUs; ``max_replicas``: job -> its
    maximum (jobs not in it are not checked)."""

    def __init__(
        self, capacity: dict[str, int], max_replicas: dict[str, int], violations: Violations
    ) -> None:
        super().__init__()
        self.capacity = capacity
        self.max_replicas = max_replicas
        self.violations = violations

    def _check(self, pod: dict[str, Any]) -> None:
        node = pod.get("spec", {}).get("nodeName")
        if node in self.capacity:
            used = sum(
                _gpus(p)
                for p in self.values()
                if p.get("spec", {}).get("nodeName") == node
                and phase_of(p) not in ("Succeeded", "Failed")
            )
            have = self.capacity[node]
            if used > have:
                self.violations.add("overcommitted", f"{node}: {used} GPUs of {have}")
        job = labels_of(pod).get("edl.dev/job", "")
        if job in self.max_replicas:
            live = [
                p["metadata"]["name"]
                for p in self.values()
                if labels_of(p).get("edl.dev/job") == job
                and labels_of(p).get("edl.dev/role") == "worker"
                and not _deleting(p)
                and _draining_since(p) is None
                and phase_of(p) not in ("Succeeded", "Failed")
            ]
            if len(live) > self.max_replicas[job]:
                self.violations.add(
                    "duplicates", f"{job}: {len(live)} live workers > {self.max_replicas[job]}"
                )

    def __setitem__(self, uid: str, pod: dict[str, Any]) -> None:
        super().__setitem__(uid, pod)
        self._check(pod)

    def update(self, items: Any = (), **_: Any) -> None:  # type: ignore[override]
        for uid, pod in items:
            self[uid] = pod


def unsettled(pods: list[dict[str, Any]], jobs: list[dict[str, Any]], now: float) -> str | None:
    """Why the cluster does not match what the operator plans for it (condition (b) of the
    module's definition), or None when it does."""
    by_job: dict[str, list[dict[str, Any]]] = {}
    for pod in pods:
        job = labels_of(pod).get("edl.dev/job")
        if job:
            by_job.setdefault(job, []).append(pod)
    names = {j["metadata"]["name"] for j in jobs}
    for job, theirs in by_job.items():
        left = [p["metadata"]["name"] for p in theirs if not _deleting(p)]
        if job not in names and left:
            return f"{left[0]}: a pod of a deleted job"
    for body in jobs:
        meta, status = body["metadata"], body.get("status") or {}
        name = meta["name"]
        if _deleting(body):
            continue
        phase = status.get("phase")
        if not phase:
            return f"{name}: no status yet"
        if status.get("observedGeneration") != meta.get("generation"):
            return f"{name}: generation {meta.get('generation')} not observed"
        drain_s = float(((body.get("spec") or {}).get("timeouts") or {}).get("drainSeconds", 30))
        theirs = [p for p in by_job.get(name, []) if not _deleting(p)]
        if phase in ("Succeeded", "Failed"):
            ended = _time(status.get("completionTime")) or 0.0
            for pod in theirs:
                if phase_of(pod) != "Running" or now >= ended + drain_s:
                    name = pod["metadata"]["name"]
                    return f"{name} ({phase_of(pod)}): left after its job {phase}"
            continue
        allocation: dict[str, str] = status.get("allocation") or {}
        live: dict[str, dict[str, Any]] = {}
        coordinator = None
        for pod in theirs:
            pod_name = pod["metadata"]["name"]
            if labels_of(pod).get("edl.dev/role") == "coordinator":
                coordinator = pod
                continue
            if phase_of(pod) in ("Succeeded", "Failed"):
                return f"{pod_name}: exited ({phase_of(pod)}) and not removed"
            since = _draining_since(pod)
            if since is not None:
                if now >= since + drain_s:
                    return f"{pod_name}: a victim past its drain deadline"
                continue
            live[pod_name] = pod
        if set(live) != set(allocation):
            return f"{name}: live workers {sorted(live)}, status allocation {sorted(allocation)}"
        for pod_name, pod in live.items():
            if pod.get("spec", {}).get("nodeName") != allocation[pod_name]:
                return f"{pod_name}: on another node than its status says"
            if phase_of(pod) != "Running":
                return f"{pod_name}: {phase_of(pod) or 'Pending'}"
        workers = sum(1 for p in live.values() if labels_of(p).get("edl.dev/role") == "worker")
        if int(status.get("replicas") or 0) != workers:
            return f"{name}: status.replicas {status.get('replicas')}, {workers} live workers"
        if live and (coordinator is None or phase_of(coordinator) != "Running"):
            return f"{name}: workers without a Running coordinator"
    return None
