"""Admission: start waiting jobs as whole gangs, taking workers from others where allowed.

Invariant 2 (gang) lives here: a job starts, or a job below its minimum is restored, only
when its whole gang (``minReplicas`` workers and its parameter servers' minimum) is placed
in one statement. What it may take from others, and in which order, is ``preempting``'s
(invariant 4); admission takes those victims one at a time until the gang fits, then gives
back the ones it turns out not to need, so a plan names exactly enough of them. A job
suspended this cycle is admitted again like any waiting job of its rank, which moves it
where it fits.

Proofs outside this module rest on what it does (a waiting job that fails its trial takes,
reserves and blocks nothing but under strict FIFO; it visits jobs in rank order; its quick
reject): ``rounds_start_nothing`` here (``tests/core/test_admission_rounds.py``), which running
jobs no plan can change (``incremental.unchangeable``, ``tests/core/test_unchangeable.py``)
and the simulator's pruning (``simulations/pruning.py``; ``tests/simulations/test_pruning.py``,
``test_settled.py``). A change here that breaks them fails there.
"""

from __future__ import annotations

from typing import Final

from edl_scheduler.core.ordering import las_queue
from edl_scheduler.core.placing import gang_fits, place_gang
from edl_scheduler.core.plan import Reason, counted
from edl_scheduler.core.policy import Admission, EqualShrinking, Ordering, Policy
from edl_scheduler.core.preempting import Victim, take, victims
from edl_scheduler.core.session import JobState, Session
from edl_scheduler.core.sizing import surplus_gpus
from edl_scheduler.core.snapshot import Role
from edl_scheduler.core.stability import has_run_minimum, may_shrink_voluntarily

_W: Final = Role.WORKER
#: Sums not read yet in ``Admitter.run`` (a list, so the loop's locals keep one type).
_NONE: Final[list[int]] = []


class _Suffixes:
    """GPUs that could be taken from the job at each rank, with their suffix sums.

    Admission asks for a suffix sum at every waiting job it visits (its quick reject) and
    changes a value only when a job starts (the job and its victims: a few per plan), so
    the sums are kept in a plain list, rebuilt on the first question after a change: a
    question is one list read. ``suffix(start)`` is the sum from ``start`` to the end
    (``start`` may be the length: 0)."""

    __slots__ = ("_stale", "_sums", "_values")

    def __init__(self, values: list[int]) -> None:
        self._values = values
        self._sums: list[int] = []
        self._stale = True

    def set(self, index: int, value: int) -> None:
        if self._values[index] != value:
            self._values[index] = value
            self._stale = True

    def sums(self) -> list[int]:
        """Every suffix sum, ``sums()[i]`` from rank ``i`` on (one more entry: 0)."""
        if self._stale:
            sums = [0] * (len(self._values) + 1)
            total = 0
            for i in range(len(self._values) - 1, -1, -1):
                total += self._values[i]
                sums[i] = total
            self._sums, self._stale = sums, False
        return self._sums

    def suffix(self, start: int) -> int:
        return self.sums()[start]


def needs_of(js: JobState) -> dict[Role, int]:
    """What a job lacks to run at its minimum: its whole gang when waiting."""
    needs = {Role.WORKER: max(0, js.lo - js.size())}
    ps = js.job.pserver
    if ps is not None and js.size() + needs[Role.WORKER] > 0:
        needs[Role.PSERVER] = max(0, ps.min_replicas - js.size(Role.PSERVER))
    return needs


def _gpus(js: JobState, needs: dict[Role, int]) -> int:
    total = 0
    for role, n in needs.items():
        if n:
            total += js.resources(role).gpu * n
    return total


def waiting_message(js: JobState) -> str:
    """What a job that admission left waiting says (``Admitter.run`` notes the numbers)."""
    if js.reason is Reason.WAITING_IN_LINE:
        return f"waiting in line behind {js.behind} (strict FIFO)"
    what = "to restore its minimum" if js.reason is Reason.BELOW_MINIMUM else "for its gang"
    return (
        f"waiting: needs {counted(js.wait_gpus, 'GPU')} {what} ({counted(js.lo, 'worker')}), "
        f"{js.wait_free} free where it may run; {js.wait_ahead} waiting jobs ranked ahead"
    )


def rounds_start_nothing(policy: Policy) -> bool:
    """Whether a second admission round can start no job: where growth never runs, no
    priorities and no shrinking (preemption none or whole-job suspension).

    Why: the first round visits the jobs in rank order, and each job ``J`` it leaves
    waiting failed against the free room per node plus the room of every running job it
    could suspend (those ranked below it, not started this cycle): its trial takes them all
    before it gives up, and placement fits a gang wherever the room per node adds up.
    After ``J``'s visit only jobs ranked below ``J`` start or move, on free room or by
    suspending jobs ranked below themselves, which ``J`` could have suspended too: room
    per node that ``J`` could reach only shrinks, and holds for jobs ranked above ``J``
    do not change. Nothing runs between the rounds (no growth), so every job of the second
    round fails again, with the reason it has; only the numbers of its message (free GPUs,
    jobs ahead) may differ, so a planner that returns only the decisions that change
    (``incremental``) may leave the round out.
    """
    return policy.moves_whole_jobs_only


class Admitter:
    """Runs the admission action over the session's jobs in rank order."""

    def __init__(self, session: Session) -> None:
        self.s = session
        policy = session.policy
        self.shrink_ok = policy.shrinks
        self.suspend_ok = policy.suspends
        self.reclaim = policy.reclaims
        #: Whether equals ranked below a job are shrunk for it by a rule of their own
        #: (``preempting.equal_may_shrink``): then the shrink pool of every job is counted
        #: from the end of the job's level, and equals that ran their minimum (``paid``)
        #: apart.
        equals = policy.shrink_equal_priority
        self.below_level = self.shrink_ok and equals is not EqualShrinking.ANY
        self.by_paid = self.shrink_ok and equals is EqualShrinking.AFTER_MINIMUM_RUN
        self.by_priority = self.suspend_ok and not policy.suspends_by_rank
        #: Whether a job of the level it starts for must have run its minimum to be
        #: suspended (``may_suspend``): then those are counted apart.
        self.by_minimum = (
            self.suspend_ok and policy.suspends_by_rank and policy.suspension_min_run_s > 0
        )
        self.level_start: dict[int, int] = {}
        self.level_end: dict[int, int] = {}
        # Ranking puts each priority level in one run of ranks: only its ends are read, and
        # only by pools that tell a job's level from the others (equals that may be
        # reclaimed, shrinking or suspension by priority, equals suspended after their
        # minimum run): under other policies no level is read and none is found.
        level: int | None = None
        reads = self.reclaim or self.below_level or self.by_priority or self.by_minimum
        for js in session.jobs if reads else ():
            if js.priority != level:
                level = js.priority
                self.level_start.setdefault(level, js.rank)
                if js.rank:
                    self.level_end[session.jobs[js.rank - 1].priority] = js.rank
        if session.jobs and reads:
            self.level_end[session.jobs[-1].priority] = len(session.jobs)
        self.refresh_pools()

    def refresh_pools(self) -> None:
        """Recount what preemption could free (after growth changed the jobs' sizes). Only
        the pools the policy's preemption reads are counted (``_pool``): a policy that never
        shrinks, or never suspends, keeps that pool empty."""
        jobs = self.s.jobs
        # Zeros first: a waiting job (most of a congested cluster's) frees nothing, and is
        # passed over without a write.
        shrinkable = [0] * len(jobs) if self.shrink_ok else []
        reclaimable = [0] * len(jobs) if self.reclaim else []
        suspendable = [0] * len(jobs) if self.suspend_ok else []
        ran_minimum = [0] * len(jobs) if self.by_minimum else []
        paid = [0] * len(jobs) if self.by_paid else []
        if self.shrink_ok or self.suspend_ok:
            # ``_pools`` of each job, inlined: this runs over every job at every plan.
            session, now = self.s, self.s.now
            shrink, reclaim, suspend, by_minimum, by_paid = (
                self.shrink_ok,
                self.reclaim,
                self.suspend_ok,
                self.by_minimum,
                self.by_paid,
            )
            min_run = session.policy.suspension_min_run_s
            for rank in range(len(jobs)):
                js = jobs[rank]
                workers = js.workers
                if not workers:
                    continue
                job = js.job
                if not job.preemptible:
                    continue
                gpu = job.worker.resources.gpu
                if shrink:
                    surplus = shrinkable[rank] = surplus_gpus(workers, js.lo, gpu)
                    if reclaim and surplus and may_shrink_voluntarily(session, js):
                        reclaimable[rank] = surplus
                    if by_paid and surplus and has_run_minimum(job.start_time, now, min_run):
                        paid[rank] = surplus
                if suspend and not js.started:
                    whole = suspendable[rank] = workers * gpu
                    if by_minimum and has_run_minimum(job.start_time, now, min_run):
                        ran_minimum[rank] = whole
        self.shrinkable = _Suffixes(shrinkable)
        self.reclaimable = _Suffixes(reclaimable)
        self.suspendable = _Suffixes(suspendable)
        self.ran_minimum = _Suffixes(ran_minimum)
        self.paid = _Suffixes(paid)

    def _pools(self, js: JobState) -> tuple[int, int, int, int, int]:
        """GPUs that ``js`` could give up: shrinking for a job ranked above it, shrinking
        for an equal ranked below it (``may_shrink``), suspended whole, suspended whole for
        an equal ranked above it (``may_suspend``), and shrinking for such an equal where
        equals are shrunk only after that minimum run. 0 where the policy never asks."""
        if not js.job.preemptible:
            return 0, 0, 0, 0, 0
        session, gpu, size = self.s, js.job.worker.resources.gpu, js.size()
        shrink = surplus_gpus(size, js.lo, gpu) if self.shrink_ok else 0
        reclaim = shrink if shrink and self.reclaim and may_shrink_voluntarily(session, js) else 0
        whole = size * gpu if self.suspend_ok and not js.started else 0
        min_run = session.policy.suspension_min_run_s
        ran_minimum = has_run_minimum(js.job.start_time, session.now, min_run)
        ran = whole if whole and self.by_minimum and ran_minimum else 0
        paid = shrink if shrink and self.by_paid and ran_minimum else 0
        return shrink, reclaim, whole, ran, paid

    def _update_pools(self, js: JobState) -> None:
        shrink, reclaim, whole, ran, paid = self._pools(js)
        if self.shrink_ok:
            self.shrinkable.set(js.rank, shrink)
        if self.reclaim:
            self.reclaimable.set(js.rank, reclaim)
        if self.suspend_ok:
            self.suspendable.set(js.rank, whole)
        if self.by_minimum:
            self.ran_minimum.set(js.rank, ran)
        if self.by_paid:
            self.paid.set(js.rank, paid)

    def _pool(self, js: JobState) -> int:
        """An upper bound of the GPUs that preemption could free for ``js`` (its quick
        reject): what each job ``may_shrink`` or ``may_suspend`` allows could give up.
        Exact but for node fit: every trial it rejects would fail."""
        rank, total = js.rank, 0
        if self.shrink_ok:
            end = self.level_end[js.priority] if self.below_level else rank + 1
            total += self.shrinkable.suffix(end)
            if self.by_paid:
                total += self.paid.suffix(rank + 1) - self.paid.suffix(end)
            if self.reclaim:
                start = self.level_start[js.priority]
                total += self.reclaimable.suffix(start) - self.reclaimable.suffix(rank)
        if self.suspend_ok:
            if self.by_priority:
                total += self.suspendable.suffix(self.level_end[js.priority])
            elif self.by_minimum:
                end = self.level_end[js.priority]
                total += self.ran_minimum.suffix(rank + 1) - self.ran_minimum.suffix(end)
                total += self.suspendable.suffix(end)
            else:
                total += self.suspendable.suffix(rank + 1)
        return total

    def run(self, jobs: list[JobState] | None = None) -> int:
        """One pass over ``jobs`` (default: all) in rank order; returns how many started
        (or were restored to their minimum)."""
        blocked_by: JobState | None = None
        ahead = started = 0
        cluster = self.s.cluster
        preempts = self.shrink_ok or self.suspend_ok
        head_of_line = self.s.policy.admission is Admission.HEAD_OF_LINE
        # Every waiting job the snapshot shows is visited at every plan, and most of them
        # only meet the quick reject below: the loop reads what it needs once, in locals,
        # and asks ``_pool``'s sums without calls. Capacity never changes within a cycle;
        # the pools' sums change only when a job starts (``_started``): after any
        # ``_admit`` or ``_move`` they are asked for again.
        shrink_ok, suspend_ok = self.shrink_ok, self.suspend_ok
        reclaim, by_priority, by_minimum = self.reclaim, self.by_priority, self.by_minimum
        below_level, by_paid = self.below_level, self.by_paid
        level_start, level_end = self.level_start, self.level_end
        shrink_sums = reclaim_sums = suspend_sums = ran_sums = paid_sums = _NONE
        last_classes: frozenset[int] | None = None
        capacity = 0
        only = -1
        class_free = cluster.class_free_gpu
        for js in self.s.jobs if jobs is None else jobs:
            job = js.job
            if job.suspended:
                if js.reason is not Reason.USER_SUSPENDED:  # else it left this cycle: said so
                    js.reason, js.message = Reason.USER_SUSPENDED, "suspended by its spec"
                continue
            if js.suspended:  # this cycle, to admit a job ranked above it
                self._move(js)
                shrink_sums = reclaim_sums = suspend_sums = ran_sums = paid_sums = _NONE
                continue
            needs: dict[Role, int] | None = None
            if job.pserver is None:  # most jobs: ``needs_of`` and ``_gpus`` without calls
                if js.workers >= js.lo:
                    continue  # needs nothing
                gpus = (js.lo - js.workers) * job.worker.resources.gpu
            else:
                needs = needs_of(js)
                if not any(needs.values()):
                    continue
                gpus = _gpus(js, needs)
            if blocked_by is not None:
                # (its message is written where the plan returns its decision: ``said``)
                js.reason, js.message, js.behind = Reason.WAITING_IN_LINE, "", blocked_by.name
                continue
            classes = js.classes
            if classes is not last_classes:
                last_classes, capacity = classes, cluster.capacity_in(classes)
                # ``free_in`` of one class is its entry (kept up to date in place).
                only = next(iter(classes)) if len(classes) == 1 else -1
            if not (classes and gpus <= capacity):
                self._too_large(js, gpus)  # says why
                continue
            free = class_free[only] if only >= 0 else cluster.free_in(classes)
            # ``_admit``'s own quick reject, without the call: nothing can be tried.
            hopeless = free < gpus
            if hopeless and preempts:  # ``free + self._pool(js) < gpus``, inlined
                pool, rank = 0, js.rank
                if shrink_ok:
                    if shrink_sums is _NONE:
                        shrink_sums = self.shrinkable.sums()
                    end = level_end[js.priority] if below_level else rank + 1
                    pool += shrink_sums[end]
                    if by_paid:
                        if paid_sums is _NONE:
                            paid_sums = self.paid.sums()
                        pool += paid_sums[rank + 1] - paid_sums[end]
                    if reclaim:
                        if reclaim_sums is _NONE:
                            reclaim_sums = self.reclaimable.sums()
                        pool += reclaim_sums[level_start[js.priority]] - reclaim_sums[rank]
                if suspend_ok:
                    if suspend_sums is _NONE:
                        suspend_sums = self.suspendable.sums()
                    if by_priority:
                        pool += suspend_sums[level_end[js.priority]]
                    elif by_minimum:
                        if ran_sums is _NONE:
                            ran_sums = self.ran_minimum.sums()
                        end = level_end[js.priority]
                        pool += ran_sums[rank + 1] - ran_sums[end] + suspend_sums[end]
                    else:
                        pool += suspend_sums[rank + 1]
                hopeless = free + pool < gpus
            if not hopeless:
                admitted = self._admit(js, needs_of(js) if needs is None else needs, gpus)
                shrink_sums = reclaim_sums = suspend_sums = ran_sums = paid_sums = _NONE
                if admitted:
                    started += 1
                    continue
                free = cluster.free_in(classes)
            js.reason = Reason.BELOW_MINIMUM if js.live_w else Reason.WAITING_FOR_CAPACITY
            # The numbers of its message, written where the plan returns its decision (most
            # waiting jobs' decisions change nothing: ``waiting_message``).
            js.message = ""
            js.wait_gpus, js.wait_free, js.wait_ahead = gpus, max(0, free), ahead
            ahead += 1
            if head_of_line:
                blocked_by = js
        return started

    def _too_large(self, js: JobState, gpus: int) -> bool:
        """Whether no node ``js`` may use could ever hold its ``gpus``; says so if true."""
        capacity = self.s.cluster.capacity_in(js.classes)
        if gpus <= capacity and js.classes:
            return False
        js.reason = Reason.BELOW_MINIMUM if js.was_running else Reason.TOO_LARGE
        js.message = (
            f"cannot {'be restored' if js.was_running else 'start'}: needs "
            f"{gpus} GPUs, the nodes it may run on have {capacity} in all"
        )
        return True

    def _move(self, js: JobState) -> None:
        """A job just suspended is admitted again like any waiting job of its rank: where
        its gang fits elsewhere (on free capacity, or by taking from jobs ranked below it)
        it moves now, as it would on the very next plan anyway."""
        beneficiary = js.for_job
        needs = needs_of(js)
        gpus = _gpus(js, needs)
        if gpus > self.s.cluster.capacity_in(js.classes):
            return
        if not self._admit(js, needs, gpus):
            return
        js.suspended = False
        js.for_job = beneficiary
        js.reason = Reason.MOVED_TO_ADMIT
        js.message = js.message.replace("restored to its minimum", f"moved to admit {beneficiary},")

    def _admit(self, js: JobState, needs: dict[Role, int], gpus: int) -> bool:
        free = self.s.cluster.free_in(js.classes)
        if free >= gpus:  # else no placement can succeed: skip the search
            stmt = self.s.statement()
            if place_gang(self.s, stmt, js, needs):
                stmt.commit()
                self._started(js, [])
                return True
            stmt.discard()
        if not (self.shrink_ok or self.suspend_ok) or free + self._pool(js) < gpus:
            return False
        return self._preempt(js, needs)

    def _preempt(self, js: JobState, needs: dict[Role, int]) -> bool:
        stmt = self.s.statement()
        taken: list[Victim] = []
        target = _gpus(js, needs)
        fits = False
        for victim in victims(self.s, js, needs, self.shrink_ok, self.suspend_ok):
            take(stmt, victim)
            taken.append(victim)
            free = self.s.cluster.free_in(js.classes)
            if free >= target and gang_fits(self.s, js, needs):
                fits = True
                break
        if not fits:
            stmt.discard()
            return False
        # Give back every victim the gang turns out not to need, latest taken first. A job
        # suspended whole (taken after its workers above the minimum, so seen first here)
        # keeps none of them: given back alone they would leave it below its minimum.
        kept: list[Victim] = []
        gone: set[int] = set()  # ``id`` of the jobs suspended whole
        for victim in reversed(taken):
            if id(victim.js) in gone:
                kept.append(victim)
                continue
            for replica in victim.replicas:
                stmt.restore(victim.js, replica)
            if victim.withdrawn is not None:
                stmt.add(victim.js, Role.WORKER, victim.withdrawn)
            if gang_fits(self.s, js, needs):
                continue
            take(stmt, victim)
            kept.append(victim)
            if victim.whole:
                gone.add(id(victim.js))
        if not place_gang(self.s, stmt, js, needs):  # pragma: no cover - fits was checked
            stmt.discard()
            return False
        stmt.commit()
        self._started(js, kept)
        return True

    def _over(self, js: JobState, v: JobState) -> str:
        """Why ``js`` may take from ``v``: its higher priority, or within one priority its
        rank by the policy's ordering (for least attained service, what each attained)."""
        if js.priority > v.priority:
            return f"priority {js.job.priority} over {v.job.priority}, ranked {js.rank + 1}"
        policy, now = self.s.policy, self.s.now
        ranks = f"same priority, ranked {js.rank + 1} against {v.rank + 1}"
        if policy.ordering is Ordering.LAS_QUEUES:
            queues = f"{las_queue(js.job, policy, now)} against {las_queue(v.job, policy, now)}"
            return f"{ranks}: attained-service queue {queues}"
        if policy.ordering is Ordering.LEAST_ATTAINED:
            had = f"{js.job.attained_gpu_seconds:.0f} against {v.job.attained_gpu_seconds:.0f}"
            return f"{ranks}: {had} GPU-seconds attained"
        return ranks

    def _started(self, js: JobState, victims: list[Victim]) -> None:
        names = sorted({v.js.name for v in victims})
        for name in names:
            v = self.s.state_of(name)
            assert v is not None  # a victim is a job of the session
            whole = v.size() == 0
            v.suspended = whole
            v.reason = Reason.SUSPENDED_TO_ADMIT if whole else Reason.SHRUNK_TO_ADMIT
            v.for_job = js.name
            v.message = (
                f"{'suspended' if whole else 'shrunk'} to admit {js.name} ({self._over(js, v)})"
                + ("; it resumes when room frees above its rank" if whole else "")
            )
            self._update_pools(v)
        js.started = True
        # Placed on room held for it: its pods do not exist yet (the driver creates them
        # once the victims have gone), so the plan keeps holding that room for it, until
        # they exist or the hold expires, instead of letting it go after one plan.
        held = [h for holds in self.s.cluster.holds.values() for h in holds if h.job == js.name]
        js.reserve = bool(victims) or bool(held)
        if held and not victims:
            js.hold_expires_at = min(h.expires_at for h in held)
        for h in held:  # placed now: what it held counts as its own, not for others
            h.count = 0
        js.reason = Reason.STARTED if not js.was_running else Reason.GREW
        via = f" after taking workers from {', '.join(names)}" if names else ""
        verb = "started" if not js.was_running else "restored to its minimum"
        js.message = f"{verb} with {counted(js.size(), 'worker')}{via}"
        self._update_pools(js)
