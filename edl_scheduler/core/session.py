"""One planning cycle's working state, opened over a snapshot (as a Volcano session is).

The cycle's free capacity is a ``capacity.Cluster``, the only code that takes or gives node
capacity. ``JobState`` is one job's working state in the cycle: what it had (derived from
the job alone, ``job_state``) and what this cycle did to it.

``Statement`` records moves so that an action can try them and then commit or discard them.
``open_session`` opens a session over a snapshot the way ``plan()`` does: every job derived
and ranked afresh. An incremental planner (``incremental``) opens one from the states it
kept instead; a session does not know which. Nothing here reads a clock or does I/O.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

from edl_scheduler.core.capacity import Cluster, Hold
from edl_scheduler.core.layout import Layout, layout_of
from edl_scheduler.core.margins import Margins, derive, explored_limit
from edl_scheduler.core.matching import allowed_on
from edl_scheduler.core.ordering import effective_priority, sort_key
from edl_scheduler.core.plan import Reason
from edl_scheduler.core.policy import Policy
from edl_scheduler.core.resources import Resources
from edl_scheduler.core.sizing import bounds
from edl_scheduler.core.snapshot import Constraints, Job, Replica, Reservation, Role, Snapshot
from edl_scheduler.core.throughput import ThroughputModel, job_model

_W: Final = Role.WORKER
_P: Final = Role.PSERVER


class JobState:
    """A job inside the session: what it had, and what this cycle adds and removes.
    Compared by identity. (A plain class: compiled, its ``__init__`` is C, where a
    dataclass's is generated Python code; one is made for every new Job object.)"""

    __slots__ = (
        "added",
        "added_w",
        "behind",
        "classes",
        "cooling_end",
        "explored",
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
        "retreat_known",
        "retreat_to",
        "started",
        "suspended",
        "wait_ahead",
        "wait_free",
        "wait_gpus",
        "way_up",
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
        #: Replicas the job had (not draining). Never changed: a state an incremental
        #: planner keeps serves later cycles; moves go to ``added`` and ``removed``.
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
        #: What a worker more or fewer is worth at its live size (``worth``): the job's
        #: alone, so a kept state keeps it; derived when first asked for.
        self.margins: Margins | None = None
        #: Where the job would retreat to (``retreating.target``), once ``retreat_known``:
        #: the job's alone as well, so a kept state keeps it.
        self.retreat_known = False
        self.retreat_to: tuple[int, int, float] | None = None
        #: ``margins.explored_limit`` of the job and its bounds (0 until asked,
        #: ``explored_limit``) and whether it is ``stability.on_its_way_up`` at its live
        #: size (None until asked, ``stability.may_ramp``): the job's alone, kept with it.
        self.explored = 0
        self.way_up: bool | None = None
        # What a message left unwritten would say (``said``): an action that holds a job
        # unmoved, or leaves it waiting, notes the numbers and leaves ``message`` empty, and
        # the plan writes the message only for a decision it returns. Each is read only
        # while ``message`` is empty and ``reason`` is the one set beside it in this cycle.
        #: When the cool-down of a job held for it ends (reason ``COOLING_DOWN``).
        self.cooling_end: float | None = None
        #: The job a strict-FIFO line waits behind (reason ``WAITING_IN_LINE``).
        self.behind = ""
        #: A waiting job's lack in GPUs, the GPUs free where it may run and the waiting
        #: jobs ranked ahead (reasons ``WAITING_FOR_CAPACITY``, ``BELOW_MINIMUM``).
        self.wait_gpus = 0
        self.wait_free = 0
        self.wait_ahead = 0

    @property
    def name(self) -> str:
        return self.job.name

    def begin(self, rank: int) -> None:
        """Start a cycle at ``rank``: what a cycle sets goes back to a new state's values;
        what is the job's alone stays (a state kept from the last cycle that saw this Job,
        whose moves ``moves`` forgot)."""
        self.rank = rank
        self.reason, self.message, self.for_job = None, "", None
        self.reserve = self.suspended = self.started = False
        self.hold_expires_at = None

    def worth(self, policy: Policy) -> Margins:
        """What a worker more or fewer is worth to the job at its live size under
        ``policy`` (``margins``), derived at the first call for its ``Job`` object and
        kept."""
        found = self.margins
        if found is None:
            found = derive(
                self.job,
                self.live_w,
                self.lo,
                self.hi,
                policy.gain_horizon_s,
                policy.resize_pause_s,
            )
            self.margins = found
        return found

    def explored_limit(self) -> int:
        """``margins.explored_limit`` of the job within its bounds, found at the first call
        for its ``Job`` object and kept (a loop over every running job asks it)."""
        found = self.explored
        if not found:
            found = self.explored = explored_limit(self.job, self.lo, self.hi)
        return found

    def model(self) -> ThroughputModel:
        """``throughput.job_model(job)``, from the kept margins where they were derived
        (the fit's cache is keyed by the samples, whose hash is most of its cost)."""
        found = self.margins
        return found.model if found is not None else job_model(self.job)

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


def job_state(job: Job, policy: Policy, classes: Eligibility) -> JobState:
    """What a cycle derives from ``job`` alone under ``policy``: its bounds, priority,
    live replicas and the node classes it may use (rank 0 until a session ranks it)."""
    lo, hi = bounds(job, policy.elastic)
    live: dict[Role, list[Replica]] = {_W: [], _P: []}
    for replica in job.replicas:
        if not replica.draining:
            live[replica.role].append(replica)
    return JobState(
        job,
        0,
        effective_priority(job, policy),
        lo,
        hi,
        classes.of(job.constraints),
        live,
        workers=len(live[_W]),
        pservers=len(live[_P]),
    )


class Eligibility:
    """The node classes of a layout that a job's constraints allow, found once per distinct
    ``Constraints`` (most jobs share one object)."""

    __slots__ = ("_cache", "_examples", "_last", "_last_classes")

    def __init__(self, layout: Layout) -> None:
        self._examples = layout.class_example
        self._cache: dict[Constraints, frozenset[int]] = {}
        self._last: Constraints | None = None
        self._last_classes: frozenset[int] = frozenset()

    def of(self, constraints: Constraints) -> frozenset[int]:
        if constraints is self._last:  # (no hashing)
            return self._last_classes
        found = self._cache.get(constraints)
        if found is None:
            found = frozenset(
                c for c, example in enumerate(self._examples) if allowed_on(constraints, example)
            )
            self._cache[constraints] = found
        self._last, self._last_classes = constraints, found
        return found


def count_live(used: list[list[int]], js: JobState, index: dict[str, int]) -> None:
    """Add what ``js``'s live replicas take to ``used`` ([gpu, cpu, memory] per node)."""
    for role in (_W, _P):
        live = js.live[role]
        if live:
            res = js.resources(role)
            for replica in live:
                u = used[index[replica.node]]
                u[0] += res.gpu
                u[1] += res.cpu_milli
                u[2] += res.memory_bytes


def first(pair: tuple[tuple[float | str, ...], JobState]) -> tuple[float | str, ...]:
    return pair[0]


def open_session(snapshot: Snapshot, policy: Policy, now: float) -> Session:
    """A session over ``snapshot`` (valid) with every job derived and ranked afresh: the
    ranking is the policy's (``ordering.sort_key``, whose keys end in the job's name)."""
    layout = layout_of(snapshot.nodes)
    classes = Eligibility(layout)
    key = sort_key(policy, now)
    used = [[0, 0, 0] for _ in snapshot.nodes]
    keyed: list[tuple[tuple[float | str, ...], JobState]] = []
    for job in snapshot.jobs:
        js = job_state(job, policy, classes)
        keyed.append((key(job), js))
        count_live(used, js, layout.index)
    keyed.sort(key=first)
    cluster = Cluster(snapshot.nodes, used, layout)
    return Session(policy, now, cluster, [js for _, js in keyed], snapshot.reservations)


class Session:
    """Everything one cycle works on: the cluster, the ranked jobs, the policy and ``now``."""

    def __init__(
        self,
        policy: Policy,
        now: float,
        cluster: Cluster,
        jobs: list[JobState],
        reservations: tuple[Reservation, ...] = (),
        named: Callable[[str], JobState | None] | None = None,
    ) -> None:
        """``jobs``: every job's state in rank order, with nothing moved (``begin`` sets
        each one's rank and clears what an earlier cycle set); ``cluster``: the free
        capacity with their live replicas counted; ``reservations``: the last plan's,
        loaded as holds. ``named``: finds a job's state by its name, where the caller keeps
        a table of them (else one is built when first asked)."""
        self.policy = policy
        self.now = now
        self.cluster = cluster
        self.jobs = jobs
        #: Rank -> every job a statement of this cycle moved (``Statement``).
        self.touched: dict[int, JobState] = {}
        for rank in range(len(jobs)):
            jobs[rank].begin(rank)
        self._named = named
        self._by_name: dict[str, JobState] | None = None
        #: ``preempting``'s indexes of this cycle's possible victims, in rank order, built
        #: when first asked: the jobs with live workers at the cycle's start, those of them
        #: above their minimum, and those an equal may shrink voluntarily.
        self.had_workers: list[JobState] | None = None
        self.spare: list[JobState] | None = None
        self.reclaimable: list[JobState] | None = None
        self._load_holds(reservations)

    def state_of(self, name: str) -> JobState | None:
        """The state of the job named ``name`` in this cycle (None: no such job)."""
        if self._named is not None:
            return self._named(name)
        if self._by_name is None:
            self._by_name = {js.job.name: js for js in self.jobs}
        return self._by_name.get(name)

    def _load_holds(self, reservations: tuple[Reservation, ...]) -> None:
        """Reservations from the last plan, minus what has expired or is already placed."""
        for r in reservations:
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
