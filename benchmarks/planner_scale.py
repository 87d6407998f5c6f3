"""Planner cycle time at cluster scale: one JSON line per size.

    python benchmarks/planner_scale.py [--cycles 20] [--sizes 100x50,1000x500,10000x5000]

Each size starts from a busy cluster (8 GPUs per node; about 90% of jobs running, about
10% waiting; four priority levels; a third of the jobs with measured throughput). Every
timed cycle builds a fresh snapshot from the previous one (the last plan applied, then a
batch of completions, arrivals and throughput updates) and plans on it; ``cycle_s`` is the
mean over the cycles of both steps together (wall clock), and ``cycle_cpu_s`` the same in
CPU time of this process, which other load on the machine does not inflate.

Each size prints two lines, one per ``collector``: ``on`` is the cycle the controller and
the local backend get (``plan()`` leaves Python's cyclic garbage collector alone), and
``paused`` the cycle a driver gets that pauses the collector around ``plan()`` as the
simulator does (``simulations.collector.paused``): at 10,000 jobs the collector's full
scans of the snapshot are a large part of a cycle. ``--collector`` picks one.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from dataclasses import replace
from functools import partial

# The simulator first: importing it takes the compiled build of the planner where one exists
# (``edl-sim compile``), before any planner module loads; ``build`` says what ran.
from simulations import native  # isort: skip
from simulations.collector import paused  # isort: skip

from edl_scheduler.core import (
    Job,
    Node,
    Replica,
    Resources,
    Role,
    RoleSpec,
    Snapshot,
    ThroughputSample,
    apply_plan,
    plan,
    preset,
)

GPUS_PER_NODE = 8
GI = 2**30


def _new_job(rng: random.Random, i: int, now: float) -> Job:
    lo = rng.choice((1, 1, 2, 2, 4))
    hi = lo * rng.choice((1, 2, 2, 4))
    gpus = rng.choice((1, 1, 1, 2))
    samples: tuple[ThroughputSample, ...] = ()
    if rng.random() < 0.33:
        base = rng.uniform(50, 500)
        samples = tuple(
            ThroughputSample(1, w, base * w ** rng.uniform(0.7, 0.95)) for w in (1, 2, 4)
        )
    return Job(
        name=f"ns/job-{i}",
        worker=RoleSpec(lo, hi, Resources(gpus, 4000 * gpus, 16 * GI * gpus)),
        submit_time=now - rng.uniform(0, 86_400),
        priority=rng.choice((0, 100, 1000, 10_000)),
        preemptible=rng.random() < 0.9,
        throughput=samples,
    )


def _initial(jobs: int, node_count: int, rng: random.Random) -> Snapshot:
    nodes = tuple(
        Node(f"node-{i}", Resources(GPUS_PER_NODE, 96_000, 768 * GI)) for i in range(node_count)
    )
    free = [GPUS_PER_NODE] * node_count
    cursor = 0
    out = []
    for i in range(jobs):
        job = _new_job(rng, i, 0.0)
        if rng.random() < 0.9:  # place it running, between min and max, packed
            want = rng.randint(job.worker.min_replicas, job.worker.max_replicas)
            g = job.worker.resources.gpu
            replicas: list[Replica] = []
            while len(replicas) < want and cursor < node_count:
                if free[cursor] >= g:
                    free[cursor] -= g
                    name = f"{job.name}-w{len(replicas)}"
                    replicas.append(Replica(name, Role.WORKER, nodes[cursor].name))
                else:
                    cursor += 1
            if len(replicas) >= job.worker.min_replicas:
                job = replace(job, replicas=tuple(replicas), start_time=-3600.0)
            else:
                for r in replicas:
                    free[int(r.node.split("-")[1])] += g
        out.append(job)
    return Snapshot(nodes, tuple(out))


def _events(snap: Snapshot, rng: random.Random, next_id: int, now: float) -> tuple[Snapshot, int]:
    """About 1% of jobs complete, as many arrive, and 2% report new throughput."""
    batch = max(1, len(snap.jobs) // 100)
    jobs = list(snap.jobs)
    for _ in range(batch):
        jobs.pop(rng.randrange(len(jobs)))
    for k in rng.sample(range(len(jobs)), 2 * batch):
        j = jobs[k]
        size = max(1, len(j.replicas))
        jobs[k] = replace(j, throughput=(ThroughputSample(1, size, rng.uniform(50, 500)),))
    for _ in range(batch):
        jobs.append(_new_job(rng, next_id, now))
        next_id += 1
    return replace(snap, jobs=tuple(jobs)), next_id


def measure(
    jobs: int, node_count: int, cycles: int, seed: int = 0, collector: str = "on"
) -> dict[str, object]:
    rng = random.Random(seed)
    policy = preset("edl")
    snap = _initial(jobs, node_count, rng)
    now, next_id = 0.0, jobs
    last = plan(snap, policy, now)  # warm-up cycle, not timed
    total = cpu = 0.0
    for _ in range(cycles):
        now += 60.0
        t0, c0 = time.perf_counter(), time.process_time()
        snap, next_id = _events(apply_plan(snap, last), rng, next_id, now)
        if collector == "paused":
            last = paused(partial(plan, snap, policy, now))
        else:
            last = plan(snap, policy, now)
        total += time.perf_counter() - t0
        cpu += time.process_time() - c0
    return {
        "jobs": jobs,
        "nodes": node_count,
        "gpus": node_count * GPUS_PER_NODE,
        "policy": policy.name,
        "build": native.mode().value,
        "collector": collector,
        "cycle_s": round(total / cycles, 5),
        "cycle_cpu_s": round(cpu / cycles, 5),
        "cycles": cycles,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cycles", type=int, default=20)
    parser.add_argument("--sizes", default="100x50,1000x500,10000x5000")
    parser.add_argument("--collector", choices=("on", "paused", "both"), default="both")
    args = parser.parse_args()
    modes = ("on", "paused") if args.collector == "both" else (args.collector,)
    for size in args.sizes.split(","):
        jobs, node_count = (int(x) for x in size.split("x"))
        for mode in modes:
            line = measure(jobs, node_count, args.cycles, collector=mode)
            print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
