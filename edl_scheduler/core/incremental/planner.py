"""``IncrementalPlanner``: ``plan()`` for a driver that plans again and again over mostly
the same jobs, made cheaper by what it keeps from one cycle to the next.

A simulator plans at every arrival and completion, and each plan changes one or two jobs.
The planner keeps, per Job object (``memo``): its validation, rank key, session state and
the capacity its live replicas take, and the last ranking (``ranking``); so a cycle derives
and ranks only the jobs it has not seen. What it may leave out, and why that is exact:

- the decisions that change nothing: ``plan`` returns only the decisions whose size
  changes (``writing.write_changes``), so the messages of jobs held or left waiting are
  never written, and where no second admission round can start a job
  (``admitting.rounds_start_nothing``) the rounds that would only restate reasons are not
  run;
- running jobs that no plan can change (``unchangeable``): a driver may leave them out of
  the snapshot and pass the capacity their replicas take as ``occupied``.

Its contract: for any sequence of snapshots, ``plan(snapshot, now)`` equals
``planning.plan(snapshot, policy, now)``'s changes, decision for decision, with the same
reservations (``tests/core/test_incremental.py``, on generated and recorded sequences); with
``occupied``, those of the plan of the whole snapshot. It decides through the same steps
(``deciding``) and writes through the same writer (``writing``); only the opening of the
session differs. Pure as ``plan()`` is: no clock, no I/O, no process-wide effect.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from edl_scheduler.core.admitting import rounds_start_nothing
from edl_scheduler.core.capacity import Cluster
from edl_scheduler.core.deciding import EXTRA_ROUNDS, decide
from edl_scheduler.core.incremental.memo import Derived, PlanMemo
from edl_scheduler.core.incremental.ranking import count, first, kept_ranking
from edl_scheduler.core.ordering import key_varies, sort_key
from edl_scheduler.core.plan import Plan
from edl_scheduler.core.policy import Policy
from edl_scheduler.core.resources import Resources
from edl_scheduler.core.session import Eligibility, JobState, Session, job_state
from edl_scheduler.core.snapshot import Job, Role, Snapshot
from edl_scheduler.core.validating import JobError, problem_of, set_aside, validate
from edl_scheduler.core.writing import write_changes

Key = tuple[float | str, ...]


class IncrementalPlanner:
    """Plans for one policy, cycle after cycle, keeping what it derived (see the module)."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self.memo = PlanMemo()
        #: Whether a waiting job's rank key depends on ``now``: then no ranking is kept.
        self._varies = key_varies(policy)
        self._rounds = 0 if rounds_start_nothing(policy) else EXTRA_ROUNDS

    def plan(
        self, snapshot: Snapshot, now: float, occupied: Sequence[Resources] | None = None
    ) -> Plan:
        """The changes of ``planning.plan(snapshot, policy, now)`` (its decisions whose size
        changes, in order) and its reservations. ``occupied``: per node of the snapshot (in
        its order), capacity that replicas of running jobs left out of it take (jobs no
        plan could change: ``unchangeable``); the plan is then that of the snapshot with
        them shown."""
        if occupied is not None:
            _check(occupied, len(snapshot.nodes))
        memo = self.memo
        memo.bind(snapshot.nodes)
        problems = self._validate(snapshot)  # 1
        if problems:
            snapshot, _ = set_aside(snapshot, problems)  # (they change nothing)
            memo.forget()  # it holds only jobs that passed; the next cycle starts afresh
            memo.bind(snapshot.nodes)
        session = self._open(snapshot, now, occupied)  # 2
        decide(session, self._rounds)  # 2-4
        return write_changes(session)  # 5-6

    def _validate(self, snapshot: Snapshot) -> tuple[JobError, ...]:
        """``validating.validate(snapshot)``, checking only the jobs not held: a held job
        passed every check of its own on these nodes (a cycle that finds a problem
        forgets the memo), and any clash of names takes the full path."""
        memo = self.memo
        if memo.nodes_valid:
            fresh = memo.sort_out(snapshot.jobs)
            if _distinct(fresh, memo):
                problems = []
                for job in fresh:
                    found = problem_of(job, memo.node_names)
                    if found is not None:
                        problems.append(found)
                return tuple(problems)
        problems_all = validate(snapshot)
        memo.nodes_valid = True
        memo.node_names = {node.name for node in snapshot.nodes}
        return problems_all

    def _open(
        self, snapshot: Snapshot, now: float, occupied: Sequence[Resources] | None
    ) -> Session:
        """The session ``session.open_session`` opens, from what the memo kept: the kept
        ranking patched for the jobs that left and came (or, where the keys vary with
        ``now``, every job ranked again from its kept entry), the kept states with last
        cycle's moves forgotten."""
        memo, policy = self.memo, self.policy
        nodes = snapshot.nodes
        layout = memo.layout(nodes)
        index, classes = layout.index, memo.classes(nodes)
        key = sort_key(policy, now)
        varies = self._varies

        def derive(job: Job) -> Derived:
            return _derive(job, policy, index, classes, key, varies)

        ranked: list[tuple[Key, Derived]]
        if memo.ranked is not None and not varies:
            ranked, used = kept_ranking(snapshot, memo, derive)
        else:
            derived = []
            for job in snapshot.jobs:
                found = memo.get(job)
                derived.append(found if found is not None else derive(job))
            ranked = [(d.key if d.key is not None else key(d.job), d) for d in derived]
            ranked.sort(key=first)
            used = [[0, 0, 0] for _ in nodes]
            for d in derived:
                count(used, d, 1)
            memo.jobs = {id(d.job): d for d in derived}
            memo.names = {d.job.name: d for d in derived}
            memo.remember(snapshot.jobs, derived)
            memo.ranked = None if varies else ranked
            memo.keys = [] if varies else [k for k, _ in ranked]
            memo.used = [list(u) for u in used]
        if occupied is not None:  # replicas of jobs left out of the snapshot
            for u, r in zip(used, occupied, strict=True):
                u[0] += r.gpu
                u[1] += r.cpu_milli
                u[2] += r.memory_bytes
        for js in memo.moved.values():  # what the last cycle's statements moved
            js.moves()
        session = Session(
            policy,
            now,
            Cluster(nodes, used, layout),
            [d.state for _, d in ranked],
            snapshot.reservations,
            self._named,
        )
        memo.moved = session.touched
        return session

    def _named(self, name: str) -> JobState | None:
        """The state of this snapshot's job named ``name``: the memo's entries describe
        the snapshot being planned, each holding its state."""
        found = self.memo.names.get(name)
        return None if found is None else found.state


def _derive(
    job: Job,
    policy: Policy,
    index: dict[str, int],
    classes: Eligibility,
    key: Callable[[Job], Key],
    varies: bool,
) -> Derived:
    """A new entry for ``job``: its state (``session.job_state``), the use of its live
    replicas per node, and its rank key where it does not depend on ``now``."""
    js = job_state(job, policy, classes)
    usage: list[tuple[int, int, int, int]] = []
    for role in (Role.WORKER, Role.PSERVER):
        live = js.live[role]
        if live:
            res = js.resources(role)
            for replica in live:
                usage.append((index[replica.node], res.gpu, res.cpu_milli, res.memory_bytes))
    constant = None if varies and not job.replicas else key(job)
    return Derived(job, constant, js, tuple(usage))


def _check(occupied: Sequence[Resources], nodes: int) -> None:
    if len(occupied) != nodes or any(r.is_negative() for r in occupied):
        raise ValueError(
            f"occupied: {len(occupied)} entries for {nodes} nodes; give one per node of the "
            "snapshot, in its order, none negative"
        )


def _distinct(fresh: list[Job], memo: PlanMemo) -> bool:
    """Whether the names of the snapshot just sorted out (``PlanMemo.sort_out``) are
    distinct, looking only at ``fresh``, its jobs not held by the memo. The held ones are
    jobs of the last validated snapshot, whose names were distinct, so two of them clash
    only where one Job is shown twice (``repeated``); a new job clashes with a held one
    only where that one is shown now (marked by this sort, ``Derived.seen``)."""
    if memo.repeated:
        return False
    names, cycle = memo.names, memo.cycle
    new: set[str] = set()
    for job in fresh:
        name = job.name
        other = names.get(name)
        if (other is not None and other.seen == cycle) or name in new:
            return False
        new.add(name)
    return True
