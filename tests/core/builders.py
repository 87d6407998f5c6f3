"""Fluent builders for planner tests, so that a scenario reads as a table:

job("a").min(2).max(8).priority(10).gpus(1).running(("n0", 4))
node("n0").gpus(8).labels(zone="a")
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from edl_scheduler.core import (
    Constraints,
    Job,
    Node,
    Replica,
    Reservation,
    Resources,
    Role,
    RoleSpec,
    Snapshot,
    Taint,
    TaintEffect,
    ThroughputSample,
    Toleration,
    TolerationOp,
)

GI = 2**30


@dataclass
class NodeBuilder:
    _name: str
    _gpu: int = 8
    _cpu: int = 64_000
    _mem: int = 512 * GI
    _used: Resources = field(default_factory=Resources)
    _labels: dict[str, str] = field(default_factory=dict)
    _taints: list[Taint] = field(default_factory=list)
    _schedulable: bool = True

    def gpus(self, n: int) -> NodeBuilder:
        self._gpu = n
        return self

    def cpu(self, milli: int) -> NodeBuilder:
        self._cpu = milli
        return self

    def memory(self, gib: int) -> NodeBuilder:
        self._mem = gib * GI
        return self

    def used(self, gpu: int = 0, cpu: int = 0, mem_gib: int = 0) -> NodeBuilder:
        self._used = Resources(gpu, cpu, mem_gib * GI)
        return self

    def labels(self, **labels: str) -> NodeBuilder:
        self._labels.update(labels)
        return self

    def taint(self, key: str, value: str = "", effect: str = "NoSchedule") -> NodeBuilder:
        self._taints.append(Taint(key, TaintEffect(effect), value))
        return self

    def cordoned(self) -> NodeBuilder:
        self._schedulable = False
        return self

    def build(self) -> Node:
        return Node(
            self._name,
            Resources(self._gpu, self._cpu, self._mem),
            self._used,
            tuple(sorted(self._labels.items())),
            tuple(self._taints),
            self._schedulable,
        )


@dataclass
class JobBuilder:
    _name: str
    _min: int = 1
    _max: int = 1
    _priority: int = 0
    _gpus: int = 1
    _cpu: int = 1000
    _mem: int = 4 * GI
    _submit: float = 0.0
    _preemptible: bool = True
    _requested: int | None = None
    _replicas: list[Replica] = field(default_factory=list)
    _ps: RoleSpec | None = None
    _constraints: Constraints = field(default_factory=Constraints)
    _start: float | None = None
    _last_resize: float | None = None
    _attained: float = 0.0
    _throughput: list[ThroughputSample] = field(default_factory=list)
    _suspended: bool = False
    _remaining: float | None = None

    def left(self, samples: float) -> JobBuilder:
        """What its runtime reports it has left until its declared end."""
        self._remaining = samples
        return self

    def min(self, n: int) -> JobBuilder:
        self._min = n
        self._max = max(self._max, n)
        return self

    def max(self, n: int) -> JobBuilder:
        self._max = n
        return self

    def priority(self, p: int) -> JobBuilder:
        self._priority = p
        return self

    def gpus(self, n: int) -> JobBuilder:
        self._gpus = n
        return self

    def cpu(self, milli: int) -> JobBuilder:
        self._cpu = milli
        return self

    def submitted(self, t: float) -> JobBuilder:
        self._submit = t
        return self

    def not_preemptible(self) -> JobBuilder:
        self._preemptible = False
        return self

    def requested(self, n: int) -> JobBuilder:
        self._requested = n
        return self

    def suspended(self) -> JobBuilder:
        self._suspended = True
        return self

    def attained(self, gpu_seconds: float) -> JobBuilder:
        self._attained = gpu_seconds
        return self

    def started(self, at: float, resized: float | None = None) -> JobBuilder:
        self._start = at
        self._last_resize = resized
        return self

    def running(self, *placement: tuple[str, int], draining: int = 0) -> JobBuilder:
        """Live workers per node, e.g. ``running(("n0", 4), ("n1", 2))``; the last
        ``draining`` of them are draining. Starts the job at t=0 unless started() says."""
        for node, count in placement:
            for _ in range(count):
                self._replicas.append(
                    Replica(f"{self._name}-w{len(self._replicas)}", Role.WORKER, node)
                )
        for i in range(len(self._replicas) - draining, len(self._replicas)):
            self._replicas[i] = replace(self._replicas[i], draining=True)
        if self._start is None:
            self._start = 0.0
        return self

    def pservers(self, lo: int, hi: int, cpu: int = 2000, *on: str) -> JobBuilder:
        self._ps = RoleSpec(lo, hi, Resources(0, cpu, 8 * GI))
        for node in on:
            self._replicas.append(
                Replica(f"{self._name}-ps{len(self._replicas)}", Role.PSERVER, node)
            )
        return self

    def node_selector(self, **labels: str) -> JobBuilder:
        self._constraints = replace(self._constraints, node_selector=tuple(sorted(labels.items())))
        return self

    def tolerates(self, key: str) -> JobBuilder:
        tol = Toleration(key=key, operator=TolerationOp.EXISTS)
        self._constraints = replace(
            self._constraints, tolerations=(*self._constraints.tolerations, tol)
        )
        return self

    def measured(self, nodes: int, workers: int, samples_per_second: float) -> JobBuilder:
        self._throughput.append(ThroughputSample(nodes, workers, samples_per_second))
        return self

    def build(self) -> Job:
        return Job(
            name=self._name,
            worker=RoleSpec(self._min, self._max, Resources(self._gpus, self._cpu, self._mem)),
            submit_time=self._submit,
            priority=self._priority,
            preemptible=self._preemptible,
            pserver=self._ps,
            requested=self._requested,
            constraints=self._constraints,
            replicas=tuple(self._replicas),
            suspended=self._suspended,
            start_time=self._start if self._replicas else None,
            last_resize_time=self._last_resize,
            attained_gpu_seconds=self._attained,
            throughput=tuple(self._throughput),
            remaining_samples=self._remaining,
        )


def node(name: str) -> NodeBuilder:
    return NodeBuilder(name)


def job(name: str) -> JobBuilder:
    return JobBuilder(name)


def nodes(count: int, gpus: int = 8, prefix: str = "n") -> list[NodeBuilder]:
    return [node(f"{prefix}{i}").gpus(gpus) for i in range(count)]


def snapshot(
    node_list: list[NodeBuilder],
    jobs: list[JobBuilder],
    reservations: tuple[Reservation, ...] = (),
) -> Snapshot:
    return Snapshot(
        tuple(n.build() for n in node_list), tuple(j.build() for j in jobs), reservations
    )
