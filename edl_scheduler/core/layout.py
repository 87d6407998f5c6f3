"""What a cycle derives from the nodes alone: names, base capacity and node classes.

A cluster's nodes change far less often than its jobs; ``Layout`` is what ``Cluster`` needs
of them before any replica is counted, so that a driver planning again over the same nodes
tuple (the simulator, through ``incremental.IncrementalPlanner``) derives it once.
Everything here is read, never changed, by the cycle: ``Cluster`` copies what it changes
(free capacity per node).
"""

from __future__ import annotations

from dataclasses import dataclass

from edl_scheduler.core.matching import node_class
from edl_scheduler.core.snapshot import Node


@dataclass(frozen=True, slots=True)
class Layout:
    """``gpu``/``cpu``/``mem``: allocatable minus what other pods use, per node index;
    nodes with equal ``matching.node_class`` keys share a class (the first is its example)."""

    names: list[str]
    index: dict[str, int]
    gpu: tuple[int, ...]
    cpu: tuple[int, ...]
    mem: tuple[int, ...]
    node_class: list[int]
    class_nodes: list[list[int]]
    class_example: list[Node]
    class_capacity_gpu: tuple[int, ...]
    #: GPUs of nodes that have some (an over-committed node does not subtract).
    capacity_gpu: int
    #: No node can ever have more free GPUs than this (the bucket search range).
    max_gpu: int


def layout_of(nodes: tuple[Node, ...]) -> Layout:
    gpu = tuple(n.allocatable.gpu - n.used_by_others.gpu for n in nodes)
    classes: dict[tuple[object, ...], int] = {}
    of_node: list[int] = []
    class_nodes: list[list[int]] = []
    examples: list[Node] = []
    for i, node in enumerate(nodes):
        key = node_class(node)
        if key not in classes:
            classes[key] = len(class_nodes)
            class_nodes.append([])
            examples.append(node)
        of_node.append(classes[key])
        class_nodes[classes[key]].append(i)
    capacity = [0] * len(class_nodes)
    for i, g in enumerate(gpu):
        capacity[of_node[i]] += max(0, g)
    return Layout(
        names=[n.name for n in nodes],
        index={n.name: i for i, n in enumerate(nodes)},
        gpu=gpu,
        cpu=tuple(n.allocatable.cpu_milli - n.used_by_others.cpu_milli for n in nodes),
        mem=tuple(n.allocatable.memory_bytes - n.used_by_others.memory_bytes for n in nodes),
        node_class=of_node,
        class_nodes=class_nodes,
        class_example=examples,
        class_capacity_gpu=tuple(capacity),
        capacity_gpu=sum(max(0, g) for g in gpu),
        max_gpu=max(gpu, default=0),
    )
