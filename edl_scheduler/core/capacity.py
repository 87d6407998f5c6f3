"""A planning cycle's free capacity per node, and the room held on nodes for jobs.

``Cluster`` is the only code that takes or gives node capacity, so invariant 1's capacity
half lives here: ``room`` is the one answer to "how many more replicas of this size fit on
this node for this job", counting what other pods use, every live replica, and capacity
held (reserved) for jobs ranked above the asker. Draining replicas are treated as gone: the
capacity they free is held for the job it was freed for, and drivers create a replica only
once its node has the room in fact. Nothing here reads a clock or does I/O.
"""

from __future__ import annotations

from bisect import bisect_left, insort

from edl_scheduler.core.layout import Layout, layout_of
from edl_scheduler.core.resources import Resources
from edl_scheduler.core.snapshot import Node, Role


class Hold:
    """Room for ``count`` more replicas of ``job``'s ``role`` kept on one node. (A plain
    class: compiled, its ``__init__`` is C, where a dataclass's is Python code.)"""

    __slots__ = ("count", "expires_at", "job", "per_replica", "rank", "role")

    def __init__(
        self,
        job: str,
        rank: int,
        role: Role,
        count: int,
        per_replica: Resources,
        expires_at: float,
    ) -> None:
        self.job = job
        self.rank = rank
        self.role = role
        self.count = count
        self.per_replica = per_replica
        self.expires_at = expires_at


class Cluster:
    """Free capacity per node (indexed 0..n-1), bucketed by free GPUs for best-fit search."""

    def __init__(
        self,
        nodes: tuple[Node, ...],
        used: list[list[int]] | None = None,
        layout: Layout | None = None,
    ) -> None:
        """``used[i]`` is [gpu, cpu, memory] that EDL replicas already take on node i;
        ``layout``: ``layout_of(nodes)``, when the caller has it already."""
        if layout is None:
            layout = layout_of(nodes)
        self.names = layout.names
        self.index = layout.index
        self.gpu = list(layout.gpu)
        self.cpu = list(layout.cpu)
        self.mem = list(layout.mem)
        self.capacity_gpu = layout.capacity_gpu
        for i, (g, c, m) in enumerate(used or ()):
            self.gpu[i] -= g
            self.cpu[i] -= c
            self.mem[i] -= m
        self.node_class = layout.node_class
        self.class_nodes = layout.class_nodes
        self.class_example = layout.class_example
        # Free GPUs -> nodes of that class in index order, which is the order best-fit
        # placement walks them. The order depends on nothing but the free counts, so a
        # statement that is discarded (a failed admission, ``gang_fits``) leaves no trace on
        # where later replicas go: a node given capacity and taken it back stands where it
        # stood.
        self.buckets: list[dict[int, list[int]]] = [{} for _ in self.class_nodes]
        self.class_free_gpu = [0] * len(self.class_nodes)
        self.class_capacity_gpu = list(layout.class_capacity_gpu)
        of_node, free, buckets = self.node_class, self.class_free_gpu, self.buckets
        for i, g in enumerate(self.gpu):  # (ascending ``i``: each list is built sorted)
            c = of_node[i]
            found = buckets[c].get(g)
            if found is None:
                buckets[c][g] = [i]
            else:
                found.append(i)
            if g > 0:
                free[c] += g
        #: Free GPUs, counting only nodes that have some (an over-committed node, which
        #: input may show, does not hide another node's free GPUs).
        self.free_gpu = sum(free)
        self.max_gpu = layout.max_gpu
        self.holds: dict[int, list[Hold]] = {}

    def _move(self, node: int, new_gpu: int) -> None:
        c = self.node_class[node]
        old = self.gpu[node]
        if old != new_gpu:
            bucket = self.buckets[c]
            was = bucket[old]
            del was[bisect_left(was, node)]
            now = bucket.get(new_gpu)
            if now is None:
                bucket[new_gpu] = [node]
            else:
                insort(now, node)
            self.gpu[node] = new_gpu
            delta = max(0, new_gpu) - max(0, old)
            self.class_free_gpu[c] += delta
            self.free_gpu += delta

    def free_in(self, classes: frozenset[int]) -> int:
        """Free GPUs on the nodes of ``classes`` (most clusters have one class)."""
        if len(classes) == 1:
            for c in classes:
                return self.class_free_gpu[c]
        return sum(self.class_free_gpu[c] for c in classes)

    def capacity_in(self, classes: frozenset[int]) -> int:
        """GPUs the nodes of ``classes`` have in all."""
        if len(classes) == 1:
            for c in classes:
                return self.class_capacity_gpu[c]
        return sum(self.class_capacity_gpu[c] for c in classes)

    def take(self, node: int, res: Resources, count: int = 1) -> None:
        self._move(node, self.gpu[node] - res.gpu * count)
        self.cpu[node] -= res.cpu_milli * count
        self.mem[node] -= res.memory_bytes * count

    def give(self, node: int, res: Resources, count: int = 1) -> None:
        self.take(node, res, -count)

    def held_for_others(self, node: int, job: str, rank: int) -> Resources:
        """Capacity on ``node`` held for jobs ranked above ``rank`` other than ``job``."""
        gpu = cpu = mem = 0
        for h in self.holds.get(node, ()):
            if h.job != job and h.rank < rank and h.count > 0:
                gpu += h.per_replica.gpu * h.count
                cpu += h.per_replica.cpu_milli * h.count
                mem += h.per_replica.memory_bytes * h.count
        return Resources(gpu, cpu, mem)

    def room(self, node: int, res: Resources, job: str, rank: int) -> int:
        """How many more replicas of size ``res`` fit on ``node`` for ``job``."""
        return self.room_freed(node, res, job, rank, 0, 0, 0)

    def room_freed(
        self, node: int, res: Resources, job: str, rank: int, gpu: int, cpu: int, mem: int
    ) -> int:
        """``room`` as it would be were ``gpu``, ``cpu`` and ``mem`` more free on ``node``,
        without giving and taking them back (admission asks it of every node a victim
        stands on)."""
        gpu, cpu, mem = self.gpu[node] + gpu, self.cpu[node] + cpu, self.mem[node] + mem
        if node in self.holds:
            held = self.held_for_others(node, job, rank)
            gpu, cpu, mem = gpu - held.gpu, cpu - held.cpu_milli, mem - held.memory_bytes
        if gpu < 0 or cpu < 0 or mem < 0:
            return 0
        best = 1 << 30
        if res.gpu:
            best = min(best, gpu // res.gpu)
        if res.cpu_milli:
            best = min(best, cpu // res.cpu_milli)
        if res.memory_bytes:
            best = min(best, mem // res.memory_bytes)
        return best
