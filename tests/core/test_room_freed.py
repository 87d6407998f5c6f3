"""``Cluster.room_freed`` answers as giving capacity to a node, asking ``room`` and taking it
back did (admission's reach per node, ``Admitter._shrink_units``), and leaves the cluster as
that did: the same free counts and the same nodes, in the same order, in every bucket of
free GPUs (the order best-fit placement walks them)."""

from __future__ import annotations

import random

from edl_scheduler.core.capacity import Cluster, Hold
from edl_scheduler.core.resources import Resources
from edl_scheduler.core.snapshot import Node, Role

_GIB = 2**30


def _cluster(seed: int) -> Cluster:
    """Nodes of two sizes, some over-committed by others' pods, some holding room."""
    rng = random.Random(seed)
    nodes = []
    for i in range(rng.randint(1, 12)):
        gpus = rng.choice([4, 8])
        nodes.append(
            Node(
                f"n{i}",
                Resources(gpus, 32_000, 256 * _GIB),
                used_by_others=Resources(rng.randint(0, gpus + 1), rng.randint(0, 8_000), 0),
            )
        )
    used = [[rng.randint(0, 8), rng.randint(0, 16_000), rng.randint(0, 128) * _GIB] for _ in nodes]
    cluster = Cluster(tuple(nodes), used)
    for node in range(len(nodes)):
        if rng.random() < 0.3:
            per = Resources(rng.randint(1, 2), 1_000, 8 * _GIB)
            rank = rng.randint(0, 6)
            hold = Hold(f"held{rank}", rank, Role.WORKER, rng.randint(0, 3), per, 1e9)
            cluster.holds.setdefault(node, []).append(hold)
    return cluster


def _state(cluster: Cluster) -> tuple[object, ...]:
    buckets = [[(g, list(b)) for g, b in sorted(c.items()) if b] for c in cluster.buckets]
    return (
        buckets,
        cluster.gpu,
        cluster.cpu,
        cluster.mem,
        cluster.class_free_gpu,
        cluster.free_gpu,
    )


def test_room_freed_equals_give_room_take() -> None:
    asked = 0
    for seed in range(150):
        rng = random.Random(1_000 + seed)
        plain, fast = _cluster(seed), _cluster(seed)
        for _ in range(20):
            node = rng.randrange(len(plain.gpu))
            res = Resources(
                rng.randint(0, 2), rng.choice([0, 500, 4_000]), rng.randint(0, 9) * _GIB
            )
            freed = Resources(rng.randint(0, 6), rng.randint(0, 12_000), rng.randint(0, 64) * _GIB)
            job, rank = f"j{rng.randint(0, 6)}", rng.randint(0, 8)
            plain.give(node, freed)
            want = plain.room(node, res, job, rank)
            plain.take(node, freed)
            got = fast.room_freed(
                node, res, job, rank, freed.gpu, freed.cpu_milli, freed.memory_bytes
            )
            assert got == want, (seed, node, res, freed)
            assert _state(fast) == _state(plain), (seed, node, freed)
            asked += 1
    assert asked == 3_000
