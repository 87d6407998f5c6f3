"""Steps 5-6 of a cycle: what a decided session says, as a ``Plan``.

Per job and role: the target, the node of each new replica, the named replicas to remove,
the reason and a one-line message; the reservations that keep freed GPUs for the job they
were freed for; then the guard that no node receiving a replica ends over-committed (a bug
if it happens). ``write_plan`` writes every job's decision (``plan()``); ``write_changes``
only the decisions whose size changes, the same objects' values in the same order (a
caller that acts on changes only: the incremental planner).

A message an action left unwritten (``session.JobState.cooling_end``, ``wait_gpus``...) is
written here, only for a decision that is returned (``said``).
"""

from __future__ import annotations

from typing import Final

from edl_scheduler.core.admitting import waiting_message
from edl_scheduler.core.errors import PlanningError
from edl_scheduler.core.growing import WAITING, cooling_message
from edl_scheduler.core.plan import (
    HOLD_REASONS,
    Action,
    JobDecision,
    Plan,
    Reason,
    RoleChange,
    counted,
)
from edl_scheduler.core.session import JobState, Session
from edl_scheduler.core.snapshot import Job, Reservation, Role
from edl_scheduler.core.throughput import job_model
from edl_scheduler.core.validating import JobError

#: (An enum class attribute read costs about 0.17 us; ``_untouched`` runs once per job.)
_W: Final = Role.WORKER
_P: Final = Role.PSERVER


def said(js: JobState, now: float) -> str:
    """``js``'s message: the one an action wrote, or the one it left to be written here
    (a cooling job held unmoved, a job left waiting)."""
    message = js.message
    if message:
        return message
    reason = js.reason
    if reason is Reason.COOLING_DOWN and js.cooling_end is not None:
        return cooling_message(js.cooling_end, now)
    if reason in WAITING:
        return waiting_message(js)
    return message


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
    if not js.message:
        js.message = said(js, session.now)  # (left unwritten by the action)
    if js.started and js.reason is Reason.MOVED_TO_ADMIT and after > js.lo:
        return js.reason, f"{js.message}, then grown to {after} into idle GPUs"
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


def write_changes(session: Session) -> Plan:
    """Steps 5-6 for a caller that acts only on changes: the decisions whose size changes,
    exactly ``changes`` of the full plan (``write_plan``: same values, same order), with
    its reservations. A job no statement touched kept its replicas, so its decision changes
    nothing; the touched ones are decided as in the full plan, in rank order."""
    now = session.now
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


def write_plan(session: Session, aside: list[Job], problems: tuple[JobError, ...]) -> Plan:
    """Steps 5-6: every job's decision in rank order, then those of the jobs set aside
    (``aside``, for ``problems``), and the reservations."""
    now = session.now
    decisions = []
    steady: dict[tuple[Role, int], RoleChange] = {}
    changes: list[JobDecision] = []
    for js in session.jobs:
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
                    message=said(js, now),
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
        if decision.changed:  # (the path above keeps every size: it changes nothing)
            changes.append(decision)
    _guard(session, session.jobs)  # 6
    decisions.extend(_set_aside(job, problems) for job in aside)
    return Plan(
        now=now,
        decisions=tuple(decisions),
        reservations=_reservations(session, session.jobs),
        known_changes=tuple(changes),
    )
