"""Where new replicas go: pack a job on as few nodes as possible, next to itself, and keep
empty nodes empty.

Order of preference for each new replica of a job:
1. nodes the job already uses (fewer nodes to synchronize across);
2. if the rest fits on one node, the node with the least free GPUs that still holds it
   (best fit: partly used nodes first, no needless fragmentation);
3. otherwise the node that holds the most, and repeat.
Every replica is added through a ``Statement``, so capacity is taken only via ``Cluster``
and the caller can discard a gang that did not fit whole.
"""

from __future__ import annotations

from edl_scheduler.core.capacity import Cluster
from edl_scheduler.core.session import JobState, Session, Statement
from edl_scheduler.core.snapshot import Role


def _best_fit(cluster: Cluster, js: JobState, role: Role, need: int) -> int | None:
    """The smallest node (by free GPUs) with room for ``need`` replicas, else None."""
    res = js.resources(role)
    if res.gpu == 0:
        return _scan(cluster, js, role, need)
    for free in range(need * res.gpu, cluster.max_gpu + 1):
        for c in js.classes:
            for node in cluster.buckets[c].get(free, ()):
                if cluster.room(node, res, js.name, js.rank) >= need:
                    return node
    return None


def _largest(cluster: Cluster, js: JobState, role: Role) -> int | None:
    """A node with the most room for one more replica, else None."""
    res = js.resources(role)
    if res.gpu == 0:
        return _scan(cluster, js, role, 1)
    best, best_room = None, 0
    for free in range(cluster.max_gpu, res.gpu - 1, -1):
        if best_room * res.gpu >= free:
            break
        for c in js.classes:
            for node in cluster.buckets[c].get(free, ()):
                room = cluster.room(node, res, js.name, js.rank)
                if room > best_room:
                    best, best_room = node, room
                    break
    return best


def _scan(cluster: Cluster, js: JobState, role: Role, need: int) -> int | None:
    """First fit over every eligible node, for replicas that take no GPU."""
    res = js.resources(role)
    fallback = None
    for c in sorted(js.classes):
        for node in cluster.class_nodes[c]:
            room = cluster.room(node, res, js.name, js.rank)
            if room >= need:
                return node
            if room > 0 and fallback is None:
                fallback = node
    return fallback


def place(session: Session, stmt: Statement, js: JobState, role: Role, count: int) -> bool:
    """Add ``count`` replicas of ``role`` to ``js`` through ``stmt``; False if they do not
    all fit (the caller then discards the statement)."""
    cluster = session.cluster
    res = js.resources(role)
    remaining = count
    # Replicas per node (a dict: ``collections.Counter`` is Python code, and this runs for
    # every placement; the sort below is total, so the count's order does not matter).
    own: dict[int, int] = {}
    for node in js.nodes(Role.WORKER, cluster):
        own[node] = own.get(node, 0) + 1
    if role is not Role.WORKER:
        for node in js.nodes(role, cluster):
            own[node] = own.get(node, 0) + 1
    for node, _ in sorted(own.items(), key=lambda kv: (-kv[1], kv[0])):
        if remaining == 0:
            break
        take = min(remaining, cluster.room(node, res, js.name, js.rank))
        for _ in range(take):
            stmt.add(js, role, node)
        remaining -= take
    while remaining > 0:
        found = _best_fit(cluster, js, role, remaining)
        if found is None:
            found = _largest(cluster, js, role)
        if found is None:
            return False
        take = min(remaining, cluster.room(found, res, js.name, js.rank))
        for _ in range(take):
            stmt.add(js, role, found)
        remaining -= take
    return True


def place_gang(session: Session, stmt: Statement, js: JobState, needs: dict[Role, int]) -> bool:
    """All of ``needs`` or nothing: workers first, then parameter servers."""
    for role in (Role.WORKER, Role.PSERVER):
        if needs.get(role, 0) > 0 and not place(session, stmt, js, role, needs[role]):
            return False
    return True


def gang_fits(session: Session, js: JobState, needs: dict[Role, int]) -> bool:
    """Whether ``needs`` could be placed now; leaves the session unchanged."""
    trial = session.statement()
    ok = place_gang(session, trial, js, needs)
    trial.discard()
    return ok
