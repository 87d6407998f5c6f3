"""What the incremental planner keeps of each job from one cycle to the next.

Most jobs are the same from one cycle to the next (a simulator plans at every arrival and
completion, and each plan changes one or two jobs). A job's validation, its rank key, the
capacity its live replicas take and its session state (``session.JobState``: its bounds,
live replicas, node classes and margins) are pure functions of the job, the policy and the
nodes; ``PlanMemo`` keeps them between cycles, keyed by the job object's identity, so a
cycle derives them only for jobs it has not seen.

What must stay true: every entry is keyed by the identity of an immutable ``Job`` (the
entry keeps the object alive, so the identity cannot be reused), and the whole memo is
dropped when the nodes tuple is not the one it was built for (the planner is built for one
policy). Entries of jobs absent from a cycle's snapshot leave it, parked (``parked``, taken
back if the same object comes back; at most four snapshots' worth). A kept state's moves
are forgotten before the next cycle acts (``moved``), and ``Session`` clears what a cycle
sets (``JobState.begin``): a kept state is then what a new one would be.
"""

from __future__ import annotations

from edl_scheduler.core.layout import Layout, layout_of
from edl_scheduler.core.session import Eligibility, JobState
from edl_scheduler.core.snapshot import Job, Node


class Derived:
    """What the planner keeps of one job: its session state (``state``, whose bounds,
    live replicas and margins are the job's alone), ``usage``, (node index, gpu, cpu,
    memory) per live replica, and ``key``, the rank key when it does not depend on
    ``now`` (else None: computed each cycle). Nothing changes one once made but ``seen``,
    the last kept ranking (``PlanMemo.cycle``) whose snapshot showed its job
    (``ranking.kept_ranking``), ``at``, its place in the snapshot the memo describes
    (``PlanMemo.order``), and its state's per-cycle fields. It goes wherever the entry
    goes (kept, parked, dropped), so a state is only ever its own job's.

    A plain class: compiled, its ``__init__`` is C, where a dataclass's is generated Python
    code (one is made for every job not seen before)."""

    __slots__ = ("at", "job", "key", "seen", "state", "usage")

    def __init__(
        self,
        job: Job,
        key: tuple[float | str, ...] | None,
        state: JobState,
        usage: tuple[tuple[int, int, int, int], ...],
    ) -> None:
        self.job = job
        self.key = key
        self.state = state
        self.usage = usage
        self.seen = 0
        #: Its place in the memo's last snapshot (``PlanMemo.order``), while it is there.
        self.at = -1


class PlanMemo:
    """Per-job derivations carried from one ``plan()`` call to the next (see the module)."""

    __slots__ = (
        "_classes",
        "_layout",
        "_nodes",
        "cycle",
        "fresh",
        "fresh_at",
        "jobs",
        "keys",
        "last",
        "moved",
        "names",
        "node_names",
        "nodes_valid",
        "order",
        "parked",
        "ranked",
        "repeated",
        "shown",
        "since",
        "skipped",
        "sorted",
        "used",
    )

    def __init__(self) -> None:
        self._nodes: tuple[Node, ...] | None = None
        #: id(job) -> what was derived from it; ``Derived.job`` keeps the job alive.
        self.jobs: dict[int, Derived] = {}
        #: Whether the bound nodes tuple passed validation.
        self.nodes_valid = False
        self.node_names: set[str] = set()
        self._layout: Layout | None = None
        self._classes: Eligibility | None = None
        #: The last cycle's jobs in rank order with their rank keys, kept so that the next
        #: cycle ranks only the jobs it has not seen (None: not kept, e.g. where a waiting
        #: job's key depends on ``now``); ``used[i]``: [gpu, cpu, memory] that the live
        #: replicas of the memo's jobs take on node i. Both always describe ``jobs``.
        self.ranked: list[tuple[tuple[float | str, ...], Derived]] | None = None
        #: The keys of ``ranked``, in its order (searched without a key function).
        self.keys: list[tuple[float | str, ...]] = []
        self.used: list[list[int]] = []
        #: The jobs the last cycle's statements touched, by rank: their kept states
        #: (``Derived.state``, so that a cycle does not build one per job) had moves, which
        #: the next cycle sets back, as it sets back every kept state's reason and flags,
        #: before it acts.
        self.moved: dict[int, JobState] = {}
        #: id(job) -> what was derived (its kept state with it) for a job that left the
        #: snapshot, taken back if the same Job object comes back (``ranking.kept_ranking``);
        #: at most four times the last snapshot's jobs, the longest parked dropped first.
        self.parked: dict[int, Derived] = {}
        #: Snapshots sorted out so far (``sort_out``); each marks the jobs it shows
        #: (``Derived.seen``), so that the ones that left are found without a set of ids.
        self.cycle = 0
        #: name -> the entry of ``jobs`` of that name: the names of a validated snapshot's
        #: jobs are distinct, so validation checks only the jobs not seen before
        #: (``validating.validate``). Kept with ``jobs``, wherever it changes.
        self.names: dict[str, Derived] = {}
        #: What the last ``sort_out`` found: the jobs tuple it sorted (None once a kept
        #: ranking has taken it), the jobs of it not held here, and whether it showed a
        #: held job twice. Validation sorts a snapshot out and the kept ranking of the
        #: same cycle takes the result: one look-up per shown job, not two.
        self.shown: tuple[Job, ...] | None = None
        self.fresh: list[Job] = []
        self.repeated = False
        #: The jobs of the snapshot that ``jobs`` describes, and their entries in its
        #: order (each entry's ``at`` its place): a sort walks them beside the new
        #: snapshot, which shows mostly the same objects in the same order, so most jobs
        #: are found by identity, without a look-up (``sort_out``).
        self.last: tuple[Job, ...] = ()
        self.order: list[Derived] = []
        #: What the last ``sort_out`` found besides ``fresh``: where in the snapshot the
        #: fresh jobs are, every job's entry in its order (None for a fresh one), and the
        #: entries of ``last`` that the walk passed over (every one that left is among them).
        self.fresh_at: list[int] = []
        self.sorted: list[Derived | None] = []
        self.skipped: list[Derived] = []
        #: How many leading jobs of the last sort kept their places in ``order``.
        self.since = 0

    def bind(self, nodes: tuple[Node, ...]) -> None:
        """Start a cycle on ``nodes``; forget everything if it is not the object the memo
        was built for."""
        if nodes is not self._nodes:
            self.forget()
            self._nodes = nodes

    def forget(self) -> None:
        """Drop everything derived, the bound nodes too: the next cycle derives every job
        afresh, as on a new memo."""
        self._nodes = None
        self.jobs = {}
        self.nodes_valid = False
        self._layout = None
        self._classes = None
        self.ranked = None
        self.keys = []
        self.used = []
        self.moved = {}
        self.parked = {}
        self.names = {}
        self.shown = None
        self.fresh = []
        self.last = ()
        self.order = []

    def layout(self, nodes: tuple[Node, ...]) -> Layout:
        """``layout_of(nodes)`` for the bound nodes, derived once."""
        if self._layout is None or nodes is not self._nodes:
            self._layout = layout_of(nodes)
            self._classes = None
        return self._layout

    def classes(self, nodes: tuple[Node, ...]) -> Eligibility:
        """The node classes each job's constraints allow on the bound nodes (cached)."""
        layout = self.layout(nodes)
        if self._classes is None:
            self._classes = Eligibility(layout)
        return self._classes

    def sort_out(self, jobs: tuple[Job, ...]) -> list[Job]:
        """The jobs of ``jobs`` not held here, in order; marks the entry of every held one
        as seen by a new cycle (``cycle``), and notes whether one was shown twice
        (``repeated``). The result is kept for the kept ranking of the same snapshot
        (``shown``, ``fresh``, ``fresh_at``, ``sorted``, ``skipped``).

        The held jobs are those of ``last``: the walk takes the entry at its place in
        ``order`` wherever the snapshot shows the very object found there, and looks a
        job up by identity only where it does not (a new job, or one after a job that
        left, from where the walk goes on at that job's place)."""
        self.cycle += 1
        cycle = self.cycle
        known = self.jobs
        prev, order = self.last, self.order
        m = len(prev)
        fresh: list[Job] = []
        fresh_at: list[int] = []
        found: list[Derived | None] = []
        skipped: list[Derived] = []
        repeated = False
        j = 0
        since = -1
        for i in range(len(jobs)):
            job = jobs[i]
            kept: Derived | None
            if j < m and prev[j] is job:
                kept = order[j]
                if j != i and since < 0:
                    since = i
                j += 1
            else:
                if since < 0:
                    since = i
                kept = known.get(id(job))  # (ids are held: an entry keeps its job alive)
                if kept is not None and kept.at >= j:
                    skipped.extend(order[j : kept.at])  # passed over: maybe gone
                    j = kept.at + 1
            found.append(kept)
            if kept is None:
                fresh.append(job)
                fresh_at.append(i)
            elif kept.seen == cycle:
                repeated = True
            else:
                kept.seen = cycle
        skipped.extend(order[j:])
        self.shown, self.fresh, self.repeated = jobs, fresh, repeated
        self.fresh_at, self.sorted, self.skipped = fresh_at, found, skipped
        self.since = len(jobs) if since < 0 else since
        return fresh

    def remember(self, jobs: tuple[Job, ...], order: list[Derived], since: int = 0) -> None:
        """``jobs`` is now the snapshot the memo describes, ``order`` its entries; the
        entries' places are written from ``since`` on (those before it did not move)."""
        self.last, self.order = jobs, order
        for i in range(since, len(order)):
            order[i].at = i

    def get(self, job: Job) -> Derived | None:
        found = self.jobs.get(id(job))
        return found if found is not None and found.job is job else None
