"""Independent checkers for the planner's invariants (DESIGN.md section 3).

Each ``check_*`` takes the snapshot a plan was made on, the plan, the snapshot it leads to
(``apply_plan``) and the policy, and returns the violations it finds as readable lines (an
empty list when the invariant holds). They recompute capacity from the snapshots
themselves, by plain sums over nodes and replicas, and search placements exhaustively
where a greedy answer could be wrong; they share nothing with the planner's session,
placement or admission code, so a bug there cannot hide itself. What they borrow is the
vocabulary: ``matching.allowed_on`` (which node a pod may use) and ``ordering.ranked``
(who ranks above whom) define the invariants rather than implement the planner.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from functools import cache

from edl_scheduler.core import (
    HOLD_REASONS,
    Action,
    Job,
    JobDecision,
    Plan,
    Policy,
    Preemption,
    Reason,
    Replica,
    Resources,
    Role,
    Snapshot,
)
from edl_scheduler.core.matching import allowed_on
from edl_scheduler.core.ordering import ranked
from edl_scheduler.core.policy import SUSPEND_PAYBACK, EqualShrinking
from edl_scheduler.core.throughput import fit, job_model

NONE = Resources()


# Plain facts about snapshots ------------------------------------------------------------


def effective_min(job: Job, policy: Policy) -> int:
    return job.worker.min_replicas if policy.elastic else job.rigid_size


def effective_max(job: Job, policy: Policy) -> int:
    return job.worker.max_replicas if policy.elastic else job.rigid_size


def live(job: Job, role: Role = Role.WORKER) -> list[Replica]:
    return [r for r in job.replicas if r.role is role and not r.draining]


def per_replica(job: Job, role: Role) -> Resources:
    spec = job.role_spec(role)
    return spec.resources if spec is not None else NONE


def free_capacity(snap: Snapshot) -> dict[str, Resources]:
    """Allocatable minus other pods minus every non-draining replica, per node (may go
    negative if something is over-committed)."""
    free = {n.name: n.allocatable - n.used_by_others for n in snap.nodes}
    for job in snap.jobs:
        for r in job.replicas:
            if not r.draining:
                free[r.node] = free[r.node] - per_replica(job, r.role)
    return free


def ranks(snap: Snapshot, policy: Policy, now: float) -> dict[str, int]:
    return {j.name: i for i, j in enumerate(ranked(snap.jobs, policy, now))}


def priority(job: Job, policy: Policy) -> int:
    return job.priority if policy.use_priority else 0


def unmet_holds(
    snap: Snapshot,
    plan_reservations: Iterable,
    now: float,
    policy: Policy,
    loaded_on: Snapshot | None = None,
) -> list[tuple]:
    """(job, node, capacity) still held by reservations over ``snap``: the part of each live
    reservation whose job does not yet have its replicas there, for jobs still below their
    minimum (a job at its minimum has nothing left to hold for).

    ``loaded_on``: the snapshot a plan read ``plan_reservations`` from, when ``snap`` is the
    one that plan led to. A reservation holds in that plan only for a job below its minimum
    on ``loaded_on`` (one at it had its room already: suspending it later in the plan, to
    admit another job, gives that room to the other job, and revives no hold), and the
    job's replicas on the node count whether the plan kept or removed them."""
    jobs = {j.name: j for j in snap.jobs}
    loaded = {j.name: j for j in loaded_on.jobs} if loaded_on is not None else jobs
    nodes = {n.name for n in snap.nodes}
    out = []
    for r in plan_reservations:
        job, first = jobs.get(r.job), loaded.get(r.job)
        if job is None or first is None or r.node not in nodes or r.expires_at <= now:
            continue
        if job.suspended or job.role_spec(r.role) is None:
            continue
        if any(len(live(j)) >= effective_min(j, policy) for j in (job, first)):
            continue
        names = {rep.name for j in (job, first) for rep in live(j, r.role) if rep.node == r.node}
        left = r.count - len(names)
        if left > 0:
            out.append((job.name, r.node, per_replica(job, r.role).times(left)))
    return out


def held_above(holds: list[tuple], rank: dict[str, int], name: str) -> dict[str, Resources]:
    """Capacity per node held for jobs ranked above ``name``."""
    out: dict[str, Resources] = {}
    for job, node, res in holds:
        if job != name and rank.get(job, 1 << 30) < rank[name]:
            out[node] = out.get(node, NONE) + res
    return out


def how_many_fit(avail: Resources, res: Resources) -> int:
    """The most replicas of size ``res`` that fit in ``avail`` (0 if any part is negative)."""
    if avail.gpu < 0 or avail.cpu_milli < 0 or avail.memory_bytes < 0:
        return 0
    best = 1 << 30
    for have, need in (
        (avail.gpu, res.gpu),
        (avail.cpu_milli, res.cpu_milli),
        (avail.memory_bytes, res.memory_bytes),
    ):
        if need:
            best = min(best, have // need)
    return best


def _added(before: Snapshot, after: Snapshot) -> list[tuple[Job, Replica]]:
    old = {(j.name, r.name) for j in before.jobs for r in j.replicas}
    return [(j, r) for j in after.jobs for r in j.replicas if (j.name, r.name) not in old]


# Invariant 1 ----------------------------------------------------------------------------


def check_no_overcommit(before: Snapshot, plan: Plan, after: Snapshot) -> list[str]:
    out = []
    free = free_capacity(after)
    nodes = {n.name: n for n in after.nodes}
    for job, replica in _added(before, after):
        node = nodes.get(replica.node)
        if node is None:
            out.append(f"{job.name}: new replica {replica.name} on unknown node {replica.node}")
            continue
        if not allowed_on(job.constraints, node):
            out.append(f"{job.name}: new replica {replica.name} on {node.name}, not allowed")
        if free[node.name].is_negative():
            out.append(f"{node.name} received {replica.name} and is over: {free[node.name]}")
    return sorted(set(out))


# Invariant 2 ----------------------------------------------------------------------------


def check_gang(before: Snapshot, plan: Plan, policy: Policy) -> list[str]:
    out = []
    jobs = {j.name: j for j in before.jobs}
    for d in plan.decisions:
        if d.action is not Action.START:
            continue
        job = jobs[d.job]
        if d.workers.target < effective_min(job, policy):
            out.append(f"{d.job} starts with {d.workers.target} < {effective_min(job, policy)}")
        if job.pserver is not None:
            got = d.pservers.target if d.pservers is not None else len(live(job, Role.PSERVER))
            if got < job.pserver.min_replicas:
                out.append(f"{d.job} starts with {got} pservers < {job.pserver.min_replicas}")
    return out


# Invariant 3 ----------------------------------------------------------------------------


def check_min_kept(before: Snapshot, plan: Plan, policy: Policy) -> list[str]:
    out = []
    jobs = {j.name: j for j in before.jobs}
    may_suspend = policy.preemption in (Preemption.SUSPEND, Preemption.SHRINK_THEN_SUSPEND)
    for d in plan.decisions:
        job = jobs[d.job]
        current = len(live(job))
        if current == 0:
            continue
        if d.action is Action.SUSPEND:
            if not may_suspend and not job.suspended:  # a user's suspension is no preemption
                out.append(f"{d.job} suspended by a policy that may not suspend")
            continue
        floor = min(current, effective_min(job, policy))
        if d.workers.target < floor:
            out.append(f"{d.job}: {current} -> {d.workers.target} workers, below {floor}")
    return out


# Invariant 4 ----------------------------------------------------------------------------


def _gang_could_start(
    need: int,
    res: Resources,
    avail: dict[str, Resources],
    victims: list[tuple[int, dict[str, int], Resources]],
) -> bool:
    """Could ``need`` replicas of ``res`` be placed on the nodes of ``avail`` after taking,
    from each victim (budget, replicas per node, size), at most ``budget`` replicas?

    A victim whose budget covers all its replicas gives them all (more room never hurts);
    the others are searched exhaustively, node by node."""
    avail = dict(avail)
    binding = []
    for budget, counts, size in victims:
        counts = {n: c for n, c in counts.items() if n in avail and c > 0}
        if sum(counts.values()) <= budget:
            for n, c in counts.items():
                avail[n] = avail[n] + size.times(c)
        elif budget > 0:
            binding.append((budget, counts, size))
    order = sorted(avail)

    @cache
    def best(i: int, budgets: tuple[int, ...]) -> int:
        if i == len(order):
            return 0
        n = order[i]
        ranges = [range(min(v[1].get(n, 0), b) + 1) for v, b in zip(binding, budgets, strict=True)]
        top = 0
        for takes in itertools.product(*ranges):
            here = avail[n]
            for (_, _, size), k in zip(binding, takes, strict=True):
                here = here + size.times(k)
            rest = tuple(b - k for b, k in zip(budgets, takes, strict=True))
            top = max(top, min(need, how_many_fit(here, res)) + best(i + 1, rest))
            if top >= need:
                return top
        return top

    return best(0, tuple(b for b, _, _ in binding)) >= need


def _suspendable(v: Job, job: Job, rank: dict[str, int], policy: Policy, now: float) -> bool:
    """Whether admission may suspend ``v`` whole for ``job``: of lower priority, or (with
    ``suspend_equal_priority``) of its own, ranked below it and past its minimum run, which
    is at least ``SUSPEND_PAYBACK`` times the suspension's cost."""
    if priority(v, policy) < priority(job, policy):
        return True
    if not policy.suspend_equal_priority or priority(v, policy) != priority(job, policy):
        return False
    start = v.start_time
    least = max(policy.min_run_s, SUSPEND_PAYBACK * policy.suspend_cost_s)
    ran = start is not None and start < now and now - start >= least
    return ran and rank[v.name] > rank[job.name]


def _shrinkable(v: Job, job: Job, policy: Policy, now: float) -> bool:
    """Whether admission may shrink ``v``, ranked below ``job``, for it: of lower priority,
    or of its own where the policy shrinks equals (``shrink_equal_priority``): any, or those
    that ran the minimum after which they could be suspended."""
    if priority(v, policy) < priority(job, policy):
        return True
    rule = policy.shrink_equal_priority
    if rule is not EqualShrinking.AFTER_MINIMUM_RUN:
        return rule is EqualShrinking.ANY
    start = v.start_time  # (a job started by this plan has ``now``: not yet run at all)
    least = max(policy.min_run_s, SUSPEND_PAYBACK * policy.suspend_cost_s)
    return start is not None and start < now and now - start >= least


def check_priority_first(
    before: Snapshot, plan: Plan, after: Snapshot, policy: Policy, now: float
) -> list[str]:
    """Every waiting job (not user-suspended, not too large for the cluster) must not fit
    on what is left after the plan, minus what reservations keep for jobs ranked above it,
    plus every worker above the minimum of a preemptible job ranked below it that it may
    shrink (``_shrinkable``) (and, where the policy suspends, every replica of a preemptible
    job it may suspend: ``_suspendable``).

    Checked for waiting jobs without parameter servers only: exact gang feasibility with two
    replica shapes is a harder search than this oracle should make."""
    out = []
    rank = ranks(before, policy, now)
    jobs_after = {j.name: j for j in after.jobs}
    free = free_capacity(after)
    nodes = {n.name: n for n in after.nodes}
    holds = unmet_holds(after, plan.reservations, now, policy)
    suspend = policy.preemption is Preemption.SHRINK_THEN_SUSPEND
    for d in plan.decisions:
        job = jobs_after[d.job]
        if d.action is not Action.WAIT or job.suspended or d.reason is Reason.TOO_LARGE:
            continue
        if job.pserver is not None:
            continue
        held = held_above(holds, rank, job.name)
        allowed = [n for n in nodes.values() if allowed_on(job.constraints, n)]
        avail = {n.name: free[n.name] - held.get(n.name, NONE) for n in allowed}
        victims = []
        for v in after.jobs:
            if v.name == job.name or not v.preemptible:
                continue
            if suspend and _suspendable(v, job, rank, policy, now):
                for role in Role:
                    counts: dict[str, int] = {}
                    for r in live(v, role):
                        counts[r.node] = counts.get(r.node, 0) + 1
                    victims.append((1 << 30, counts, per_replica(v, role)))
            elif rank[v.name] > rank[job.name] and _shrinkable(v, job, policy, now):
                spare = len(live(v)) - effective_min(v, policy)
                if spare > 0:
                    counts = {}
                    for r in live(v):
                        counts[r.node] = counts.get(r.node, 0) + 1
                    victims.append((spare, counts, per_replica(v, Role.WORKER)))
        need = effective_min(job, policy)
        if _gang_could_start(need, per_replica(job, Role.WORKER), avail, victims):
            out.append(
                f"{job.name} waits ({d.reason.value}) though its gang of {need} would start "
                f"on free capacity plus workers above the minimum of lower-ranked jobs"
            )
    return out


# Invariant 5 ----------------------------------------------------------------------------


def check_work_conserving(
    before: Snapshot, plan: Plan, after: Snapshot, policy: Policy, now: float
) -> list[str]:
    out = []
    rank = ranks(before, policy, now)
    free = free_capacity(after)
    holds = unmet_holds(after, plan.reservations, now, policy)
    for job in after.jobs:
        d = plan.decision(job.name)
        size = len(live(job))
        if d.action is Action.SUSPEND or job.suspended or size == 0:
            continue
        if size >= effective_max(job, policy) or d.reason in HOLD_REASONS:
            continue
        held = held_above(holds, rank, job.name)
        res = per_replica(job, Role.WORKER)
        for n in after.nodes:
            if not allowed_on(job.constraints, n):
                continue
            if how_many_fit(free[n.name] - held.get(n.name, NONE), res) >= 1:
                out.append(
                    f"{job.name} runs {size} < {effective_max(job, policy)} workers with room "
                    f"on {n.name}, reason {d.reason.value} is not a hold reason"
                )
                break
    return out


# Invariant 7 ----------------------------------------------------------------------------


def _check_retreat(
    job: Job, d: JobDecision, after: Job, policy: Policy, now: float, cooling: bool
) -> list[str]:
    """A job that retreated (a shrink for its own sake, named for no other job) has run its
    minimum time, is past its cool-down, and its model says the workers it keeps run faster
    than those it had by more than the pause over the horizon."""
    out = []
    if d.action is not Action.SHRINK or d.for_job is not None:
        out.append(f"{d.job} retreated by {d.action.value}, for {d.for_job}")
    if job.start_time is None or now - job.start_time < policy.min_run_s:
        out.append(f"{d.job} retreated before its minimum run (started {job.start_time})")
    if cooling:
        out.append(f"{d.job} retreated within its cool-down")
    model = job_model(job)
    was = model.throughput(_distinct_nodes(live(job)), len(live(job)))
    kept = live(after)
    gain = model.throughput(_distinct_nodes(kept), len(kept)) / was - 1.0
    if gain * policy.gain_horizon_s <= policy.resize_pause_s:
        out.append(f"{d.job} retreated for a gain of {gain:.3%}, not worth its pause")
    return out


def _distinct_nodes(replicas: Iterable[Replica]) -> int:
    return len({r.node for r in replicas})


def check_stable_step(
    before: Snapshot, plan: Plan, after: Snapshot, policy: Policy, now: float
) -> list[str]:
    """One cycle's share of invariant 7: growth respects the cool-down and pays for its
    pause; every shrink names a job it makes room for (one that starts, grows, or places
    replicas otherwise: moves where it fits, or restores its parameter servers), which ranks
    above the victim or is of equal priority (then the victim has run its minimum time and
    is past its cool-down); reservations keep their capacity from jobs ranked below their
    holder (jobs ranked above it may take it, before or after those below took the room
    left free).

    A job below its minimum (failures) may be restored to it within its cool-down, but not
    grown past it; the pause is checked for growth of jobs at or above their minimum. The
    growth that must pay is measured from the workers the plan leaves the job: one shrunk
    for another in this plan may take idle GPUs in the same resize (or keep those growth
    gave it in an earlier round, which is what made the shrink possible), and that growth
    is judged against the shrunk size, as the planner judges it, not against the size
    before the plan, which admitting the other job has already taken away."""
    out = []
    rank = ranks(before, policy, now)
    jobs = {j.name: j for j in before.jobs}
    jobs_after = {j.name: j for j in after.jobs}
    for d in plan.decisions:
        job = jobs[d.job]
        current = len(live(job))
        last = job.last_resize_time if job.last_resize_time is not None else job.start_time
        cooling = last is not None and now - last < policy.cooldown_s
        floor = max(current, effective_min(job, policy))
        # A job shrunk for another in this plan may take idle GPUs in that same resize.
        shrunk_now = bool(d.workers.remove) and d.for_job is not None
        held = cooling and not shrunk_now and not _ramps(job, current, policy, now, last)
        if d.action is Action.GROW and d.workers.target > floor and held:
            out.append(f"{d.job} grown to {d.workers.target} at t={now:g}, within its cool-down")
        if policy.ramp_s is not None and d.workers.target > floor:
            measured = [t.workers for t in job.throughput if t.samples_per_second > 0]
            asked = job.requested or 0
            limit = max(effective_min(job, policy), 1, asked, 2 * max(measured, default=0))
            if (measured or job.requested is not None) and d.workers.target > limit:
                out.append(
                    f"{d.job} grown to {d.workers.target}, past its requested size and "
                    "twice what it measured"
                )
        if d.action is Action.GROW and current >= effective_min(job, policy):
            model = fit(job.throughput)
            removed = set(d.workers.remove)
            kept = [r for r in live(job) if r.name not in removed]
            was = model.throughput(_distinct_nodes(kept), len(kept))
            new_live = live(jobs_after[d.job])
            now_thr = model.throughput(_distinct_nodes(new_live), len(new_live))
            gain = now_thr / was - 1.0 if was > 0 else float("inf")
            if gain * policy.gain_horizon_s <= policy.resize_pause_s:
                out.append(f"{d.job} grown for a gain of {gain:.3%}, not worth its pause")
        if d.reason is Reason.RETREATED:
            out.extend(_check_retreat(job, d, jobs_after[d.job], policy, now, cooling))
            continue
        if d.action in (Action.SHRINK, Action.SUSPEND) and not job.suspended:  # not by its user
            if d.for_job is None or d.for_job not in jobs:
                out.append(f"{d.job} shrunk for no named job")
                continue
            beneficiary = plan.decision(d.for_job)
            # Besides a start or growth, what takes room: a job suspended to admit another
            # admitted again where its gang fits (it moves), or one restoring its gang's
            # parameter servers (its workers kept).
            servers = beneficiary.pservers
            takes = beneficiary.workers.add_nodes or (servers is not None and servers.add_nodes)
            if beneficiary.action not in (Action.START, Action.GROW) and not takes:
                out.append(f"{d.job} shrunk for {d.for_job}, which did not start")
            other = jobs[d.for_job]
            if rank[d.for_job] < rank[d.job]:
                # Admission shrinks a job ranked below the one it starts only where it may
                # (one that lost every worker was suspended, and maybe moved: not shrunk).
                started = beneficiary.action is Action.START
                kept = len(d.workers.remove) < len(live(job))
                if kept and started and not _shrinkable(job, other, policy, now):
                    out.append(f"{d.job} shrunk to start {d.for_job}, of its own priority")
                continue
            if priority(other, policy) != priority(job, policy):
                out.append(f"{d.job} shrunk for lower-priority {d.for_job}")
                continue
            start = job.start_time
            if start is None or now - start < policy.min_run_s:
                out.append(f"{d.job} reclaimed before its minimum run (started {start})")
            if cooling:
                out.append(f"{d.job} reclaimed within its cool-down (last resize {last})")
    # Reservations from the snapshot: a job ranked below a holder never takes held room.
    holds = unmet_holds(after, before.reservations, now, policy, loaded_on=before)
    added = _added(before, after)
    free = free_capacity(after)
    for job, replica in added:
        node = replica.node
        for holder in sorted({h for h, n, _ in holds if n == node and rank[h] < rank[job.name]}):
            if _held_room_taken(holds, added, free[node], rank, holder, node):
                out.append(f"{job.name} placed {replica.name} on {node} into held capacity")
                break
    return sorted(set(out))


def _held_room_taken(
    holds: list[tuple[str, str, Resources]],
    added: list[tuple[Job, Replica]],
    free: Resources,
    rank: dict[str, int],
    holder: str,
    node: str,
) -> bool:
    """Whether the jobs ranked below ``holder`` took, on ``node``, room held for it or for a
    holder ranked above it. Held room may go to any job ranked above its holder, whenever
    in the plan it is placed, so what those jobs added there (holders' own replicas aside:
    they already count against their holds) is room the holds may have gone to: the jobs
    below took held room only if what is left free and that together fall short of what
    is still held."""
    held = held_above(holds, rank, holder).get(node, NONE)
    for h, n, res in holds:
        if h == holder and n == node:
            held = held + res
    holding = {h for h, n, _ in holds if n == node}
    took = NONE
    for job, replica in added:
        name = job.name
        if replica.node == node and rank[name] < rank[holder] and name not in holding:
            took = took + per_replica(job, replica.role)
    return (free + took - held).is_negative()


def _ramps(job: Job, current: int, policy: Policy, now: float, last: float | None) -> bool:
    """Growth on evidence (``Policy.ramp_s``), written from its rule: ``ramp_s`` after the
    last resize, a job at the largest size it measured whose last step up measured a
    speed-up worth the pause may grow within its cool-down."""
    if policy.ramp_s is None or last is None or now - last < policy.ramp_s:
        return False
    best: dict[int, float] = {}
    for t in job.throughput:
        if t.samples_per_second > 0:
            best[t.workers] = max(best.get(t.workers, 0.0), t.samples_per_second)
    if not best or max(best) != current:
        return False
    smaller = sorted(w for w in best if w < current)
    if not smaller:
        return True
    speedup = best[current] / best[smaller[-1]]
    return (speedup - 1.0) * policy.gain_horizon_s > policy.resize_pause_s


def directions(plan: Plan) -> dict[str, str]:
    """'G' for each job grown in ``plan`` and 'S' for each shrunk."""
    out = {}
    for d in plan.decisions:
        if d.workers.target > d.workers.current and d.workers.current > 0:
            out[d.job] = "G"
        elif d.workers.target < d.workers.current:
            out[d.job] = "S"
    return out


def ping_pong(history: str) -> bool:
    """Whether a job's resize history (a string of 'G' and 'S') shrinks, grows and shrinks
    again: the back-and-forth that reservations and cool-downs exist to prevent. Growing
    back once into GPUs the admitted job left idle is allowed."""
    runs = [k for k, _ in itertools.groupby(history)]
    return runs.count("S") > 1


# Plan well-formedness ---------------------------------------------------------------------


def check_well_formed(before: Snapshot, plan: Plan) -> list[str]:
    """Every job has one decision; targets add up; removals name the job's live replicas;
    new replicas go to known nodes."""
    out = []
    jobs = {j.name: j for j in before.jobs}
    nodes = {n.name for n in before.nodes}
    if sorted(d.job for d in plan.decisions) != sorted(jobs):
        out.append("decisions do not name every job exactly once")
    for d in plan.decisions:
        job = jobs.get(d.job)
        if job is None:
            continue
        for change in (d.workers, d.pservers):
            if change is None:
                continue
            names = {r.name for r in live(job, change.role)}
            if change.current != len(names):
                out.append(f"{d.job} {change.role.value}: current {change.current} != live")
            expected = change.current + len(change.add_nodes) - len(change.remove)
            if change.target != expected:
                out.append(f"{d.job} {change.role.value}: target does not add up")
            if not set(change.remove) <= names or len(set(change.remove)) != len(change.remove):
                out.append(f"{d.job} {change.role.value}: removes {change.remove}, not live")
            if not set(change.add_nodes) <= nodes:
                out.append(f"{d.job} {change.role.value}: adds on unknown nodes")
    return out
