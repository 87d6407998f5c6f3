"""Hypothesis strategies for the planner's property tests.

What they draw:

- clusters of 1-12 nodes with 1-8 GPUs each, some cordoned, some tainted, some labelled
  (zone, GPU type), some with capacity already used by pods that are not EDL replicas;
- 0-12 jobs: worker min/max, priority, 1-4 GPUs per worker, preemptible or not, node
  selectors, required affinity, tolerations, some with parameter servers (no GPU), some
  with throughput samples, some user-suspended; some running on nodes they may use and that
  have room for them (a few below their minimum, as after failures), some with draining
  replicas; a few reservations left by an earlier plan;
- event sequences applied between planning cycles: arrivals, completions (the job leaves),
  time advancing, worker failures (a replica vanishes) and finished drains.

Every snapshot drawn here is valid input (``validating.validate`` accepts it) and no node
is over-committed in it, so any over-commitment after a plan is the planner's doing.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from hypothesis import strategies as st

from edl_scheduler.core import (
    Constraints,
    Job,
    Node,
    NodeSelectorTerm,
    Replica,
    Requirement,
    Reservation,
    Resources,
    Role,
    RoleSpec,
    SelectorOp,
    Snapshot,
    Taint,
    TaintEffect,
    ThroughputSample,
    Toleration,
    TolerationOp,
)
from edl_scheduler.core.matching import allowed_on
from edl_scheduler.core.policy import EqualShrinking, Preemption, preset, with_overrides

GI = 2**30
#: The instant the drawn snapshots describe; jobs were submitted and started before it.
NOW = 20_000.0
#: ``edl`` shrinking equals and reclaiming their borrowed workers, which ``edl`` itself
#: does not (it suspends equals whole): the admission paths only it takes stay checked.
SHRINKING_EQUALS = with_overrides(
    preset("edl"),
    name="edl-shrinking-equals",
    shrink_equal_priority=EqualShrinking.ANY,
    reclaim_equal_priority=True,
)
#: ``edl`` as the Kubernetes manifest's policy file sets it (shrinking only, never
#: suspending) with equals shrunk only after their minimum run, and a policy without
#: priorities that never shrinks an equal but reclaims: the equal-shrinking rules' other
#: paths (the admission's pool of equals that ran their minimum, ``Policy.shrinks``).
SHRINKING_AFTER_MINIMUM = with_overrides(
    preset("edl"),
    name="edl-shrink-after-minimum",
    preemption=Preemption.SHRINK,
    shrink_equal_priority=EqualShrinking.AFTER_MINIMUM_RUN,
)
RECLAIMING_ONLY = with_overrides(
    preset("edl"),
    name="edl-reclaiming-only",
    use_priority=False,
    preemption=Preemption.SHRINK,
    shrink_equal_priority=EqualShrinking.NEVER,
    reclaim_equal_priority=True,
)

_TAINTS = (
    (),
    (),
    (),
    (Taint("dedicated", TaintEffect.NO_SCHEDULE, "train"),),
    (Taint("dedicated", TaintEffect.NO_EXECUTE, "infer"),),
    (Taint("flaky", TaintEffect.PREFER_NO_SCHEDULE),),
)
_TOLERATIONS = (
    (),
    (),
    (),
    (Toleration("dedicated", TolerationOp.EXISTS),),
    (Toleration("dedicated", TolerationOp.EQUAL, "train", TaintEffect.NO_SCHEDULE),),
    (Toleration(operator=TolerationOp.EXISTS),),
)
_SELECTORS = ((), (), (), (("zone", "a"),), (("zone", "b"),))
_TERMS = (
    (),
    (),
    (),
    (NodeSelectorTerm((Requirement("gpu-type", SelectorOp.IN, ("a100",)),)),),
    (NodeSelectorTerm((Requirement("gpu-type", SelectorOp.NOT_IN, ("v100",)),)),),
    (
        NodeSelectorTerm((Requirement("zone", SelectorOp.EXISTS),)),
        NodeSelectorTerm((Requirement("gpu-type", SelectorOp.DOES_NOT_EXIST),)),
    ),
)


@st.composite
def cluster_nodes(draw: st.DrawFn, max_nodes: int = 12) -> tuple[Node, ...]:
    count = draw(st.integers(1, max_nodes))
    out = []
    for i in range(count):
        gpu = draw(st.integers(1, 8))
        cpu = draw(st.sampled_from((8_000, 32_000, 96_000)))
        mem = draw(st.sampled_from((32, 128, 1024))) * GI
        used = Resources()
        if draw(st.integers(0, 3)) == 0:
            used = Resources(
                draw(st.integers(0, gpu)),
                draw(st.integers(0, cpu // 1000)) * 1000,
                draw(st.integers(0, mem // GI)) * GI,
            )
        labels: list[tuple[str, str]] = []
        gpu_type = draw(st.sampled_from((None, "a100", "v100")))
        if gpu_type is not None:
            labels.append(("gpu-type", gpu_type))
        zone = draw(st.sampled_from((None, "a", "b")))
        if zone is not None:
            labels.append(("zone", zone))
        out.append(
            Node(
                name=f"n{i}",
                allocatable=Resources(gpu, cpu, mem),
                used_by_others=used,
                labels=tuple(sorted(labels)),
                taints=draw(st.sampled_from(_TAINTS)),
                schedulable=draw(st.integers(0, 9)) > 0,
            )
        )
    return tuple(out)


@st.composite
def job_specs(
    draw: st.DrawFn,
    name: str,
    now: float = NOW,
    priorities: st.SearchStrategy[int] | None = None,
) -> Job:
    """A job with no replicas yet: its spec, submit time and history."""
    lo = draw(st.integers(1, 4))
    hi = draw(st.integers(lo, lo + 6))
    worker = RoleSpec(
        lo,
        hi,
        Resources(
            draw(st.integers(1, 4)),
            draw(st.sampled_from((500, 1000, 4000, 8000))),
            draw(st.sampled_from((1, 4, 16, 64))) * GI,
        ),
    )
    pserver = None
    if draw(st.integers(0, 4)) == 0:
        ps_lo = draw(st.integers(0, 2))
        pserver = RoleSpec(
            ps_lo,
            draw(st.integers(max(1, ps_lo), 3)),
            Resources(0, draw(st.sampled_from((1000, 4000))), draw(st.sampled_from((4, 16))) * GI),
        )
    samples = draw(
        st.lists(
            st.builds(
                lambda n, extra, sps: ThroughputSample(n, n + extra, sps),
                st.integers(1, 3),
                st.integers(0, 6),
                st.one_of(st.just(0.0), st.floats(0.01, 5000.0)),
            ),
            max_size=3,
        )
    )
    return Job(
        name=name,
        worker=worker,
        submit_time=now - draw(st.integers(0, 10_000)),
        priority=draw(priorities if priorities is not None else st.integers(0, 2)),
        preemptible=draw(st.integers(0, 4)) > 0,
        pserver=pserver,
        requested=draw(st.one_of(st.none(), st.integers(lo, hi))),
        constraints=Constraints(
            node_selector=draw(st.sampled_from(_SELECTORS)),
            required_terms=draw(st.sampled_from(_TERMS)),
            tolerations=draw(st.sampled_from(_TOLERATIONS)),
        ),
        attained_gpu_seconds=float(draw(st.sampled_from((0, 1000, 4000, 10_000, 100_000)))),
        throughput=tuple(samples),
    )


class _Usage:
    """What each node has left while replicas are drawn onto it (draining ones included:
    they still occupy their node)."""

    def __init__(self, nodes: tuple[Node, ...]) -> None:
        self.nodes = nodes
        self.left = {n.name: n.allocatable - n.used_by_others for n in nodes}

    def candidates(self, job: Job, res: Resources) -> list[str]:
        return [
            n.name
            for n in self.nodes
            if allowed_on(job.constraints, n) and res.fits_in(self.left[n.name])
        ]

    def take(self, node: str, res: Resources) -> None:
        self.left[node] = self.left[node] - res


def _place(
    draw: st.DrawFn, usage: _Usage, job: Job, role: Role, count: int, draining: bool
) -> list[Replica]:
    spec = job.role_spec(role)
    assert spec is not None
    out: list[Replica] = []
    for _ in range(count):
        options = usage.candidates(job, spec.resources)
        if not options:
            break
        # Pack more often than spread: prefer a node the job already uses.
        own = [r.node for r in job.replicas if r.node in options] + [r.node for r in out]
        if own and draw(st.booleans()):
            chosen = own[-1]
        else:
            chosen = options[draw(st.integers(0, len(options) - 1))]
        usage.take(chosen, spec.resources)
        tag = "w" if role is Role.WORKER else "ps"
        index = len(job.replicas) + len(out)
        out.append(Replica(f"{job.name}-{tag}{index}", role, chosen, draining))
    return out


@st.composite
def running_job(draw: st.DrawFn, job: Job, usage: _Usage, now: float, rigid: bool) -> Job:
    """``job`` placed on the cluster, at a size from 1 to its maximum (rigid policies run
    jobs at their requested size, so there the size is mostly that), maybe with draining
    replicas; or unchanged when nothing fits."""
    lo, hi = job.worker.min_replicas, job.worker.max_replicas
    if draw(st.integers(0, 4)) == 0:
        size = draw(st.integers(1, lo))  # below the minimum: workers failed
    elif rigid:
        size = job.rigid_size
    else:
        size = draw(st.integers(lo, hi))
    workers = _place(draw, usage, job, Role.WORKER, size, draining=False)
    if not workers:
        return job
    job = replace(job, replicas=tuple(workers))
    if job.pserver is not None:
        ps = draw(st.integers(0, job.pserver.max_replicas))
        job = replace(
            job, replicas=job.replicas + tuple(_place(draw, usage, job, Role.PSERVER, ps, False))
        )
    if draw(st.integers(0, 3)) == 0:
        extra = _place(draw, usage, job, Role.WORKER, draw(st.integers(1, 2)), draining=True)
        job = replace(job, replicas=job.replicas + tuple(extra))
    # (520 s: ``edl``'s minimum run before an equal may shrink or suspend the job)
    start = now - draw(st.sampled_from((0, 60, 250, 299, 300, 301, 519, 520, 521, 700, 5000)))
    start = max(start, job.submit_time)
    last = None
    if draw(st.booleans()):
        last = max(start, now - draw(st.sampled_from((0, 100, 299, 300, 301, 1000))))
    return replace(job, start_time=start, last_resize_time=last)


@st.composite
def snapshots(
    draw: st.DrawFn,
    rigid: bool = False,
    max_nodes: int = 12,
    max_jobs: int = 12,
    priorities: st.SearchStrategy[int] | None = None,
    now: float = NOW,
) -> Snapshot:
    nodes = draw(cluster_nodes(max_nodes))
    usage = _Usage(nodes)
    jobs: list[Job] = []
    for i in range(draw(st.integers(0, max_jobs))):
        job = draw(job_specs(f"j{i}", now, priorities))
        if draw(st.integers(0, 9)) == 0:
            job = replace(job, suspended=True)  # by its user: waiting, or running until now
        if draw(st.booleans()):
            job = draw(running_job(job, usage, now, rigid))
        jobs.append(job)
    reservations: list[Reservation] = []
    if jobs and draw(st.integers(0, 4)) == 0:
        for _ in range(draw(st.integers(1, 3))):
            job = jobs[draw(st.integers(0, len(jobs) - 1))]
            reservations.append(
                Reservation(
                    job.name,
                    nodes[draw(st.integers(0, len(nodes) - 1))].name,
                    Role.WORKER,
                    draw(st.integers(1, 3)),
                    now + draw(st.sampled_from((-10.0, 0.0, 100.0, 600.0))),
                )
            )
    return Snapshot(nodes, tuple(jobs), tuple(reservations))


# Events between planning cycles ---------------------------------------------------------


@dataclass(frozen=True)
class Arrival:
    job: Job  # named and stamped with the arrival time when applied


@dataclass(frozen=True)
class Completion:
    index: int  # of the job that finishes, modulo the number of jobs


@dataclass(frozen=True)
class Advance:
    seconds: float


@dataclass(frozen=True)
class Failure:
    index: int  # of the live replica that vanishes, modulo their number


@dataclass(frozen=True)
class DrainsDone:
    """Every draining replica has exited."""


Event = Arrival | Completion | Advance | Failure | DrainsDone

advances = st.sampled_from((1.0, 30.0, 200.0, 299.0, 300.0, 301.0, 700.0, 5000.0)).map(Advance)


def events(priorities: st.SearchStrategy[int] | None = None) -> st.SearchStrategy[Event]:
    return st.one_of(
        job_specs("arriving", NOW, priorities).map(Arrival),
        st.integers(0, 100).map(Completion),
        advances,
        advances,
        st.integers(0, 1000).map(Failure),
        st.just(DrainsDone()),
    )


@dataclass(frozen=True)
class Scenario:
    snapshot: Snapshot
    now: float
    events: tuple[Event, ...]


@st.composite
def scenarios(
    draw: st.DrawFn,
    rigid: bool = False,
    max_events: int = 5,
    priorities: st.SearchStrategy[int] | None = None,
) -> Scenario:
    snap = draw(snapshots(rigid=rigid, priorities=priorities))
    evs = draw(st.lists(events(priorities), max_size=max_events))
    return Scenario(snap, NOW, tuple(evs))


def apply_event(snap: Snapshot, now: float, event: Event, serial: int) -> tuple[Snapshot, float]:
    """The snapshot and instant after ``event``; ``serial`` makes arrival names unique."""
    jobs = list(snap.jobs)
    if isinstance(event, Arrival):
        jobs.append(replace(event.job, name=f"x{serial}", submit_time=now))
    elif isinstance(event, Completion):
        if jobs:
            del jobs[event.index % len(jobs)]
    elif isinstance(event, Advance):
        now += event.seconds
    elif isinstance(event, Failure):
        live = [(i, r) for i, j in enumerate(jobs) for r in j.replicas if not r.draining]
        if live:
            i, gone = live[event.index % len(live)]
            rest = tuple(r for r in jobs[i].replicas if r is not gone)
            jobs[i] = replace(jobs[i], replicas=rest)
            if not any(r.role is Role.WORKER and not r.draining for r in rest):
                jobs[i] = replace(jobs[i], start_time=None)
    else:
        jobs = [replace(j, replicas=tuple(r for r in j.replicas if not r.draining)) for j in jobs]
    return replace(snap, jobs=tuple(jobs)), now
