"""The README's first command until the local backend lands: a planner walk-through.

It builds a small cluster, submits a few jobs over time (two elastic research jobs, then a
high-priority one), runs the same ``plan()`` that every driver calls, applies each plan
and prints what changed and why. Nothing is random: the output is the same every run.
"""

from __future__ import annotations

import argparse

from edl_scheduler.core import (
    PRESETS,
    Job,
    Node,
    Plan,
    Resources,
    RoleSpec,
    Snapshot,
    apply_plan,
    plan,
    preset,
)

GI = 2**30


def _job(name: str, lo: int, hi: int, priority: int, at: float) -> Job:
    return Job(name, RoleSpec(lo, hi, Resources(1, 4000, 16 * GI)), at, priority=priority)


#: (time, job) arrivals of the walk-through.
ARRIVALS: tuple[tuple[float, Job], ...] = (
    (0.0, _job("research/resnet", 2, 8, 100, 0.0)),
    (60.0, _job("research/bert", 2, 8, 100, 60.0)),
    (600.0, _job("prod/ranking", 6, 6, 1000, 600.0)),
    (660.0, _job("research/huge", 32, 32, 100, 660.0)),
)


def _print_plan(p: Plan, snap: Snapshot) -> None:
    print(
        f"t={p.now:>5.0f}s  cluster: {len(snap.nodes)} nodes,"
        f" {sum(n.allocatable.gpu for n in snap.nodes)} GPUs"
    )
    for d in sorted(p.decisions, key=lambda d: d.job):
        mark = "*" if d.changed else " "
        size = f"{d.workers.current:>2} -> {d.workers.target:<2}"
        print(f"  {mark} {d.job:<16} {d.action.value:<7} {size} {d.message}")
    print()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--policy", default="edl", choices=sorted(PRESETS))
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--gpus-per-node", type=int, default=4)
    args = parser.parse_args(argv)
    policy = preset(args.policy)
    nodes = tuple(
        Node(f"node-{i}", Resources(args.gpus_per_node, 32_000, 256 * GI))
        for i in range(args.nodes)
    )
    snap = Snapshot(nodes, ())
    print(f"EDL planner walk-through, policy {policy.name!r} (* = changed this cycle)\n")
    for now in sorted({t for t, _ in ARRIVALS} | {1200.0}):
        arrived = tuple(j for t, j in ARRIVALS if t == now)
        snap = Snapshot(snap.nodes, snap.jobs + arrived, snap.reservations)
        p = plan(snap, policy, now)
        _print_plan(p, snap)
        snap = apply_plan(snap, p)


if __name__ == "__main__":
    main()
