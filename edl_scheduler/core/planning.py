"""``plan(snapshot, policy, now) -> Plan``: the one planner that every driver calls.

The cycle, in order:

1. Validate the snapshot (``validating``): inconsistent nodes raise a typed error naming
   the node, and nothing is planned; a job whose state the planner cannot accept is set
   aside (its replicas stay and take their capacity; its decision names the problem and
   the fix) and the others are planned as if it were not there.
2. Open a session: capacity left on every node after other pods and every live replica;
   reservations from the last plan that still hold; jobs ranked by the policy. What a
   job's spec asks now is obeyed first (``complying``): a running job whose spec says
   ``suspend`` gives up every replica, one above its maximum the surplus.
3. Admit (``admitting``): in rank order, every waiting job starts as a whole gang, taking
   workers (or whole jobs) from lower-ranked ones where the policy allows; or it says why
   it waits.
4. Grow (``growing``): idle GPUs go to running jobs below their maximum, unless a
   stability rule holds a job back. Growth can give a worker to a job ranked below one
   that waits; since a job's workers are interchangeable, another of its workers may then
   be the one that lets the waiting gang start. So 3 and 4 repeat (a bounded number of
   times) while they still start jobs.
5. Write the plan: per job and role the target, the node of each new replica, the named
   replicas to remove, the reason; and the reservations that keep freed GPUs for the job
   they were freed for.
6. Guard: no node that receives a replica may end over-committed (a bug if it happens).

Pure: no clock (``now`` is an argument), no randomness, no I/O.
"""

from __future__ import annotations

import gc
from collections.abc import Sequence
from typing import Final

from edl_scheduler.core.admitting import Admitter, rounds_start_nothing
from edl_scheduler.core.complying import comply
from edl_scheduler.core.errors import PlanningError
from edl_scheduler.core.growing import WAITING, Grower, cooling_message
from edl_scheduler.core.memo import PlanMemo
from edl_scheduler.core.plan import (
    HOLD_REASONS,
    Action,
    JobDecision,
    Plan,
    Reason,
    RoleChange,
    counted,
)
from edl_scheduler.core.policy import Growth, Policy
from edl_scheduler.core.resources import Resources
from edl_scheduler.core.session import JobState, Session
from edl_scheduler.core.snapshot import Job, Reservation, Role, Snapshot
from edl_scheduler.core.throughput import job_model
from edl_scheduler.core.validating import JobError, set_aside, validate

#: Admission-growth rounds after the first; each must start a job to go on.
_EXTRA_ROUNDS: Final = 3
#: (An enum class attribute read costs about 0.17 us; ``_untouched`` runs once per job.)
_W: Final = Role.WORKER
_P: Final = Role.PSERVER


def _role_change(
    js: JobState, role: Role, session: Session, steady: dict[tuple[Role, int], RoleChange]
) -> RoleChange:
    """``steady`` shares one RoleChange per unchanged (role, size) within the cycle: it is
    frozen, and most jobs of a cycle keep their size."""
    names = session.cluster.names
    if not js.added[role] and not js.removed[role]:
        size = js.size(role)
        found = steady.get((role, size))
        if found is None:
            found = steady[(role, size)] = RoleChange(role, size, size)
        return found
    return RoleChange(
        role=role,
        current=len(js.live[role]),
        target=js.size(role),
        add_nodes=tuple(names[n] for n in js.added[role]),
        remove=tuple(r.name for r in js.removed[role]),
    )


def _action(js: JobState) -> Action:
    before, after = len(js.live[Role.WORKER]), js.size()
    if js.suspended:
        return Action.SUSPEND
    if after > 0 and before == 0:
        return Action.START
    if after > before:
        return Action.GROW
    if after < before:
        return Action.SHRINK
    return Action.KEEP if after > 0 else Action.WAIT


def _explain(js: JobState, action: Action, session: Session) -> tuple[Reason, str]:
    """The reason and one-line message of a job nobody has explained yet."""
    before, after = len(js.live[Role.WORKER]), js.size()
    if not js.message and js.reason is Reason.COOLING_DOWN and js.cooling_end is not None:
        js.message = cooling_message(js.cooling_end, session.now)  # (left unwritten)
    if js.started and js.reason in HOLD_REASONS | {Reason.MOVED_TO_ADMIT}:
        return js.reason, js.message  # started (or restored), then held below its maximum
    if js.started:
        grown = f", then grown to {after} into idle GPUs" if after > js.lo else ""
        reason = Reason.STARTED if action is Action.START else Reason.GREW
        return reason, js.message + grown
    if action is Action.GROW and js.reason is None:
        model = job_model(js.job)
        nodes_before = len({r.node for r in js.live[Role.WORKER]})
        return Reason.GREW, (
            f"grew {before}->{after} into idle GPUs "
            f"(predicted speed-up {model.speedup(nodes_before, before):.2f}x -> "
            f"{model.speedup(js.node_count(session.cluster), after):.2f}x)"
        )
    if js.reason is Reason.SHRUNK_TO_ADMIT and js.added[Role.WORKER]:
        # One resize: the workers it gives up, and idle GPUs it may use elsewhere meanwhile.
        return js.reason, (
            f"{js.message}; in the same resize it took {len(js.added[Role.WORKER])} "
            f"workers on idle GPUs elsewhere ({before}->{after} in all)"
        )
    if js.reason is not None:
        return js.reason, js.message
    if after >= js.hi:
        if not session.policy.elastic:
            return (
                Reason.RIGID,
                f"running {counted(after, 'worker')}, its requested size (rigid policy)",
            )
        return Reason.AT_MAXIMUM, f"running {counted(after, 'worker')}, at its maximum"
    return Reason.NO_ROOM, (
        f"running {counted(after, 'worker')}, below its maximum {js.hi}: no node it may use has "
        "room"
    )


def _untouched(js: JobState) -> bool:
    """Neither started, suspended, nor given or stripped of a replica this cycle."""
    added, removed = js.added, js.removed
    return not (
        js.started or js.suspended or js.added_w or js.removed_w or added[_P] or removed[_P]
    )


def _steady(
    js: JobState, session: Session, steady: dict[tuple[Role, int], RoleChange]
) -> JobDecision:
    """The decision of a job that the cycle neither touched nor gave a reason: KEEP (or
    WAIT) at its size, explained by ``_explain``. What it reads of the cycle is the job, its
    bounds and the policy (``js.reason`` is None and nothing was added or removed, so none of
    ``_explain``'s cases that read the cluster apply), so it is the same for every cycle
    that sees the same Job object under the same policy and nodes."""
    action = _action(js)
    reason, message = _explain(js, action, session)
    pservers = _role_change(js, Role.PSERVER, session, steady) if js.job.pserver else None
    workers = _role_change(js, Role.WORKER, session, steady)
    return JobDecision(js.name, action, reason, message, workers, pservers, None)


def _reservations(session: Session, jobs: list[JobState]) -> tuple[Reservation, ...]:
    """``jobs``: in rank order, every job this cycle may have reserved for (all, or the
    touched ones: only ``Admitter._started`` reserves, for a job it placed)."""
    out: list[Reservation] = []
    names = session.cluster.names
    expires = session.now + session.policy.reservation_timeout_s
    for js in jobs:
        if not js.reserve:
            continue
        for role in (_W, _P):  # (iterating the enum class is Python code)
            counts: dict[int, int] = {}
            for node in js.added[role]:
                counts[node] = counts.get(node, 0) + 1
            until = js.hold_expires_at if js.hold_expires_at is not None else expires
            for node, count in sorted(counts.items()):
                out.append(Reservation(js.name, names[node], role, count, until))
    # Holds carried over keep holding while their job is still below its minimum (waiting,
    # or running short after failures); a reservation counts the replicas already there.
    for node, holds in sorted(session.cluster.holds.items()):
        for h in holds:
            held = session.state_of(h.job)
            assert held is not None  # a hold is loaded only for a job of the session
            if h.count > 0 and not held.suspended and held.size() < held.lo:
                there = held.added[h.role].count(node) + sum(
                    1 for r in held.live[h.role] if r.node == names[node]
                )
                out.append(Reservation(h.job, names[node], h.role, h.count + there, h.expires_at))
    return tuple(out)


def _set_aside(job: Job, problems: tuple[JobError, ...]) -> JobDecision:
    """The decision of a job set aside: it keeps what it has; the message is its problem
    (what is wrong and the fix). A plan of changes only leaves it out: it changes
    nothing."""
    message = next(str(p) for p in problems if p.subject == job.name)
    live = [r for r in job.replicas if not r.draining]
    workers = sum(1 for r in live if r.role is _W)
    pservers = len(live) - workers
    return JobDecision(
        job=job.name,
        action=Action.KEEP if workers else Action.WAIT,
        reason=Reason.SET_ASIDE,
        message=f"set aside: {message}",
        workers=RoleChange(_W, workers, workers),
        pservers=RoleChange(_P, pservers, pservers) if job.pserver is not None else None,
    )


def _guard(session: Session, jobs: list[JobState]) -> None:
    c = session.cluster
    touched = {
        n
        for js in jobs
        if js.started or js.added[_W] or js.added[_P]
        for role in (_W, _P)
        for n in js.added[role]
    }
    for n in touched:
        if c.gpu[n] < 0 or c.cpu[n] < 0 or c.mem[n] < 0:
            raise PlanningError(f"plan over-commits node {c.names[n]}")


def plan(
    snapshot: Snapshot,
    policy: Policy,
    now: float,
    *,
    memo: PlanMemo | None = None,
    changes_only: bool = False,
    occupied: Sequence[Resources] | None = None,
) -> Plan:
    """Decide every job's size and placement for this cycle. Deterministic and pure.

    ``memo``: a driver that plans again and again over mostly the same Job objects (the
    simulator) may pass the same ``PlanMemo`` to every call; the plan is the same, and
    jobs seen before are not validated or derived again (``memo``).

    ``changes_only``: for a driver that acts only on changes (the simulator), the Plan's
    ``decisions`` are only the decisions whose size changes, exactly ``changes`` of the
    full plan (same objects' values, same order), with the full plan's reservations; the
    rest (jobs kept, jobs still waiting and why) is neither written nor returned. The
    controller and the local backend show every decision, and keep the default.

    ``occupied``: per node of the snapshot (in its order), capacity that replicas of
    running jobs left out of the snapshot take. A driver may leave out jobs that no plan
    could change (the simulator: ``simulations.hiding``); the plan is then the plan with
    them shown, but for the rank numbers in messages. Default: none."""
    # The cyclic garbage collector is paused for the cycle, then restored as it was. A
    # cycle allocates a few objects per job and creates no reference cycles, so reference
    # counting frees everything; but at 10,000 jobs the collector's repeated scans of the
    # snapshot cost about 40% of the cycle. Pausing it changes no result. (Written out: a
    # context manager is a Python-level generator, about 3% of a compiled simulation.)
    enabled = gc.isenabled()
    gc.disable()
    try:
        return _plan(snapshot, policy, now, memo, changes_only, occupied)
    finally:
        if enabled:
            gc.enable()


def _decide(
    js: JobState, session: Session, steady: dict[tuple[Role, int], RoleChange]
) -> JobDecision:
    """The decision of a job the cycle touched or explained."""
    action = _action(js)
    reason, message = _explain(js, action, session)
    pservers = _role_change(js, Role.PSERVER, session, steady) if js.job.pserver else None
    return JobDecision(
        job=js.name,
        action=action,
        reason=reason,
        message=message,
        workers=_role_change(js, Role.WORKER, session, steady),
        pservers=pservers,
        for_job=js.for_job,
    )


def _changes(session: Session, now: float) -> Plan:
    """Step 5 when only changes are asked for: a job no statement touched kept its
    replicas, so its decision changes nothing; the touched ones are decided as in the
    full plan, in rank order."""
    steady: dict[tuple[Role, int], RoleChange] = {}
    touched = [session.touched[rank] for rank in sorted(session.touched)]
    changes = []
    for js in touched:
        if not _untouched(js):
            decision = _decide(js, session, steady)
            if decision.changed:
                changes.append(decision)
    _guard(session, touched)  # 6
    found = tuple(changes)
    return Plan(now, found, _reservations(session, touched), known_changes=found)


def _plan(
    snapshot: Snapshot,
    policy: Policy,
    now: float,
    memo: PlanMemo | None,
    changes_only: bool,
    occupied: Sequence[Resources] | None = None,
) -> Plan:
    if memo is not None:
        memo.bind(snapshot.nodes, policy)
    problems = validate(snapshot, memo)  # 1
    aside: list[Job] = []
    if problems:
        snapshot, aside = set_aside(snapshot, problems)
        if memo is not None:
            memo.forget()  # it holds only jobs that passed; the next cycle starts afresh
            memo = None
    session = Session(snapshot, policy, now, memo, changes_only=changes_only, occupied=occupied)
    comply(session)  # 2
    admitter, grower = Admitter(session), Grower(session)
    started = admitter.run()  # 3
    grower.run()  # 4
    # 3-4 again, while admission or growth changed something that could open a way for a
    # waiting job. After a round that started and grew nothing, another would see the same
    # state (a failed admission leaves no trace) and fail the same way: it is left out.
    rounds = _EXTRA_ROUNDS if started or grower.statements else 0
    if changes_only and rounds_start_nothing(policy):
        rounds = 0  # they would only write the same reasons again (``admitting``)
    grows = policy.elastic and policy.growth is not Growth.NONE
    for _ in range(rounds):
        waiting = [js for js in session.jobs if js.reason in WAITING]
        if not waiting:
            break
        grower.settle()
        if grows:  # else nothing changed a size since admission kept its pools up to date
            admitter.refresh_pools()
        if admitter.run(waiting) == 0:
            break
        grower.run()
    if changes_only:
        return _changes(session, now)  # 5-6
    decisions = []  # 5
    steady: dict[tuple[Role, int], RoleChange] = {}
    kept = memo.steady if memo is not None else None
    changes: list[JobDecision] = []
    for js in session.jobs:
        if kept is not None and js.reason is None and js.for_job is None and _untouched(js):
            # Nobody touched nor explained it: its decision is that of the last cycle that
            # saw the same Job object (``_steady``), the very object.
            found = kept.get(id(js.job))
            if found is None or found[0] is not js.job:
                found = kept[id(js.job)] = (js.job, _steady(js, session, steady))
            decisions.append(found[1])
            continue
        if js.reason is not None and _untouched(js):
            # Said already, and nothing moved: what ``_action``, ``_explain`` and
            # ``_role_change`` give such a job, without the calls (most jobs of a cycle).
            size = js.workers
            workers = steady.get((Role.WORKER, size))
            if workers is None:
                workers = steady[(Role.WORKER, size)] = RoleChange(Role.WORKER, size, size)
            decisions.append(
                JobDecision(
                    job=js.name,
                    action=Action.KEEP if size else Action.WAIT,
                    reason=js.reason,
                    message=js.message,
                    workers=workers,
                    pservers=(
                        _role_change(js, Role.PSERVER, session, steady) if js.job.pserver else None
                    ),
                    for_job=js.for_job,
                )
            )
            continue
        decision = _decide(js, session, steady)
        decisions.append(decision)
        if decision.changed:  # (the two paths above keep every size: they change nothing)
            changes.append(decision)
    _guard(session, session.jobs)  # 6
    decisions.extend(_set_aside(job, problems) for job in aside)
    return Plan(
        now=now,
        decisions=tuple(decisions),
        reservations=_reservations(session, session.jobs),
        known_changes=tuple(changes),
    )
