"""One planning cycle's working state, opened over a snapshot (as a Volcano session is).

The cycle's free capacity is a ``capacity.Cluster``, the only code that takes or gives node
capacity. ``JobState`` is one job's working state in the cycle.

``Statement`` records moves so that an action can try them and then commit or discard them.
Nothing here reads a clock or does I/O; the session dies with the ``plan()`` call.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Final

from edl_scheduler.core.capacity import Cluster, Hold
from edl_scheduler.core.matching import allowed_on
from edl_scheduler.core.memo import Derived, PlanMemo
from edl_scheduler.core.ordering import effective_priority, key_varies, sort_key
from edl_scheduler.core.plan import Reason
from edl_scheduler.core.policy import Policy
from edl_scheduler.core.ranking import first, kept_ranking
from edl_scheduler.core.resources import Resources
from edl_scheduler.core.snapshot import Constraints, Job, Replica, Role, Snapshot

if TYPE_CHECKING:  # the margins module imports this one
    from edl_scheduler.core.margins import Margins

_W: Final = Role.WORKER
_P: Final = Role.PSERVER


def _occupy(used: list[list[int]], occupied: Sequence[Resources], nodes: int) -> None:
    if len(occupied) != nodes or any(r.is_negative() for r in occupied):
        raise ValueError(
            f"occupied: {len(occupied)} entries for {nodes} nodes; give one per node of the "
            "snapshot, in its order, none negative"
        )
    for u, r in zip(used, occupied, strict=True):
        u[0] += r.gpu
        u[1] += r.cpu_milli
        u[2] += r.memory_bytes


class JobState:
    """A job inside the session: what it had, and what this cycle adds and removes.
    Compared by identity. (A plain class: compiled, its ``__init__`` is C, where a
    dataclass's is generated Python code; one is made for every new Job object.)"""

    __slots__ = (
        "added",
        "added_w",
        "classes",
        "cooling_end",
        "for_job",
        "hi",
        "hold_expires_at",
        "job",
        "live",
        "live_w",
        "lo",
        "margins",
        "message",
        "priority",
        "pservers",
        "rank",
        "reason",
        "removed",
        "removed_w",
        "reserve",
        "started",
        "suspended",
        "workers",
    )

    def __init__(
        self,
        job: Job,
        rank: int,
        priority: int,
        lo: int,
        hi: int,
        classes: frozenset[int],
        live: dict[Role, list[Replica]],
        workers: int = 0,
        pservers: int = 0,
    ) -> None:
        self.job = job
        self.rank = rank
        self.priority = priority
        self.lo = lo
        self.hi = hi
        self.classes = classes
        #: Replicas the job had (not draining). Never changed: with a ``PlanMemo`` the
        #: same lists serve later cycles; moves go to ``added`` and ``removed``.
        self.live = live
        #: ``live``, ``added`` and ``removed`` of the workers, the very lists: read as an
        #: attribute where a loop over every job asks (a dict look-up by role is not free).
        #: ``added[WORKER] is added_w`` and ``removed[WORKER] is removed_w`` always: the
        #: lists change in place, and only ``moves`` replaces them, both together.
        self.live_w = live[_W]
        self.added_w: list[int] = []
        self.removed_w: list[Replica] = []
        self.added: dict[Role, list[int]] = {_W: self.added_w, _P: []}
        self.removed: dict[Role, list[Replica]] = {_W: self.removed_w, _P: []}
        #: Current size per role (live - removed + added), kept by ``Statement`` for speed.
        self.workers = workers
        self.pservers = pservers
        self.reason: Reason | None = None
        self.message = ""
        #: The job this one was shrunk, suspended or moved to admit.
        self.for_job: str | None = None
        #: Whether its new replicas stand on capacity taken from others, or it was started
        #: on room held for it whose pods do not exist yet (so the plan holds it).
        self.reserve = False
        #: When a hold carried over for it expires (None: a new hold,
        #: ``reservation_timeout_s``).
        self.hold_expires_at: float | None = None
        self.suspended = False
        self.started = False
        #: What a worker more or fewer is worth at its live size (``margins``): the job's
        #: alone, so a kept state keeps it; derived when first asked for.
        self.margins: Margins | None = None
        #: When the cool-down of a job held for it ends, where a plan of changes only left
        #: its message unwritten (``growing.Grower.candidates``); read only while its
        #: reason is ``COOLING_DOWN`` and its message empty, which nothing else leaves.
        self.cooling_end: float | None = None

    @property
    def name(self) -> str:
        return self.job.name

    def moves(self) -> None:
        """Forget this cycle's moves (a kept state, before the next cycle acts)."""
        self.added_w, self.removed_w = [], []
        self.added = {_W: self.added_w, _P: []}
        self.removed = {_W: self.removed_w, _P: []}
        self.workers, self.pservers = len(self.live_w), len(self.live[_P])

    def size(self, role: Role = Role.WORKER) -> int:
        return self.workers if role is _W else self.pservers

    def count(self, role: Role, delta: int) -> None:
        if role is _W:
            self.workers += delta
        else:
            self.pservers += delta

    @property
    def was_running(self) -> bool:
        return bool(self.live_w)

    @property
    def newly_started(self) -> bool:
        """Started from nothing this cycle (not a running job restored to its minimum)."""
        return self.started and not self.was_running

    def hold(self, reason: Reason, message: str) -> None:
        """Explain why a job is held back, after what this cycle already did to it (started,
        or shrunk to admit another job)."""
        if self.reason is reason:
            return  # said already, in an earlier round of this cycle
        moved = self.started or self.for_job is not None
        self.reason = reason
        self.message = f"{self.message}; {message}" if moved else message

    @property
    def running(self) -> bool:
        return self.size() > 0

    def resources(self, role: Role) -> Resources:
        spec = self.job.role_spec(role)
        assert spec is not None
        return spec.resources

    def fulfillment(self) -> float:
        """EDL's (cur - min) / (max - min): 1.0 for a rigid job at its size."""
        span = self.hi - self.lo
        return 1.0 if span <= 0 else (self.size() - self.lo) / span

    def node_count(self, cluster: Cluster) -> int:
        """Distinct nodes the job's workers are on, after this cycle's moves."""
        if not self.added_w and not self.removed_w:
            return len({r.node for r in self.live_w})
        return len(set(self.nodes(_W, cluster)))

    def nodes(self, role: Role, cluster: Cluster) -> list[int]:
        removed = self.removed[role]
        if not removed:  # (most calls: no set to build)
            return [cluster.index[r.node] for r in self.live[role]] + self.added[role]
        gone = {r.name for r in removed}
        used = [cluster.index[r.node] for r in self.live[role] if r.name not in gone]
        return used + self.added[role]


class Statement:
    """Moves tried by an action; ``discard`` undoes them all, ``commit`` keeps them.

    Every job a move touches is noted in ``touched`` (rank -> job state), the session's: a
    job never noted kept its replicas, so a plan that reports only changes looks at those
    alone (noted and then undone is fine: the note only errs toward looking)."""

    def __init__(self, cluster: Cluster, touched: dict[int, JobState] | None = None) -> None:
        self._cluster = cluster
        self._undo: list[Callable[[], None]] = []
        self._touched: dict[int, JobState] = {} if touched is None else touched

    def add(self, js: JobState, role: Role, node: int) -> None:
        self._touched[js.rank] = js
        res = js.resources(role)
        self._cluster.take(node, res)
        js.added[role].append(node)
        js.count(role, 1)
        consumed = self._consume_hold(js, role, node)

        def undo() -> None:
            js.added[role].pop()
            js.count(role, -1)
            self._cluster.give(node, res)
            if consumed is not None:
                consumed.count += 1

        self._undo.append(undo)

    def _consume_hold(self, js: JobState, role: Role, node: int) -> Hold | None:
        for h in self._cluster.holds.get(node, ()):
            if h.job == js.name and h.role is role and h.count > 0:
                h.count -= 1
                return h
        return None

    def remove(self, js: JobState, replica: Replica) -> None:
        self._touched[js.rank] = js
        node = self._cluster.index[replica.node]
        res = js.resources(replica.role)
        self._cluster.give(node, res)
        js.removed[replica.role].append(replica)
        js.count(replica.role, -1)

        def undo() -> None:
            js.removed[replica.role].remove(replica)
            js.count(replica.role, 1)
            self._cluster.take(node, res)

        self._undo.append(undo)

    def cancel(self, js: JobState, role: Role, node: int) -> None:
        """Withdraw one replica that this cycle added to ``js`` on ``node``."""
        self._touched[js.rank] = js
        res = js.resources(role)
        added = js.added[role]
        at = len(added) - 1 - added[::-1].index(node)
        added.pop(at)
        js.count(role, -1)
        self._cluster.give(node, res)

        def undo() -> None:
            self._cluster.take(node, res)
            js.count(role, 1)
            added.insert(at, node)

        self._undo.append(undo)

    def restore(self, js: JobState, replica: Replica) -> None:
        """Take back a removal made earlier in this statement (the replica stays)."""
        self._touched[js.rank] = js
        node = self._cluster.index[replica.node]
        res = js.resources(replica.role)
        js.removed[replica.role].remove(replica)
        js.count(replica.role, 1)
        self._cluster.take(node, res)

        def undo() -> None:
            self._cluster.give(node, res)
            js.removed[replica.role].append(replica)
            js.count(replica.role, -1)

        self._undo.append(undo)

    def commit(self) -> None:
        self._undo.clear()

    def discard(self) -> None:
        while self._undo:
            self._undo.pop()()


class Session:
    """Everything one cycle works on: the cluster, the ranked jobs, the policy and ``now``."""

    def __init__(
        self,
        snapshot: Snapshot,
        policy: Policy,
        now: float,
        memo: PlanMemo | None = None,
        *,
        changes_only: bool = False,
        occupied: Sequence[Resources] | None = None,
    ) -> None:
        """``memo``: what earlier cycles derived from the same jobs (``memo``), reused
        for jobs it holds and refilled with this snapshot's jobs. ``changes_only``: the
        plan reports only the jobs whose size changes, so the actions need not write the
        message of a job that stays waiting (``planning.plan``)."""
        self.policy = policy
        self.now = now
        self.changes_only = changes_only
        #: Rank -> every job a statement of this cycle moved (``Statement``).
        self.touched: dict[int, JobState] = {}
        self.jobs: list[JobState] = []
        key = sort_key(policy, now)
        varies = key_varies(policy)
        if memo is not None and memo.ranked is not None and not varies:
            # Node name -> index: the memo's layout has the map (made once, not per cycle).
            index = memo.layout(snapshot.nodes).index
            keyed, used = kept_ranking(
                snapshot, memo, lambda job: Session._derive(job, policy, index, None, key, False)
            )
        else:
            index = {n.name: i for i, n in enumerate(snapshot.nodes)}
            used = [[0, 0, 0] for _ in snapshot.nodes]
            derived = [self._derive(job, policy, index, memo, key, varies) for job in snapshot.jobs]
            keyed = [(d.key if d.key is not None else key(d.job), d) for d in derived]
            keyed.sort(key=first)
            for _, d in keyed:  # (``ranking.count``, inlined: this path serves the controller)
                for n, g, c, m in d.usage:
                    u = used[n]
                    u[0] += g
                    u[1] += c
                    u[2] += m
            if memo is not None:
                memo.jobs = {id(d.job): d for d in derived}
                memo.names = {d.job.name: d for d in derived}
                memo.remember(snapshot.jobs, derived)
                steady = memo.steady
                memo.steady = {k: v for k, v in steady.items() if k in memo.jobs}
                memo.ranked = None if varies else keyed
                memo.keys = [] if varies else [k for k, _ in keyed]
                memo.used = [list(u) for u in used]
        if occupied is not None:  # replicas of jobs left out of the snapshot (``plan``)
            _occupy(used, occupied, len(snapshot.nodes))
        self.cluster = Cluster(snapshot.nodes, used, memo.layout(snapshot.nodes) if memo else None)
        self._class_cache: dict[Constraints, frozenset[int]] = {}
        self._last_constraints: Constraints | None = None
        self._last_classes: frozenset[int] = frozenset()
        if memo is not None:
            for js in memo.moved.values():  # what the last cycle's statements moved
                js.moves()
            memo.moved = self.touched
        for rank, (_, d) in enumerate(keyed):
            kept = d.state
            if kept is not None:
                js = kept
                # Kept from the last cycle that saw this Job (a Derived of this cycle's own,
                # as every one without a memo is, has none): what is the job's alone stays;
                # what a cycle sets is set back to a fresh JobState's values.
                js.rank = rank
                js.reason, js.message, js.for_job = None, "", None
                js.reserve = js.suspended = js.started = False
                js.hold_expires_at = None
                self.jobs.append(js)
                continue
            live = d.live
            js = JobState(
                d.job,
                rank,
                d.priority,
                d.lo,
                d.hi,
                self.eligible_classes(d.job.constraints),
                live,
                workers=len(live[_W]),
                pservers=len(live[_P]),
            )
            if memo is not None:
                d.state = js
            self.jobs.append(js)
        # Name -> state: with a memo, its entry by name (``PlanMemo.names``, which describes
        # this snapshot's jobs, each entry holding the state this loop gave it), so no
        # table is built per cycle; without one, a table built when first asked.
        self._names = memo.names if memo is not None else None
        self._by_name: dict[str, JobState] | None = None
        self._load_holds(snapshot)

    @staticmethod
    def _derive(
        job: Job,
        policy: Policy,
        index: dict[str, int],
        memo: PlanMemo | None,
        key: Callable[[Job], tuple[float | str, ...]],
        varies: bool,
    ) -> Derived:
        """What the session needs of ``job`` alone: from the memo, or derived now. The rank
        key is kept only where it does not depend on ``now`` (see ``key_varies``)."""
        if memo is not None:
            found = memo.get(job)
            if found is not None:
                return found
        if policy.elastic:
            lo, hi = job.worker.min_replicas, job.worker.max_replicas
        else:
            lo = hi = job.rigid_size
        live: dict[Role, list[Replica]] = {_W: [], _P: []}
        usage: list[tuple[int, int, int, int]] = []
        for replica in job.replicas:
            if not replica.draining:
                live[replica.role].append(replica)
                spec = job.worker if replica.role is _W else job.pserver
                assert spec is not None  # validated
                res = spec.resources
                usage.append((index[replica.node], res.gpu, res.cpu_milli, res.memory_bytes))
        constant = None if varies and not job.replicas else key(job)
        return Derived(job, constant, lo, hi, effective_priority(job, policy), live, tuple(usage))

    def state_of(self, name: str) -> JobState | None:
        """The state of the job named ``name`` in this cycle (None: no such job)."""
        names = self._names
        if names is not None:
            d = names.get(name)
            return None if d is None else d.state
        if self._by_name is None:
            self._by_name = {js.job.name: js for js in self.jobs}
        return self._by_name.get(name)

    def eligible_classes(self, constraints: Constraints) -> frozenset[int]:
        if constraints is self._last_constraints:  # most jobs share one object: no hashing
            return self._last_classes
        found = self._class_cache.get(constraints)
        if found is None:
            found = frozenset(
                c
                for c, example in enumerate(self.cluster.class_example)
                if allowed_on(constraints, example)
            )
            self._class_cache[constraints] = found
        self._last_constraints, self._last_classes = constraints, found
        return found

    def _load_holds(self, snapshot: Snapshot) -> None:
        """Reservations from the last plan, minus what has expired or is already placed."""
        for r in snapshot.reservations:
            js = self.state_of(r.job)
            node = self.cluster.index.get(r.node)
            if js is None or node is None or r.expires_at <= self.now or js.job.suspended:
                continue
            if js.size() >= js.lo:
                continue  # it runs already: nothing is left to hold for it
            spec = js.job.role_spec(r.role)
            if spec is None:
                continue
            there = sum(1 for rep in js.live[r.role] if rep.node == r.node)
            left = r.count - there
            if left > 0:
                hold = Hold(js.name, js.rank, r.role, left, spec.resources, r.expires_at)
                self.cluster.holds.setdefault(node, []).append(hold)

    def statement(self) -> Statement:
        return Statement(self.cluster, self.touched)

    def allocated_gpus(self) -> int:
        return self.cluster.capacity_gpu - self.cluster.free_gpu
