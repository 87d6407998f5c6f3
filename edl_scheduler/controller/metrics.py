"""The operator's Prometheus metrics and its HTTP endpoints (``/metrics``, ``/healthz``).

What must stay true: the metric names are the ones the dashboards and docs use
(``docs/controller.md``); metrics live in a registry of their own (no module-level global
state, so several controllers can run in one test process); ``/healthz`` fails when the
planning loop has not completed a cycle for ``stale_s`` (a stuck loop gets the pod
restarted), while a standby replica (not the leader) is healthy as long as its loop runs.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from edl_scheduler.api import JobPhase


class Metrics:
    """The operator's metrics, in one registry."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.cycle_seconds = Histogram(
            "edl_planner_cycle_seconds",
            "Wall time of one planning cycle (observe, plan, decide, act)",
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
            registry=r,
        )
        self.cycle_phase_seconds = Histogram(
            "edl_planner_cycle_phase_seconds",
            "Wall time of one step of a planning cycle: lead (the Lease check), observe, "
            "plan, decide, act (the writes the cycle waits for)",
            ["phase"],
            buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
            registry=r,
        )
        self.jobs = Gauge("edl_jobs", "TrainingJobs by phase", ["phase"], registry=r)
        self.gpus_capacity = Gauge(
            "edl_gpus_capacity", "GPUs on schedulable nodes (allocatable)", registry=r
        )
        self.gpus_allocated = Gauge(
            "edl_gpus_allocated", "GPUs held by the replicas of TrainingJobs", registry=r
        )
        self.resizes = Counter(
            "edl_resizes_total", "Job resizes", ["direction", "reason"], registry=r
        )
        self.preemptions = Counter(
            "edl_preemptions_total", "Jobs shrunk or suspended to admit another", registry=r
        )
        self.job_wait = Histogram(
            "edl_job_wait_seconds",
            "Time from a job's submission to its start",
            buckets=(1, 5, 15, 60, 300, 900, 3600, 4 * 3600, 24 * 3600),
            registry=r,
        )
        self.job_completion = Histogram(
            "edl_job_completion_seconds",
            "Time from a job's submission to its end",
            buckets=(60, 300, 900, 3600, 4 * 3600, 12 * 3600, 24 * 3600, 7 * 24 * 3600),
            registry=r,
        )
        self.leader = Gauge("edl_controller_leader", "1 on the replica that acts", registry=r)
        self.quiet_cycles = Gauge(
            "edl_planner_quiet_cycles",
            "Consecutive planning cycles of the leader, up to the last, whose plan wanted no "
            "change and which made no move (no pod created or deleted, no replica marked "
            "draining, no drain, no target, no coordinator, Secret or Service): the cluster "
            "matched the plan for that long; 0 on a standby",
            registry=r,
        )
        self.cycle_failures = Counter(
            "edl_planner_cycle_failures_total",
            "Planning cycles that stopped before acting, by cause: cluster (the nodes are "
            "inconsistent: no job can be planned until the cause is fixed) or error (a bug); "
            "worth an alert whenever it grows",
            ["cause"],
            registry=r,
        )
        self.jobs_set_aside = Gauge(
            "edl_jobs_set_aside",
            "Jobs the last plan set aside: their state is one the planner cannot accept "
            "(each says why in its SetAside condition); the others were planned",
            registry=r,
        )
        self.last_cycle = time.monotonic()

    def set_jobs(self, phases: Iterable[str]) -> None:
        counts = dict.fromkeys((p.value for p in JobPhase), 0)
        for phase in phases:
            counts[phase] = counts.get(phase, 0) + 1
        for phase, n in counts.items():
            self.jobs.labels(phase=phase).set(n)

    def count(
        self,
        resizes: Mapping[tuple[str, str], int],
        preemptions: int,
        waited_s: Iterable[float],
        completed_s: Iterable[float],
    ) -> None:
        for (direction, reason), n in resizes.items():
            self.resizes.labels(direction=direction, reason=reason).inc(n)
        if preemptions:
            self.preemptions.inc(preemptions)
        for w in waited_s:
            self.job_wait.observe(w)
        for c in completed_s:
            self.job_completion.observe(c)


def web_app(metrics: Metrics, stale_s: float) -> web.Application:
    async def serve_metrics(_request: web.Request) -> web.Response:
        body = generate_latest(metrics.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def healthz(_request: web.Request) -> web.Response:
        age = time.monotonic() - metrics.last_cycle
        if age > stale_s:
            return web.Response(status=503, text=f"no planning cycle for {age:.0f} s\n")
        return web.Response(text="ok\n")

    app = web.Application()
    app.router.add_get("/metrics", serve_metrics)
    app.router.add_get("/healthz", healthz)
    return app


async def serve(metrics: Metrics, host: str, port: int, stale_s: float) -> web.AppRunner:
    runner = web.AppRunner(web_app(metrics, stale_s))
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    return runner
