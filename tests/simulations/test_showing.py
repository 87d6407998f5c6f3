"""The engine's one-go answers (``simulations.showing.shown_from_sides``) against ``pruning.shown``,
``pruning.settled`` and ``leaving_out.leave_out``'s own search for the best-ranked short job.

Aspects:
- on every snapshot the ``60_job.csv`` simulations plan on (every preset and the LAS
  variants, ticks and event-driven), at the snapshot's free GPUs and at others, with its
  reservations and one more: ``shown_from_sides`` shows the jobs ``shown`` shows (same Jobs, live
  counts and keys, same order), answers ``settled`` as it does over them (and False where
  not asked), and finds the best-ranked shown job below its size that ``leave_out`` finds; it
  answers None exactly where a premise fails (strict FIFO, a policy hiding does not serve,
  a running job that may not be preempted);
- in the engine (hiding on), every instant's ``shown_from_sides`` equals those answers, with the
  records, timeline and plan count of the engine without hiding; its sweep fallback is
  reached (low queue thresholds, ``tiresias-pollux``);
- a running job short of its size, ranked above the waiting ones, is ``leave_out``'s best.
Seen to fail with ``reach`` taken as ``pool`` whatever the best-ranked short job, and with
a running job short of its size left out of ``leave_out``'s best.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from edl_scheduler.core import Admission, Job, Policy, Reservation, Role, Snapshot, preset
from edl_scheduler.core.incremental.unchangeable import applies
from edl_scheduler.core.ordering import sort_key
from simulations import engine as engine_module
from simulations import showing
from simulations.engine import Engine, simulate
from simulations.showing import (
    Collected,
    Running,
    Shown,
    Waiting,
    entries,
    shown_from_all,
    shown_from_sides,
)
from tests.core.builders import job, node, snapshot
from tests.simulations.recording import recorded
from tests.simulations.test_settled import CLUSTER, CONFIGS, POLICIES, _free, _jobs

Key = tuple[float | str, ...]
TIRESIAS = preset("tiresias")


def _live(job: Job) -> int:
    return sum(1 for r in job.replicas if r.role is Role.WORKER and not r.draining)


def _best_short(jobs: list[Job], live: list[int], keys: list[Key], policy: Policy) -> Key | None:
    """``leave_out``'s rule, plainly: the least key of a job with no worker or below its
    size."""
    found = [
        k
        for j, n, k in zip(jobs, live, keys, strict=True)
        if n == 0 or n < (j.worker.min_replicas if policy.elastic else j.rigid_size)
    ]
    return min(found) if found else None


def _serves(policy: Policy) -> bool:
    return applies(policy) and policy.admission is not Admission.HEAD_OF_LINE


def _check(
    c: Collected,
    policy: Policy,
    now: float,
    free: int,
    holds: tuple[Reservation, ...],
    swept: list[int],
) -> Shown | None:
    """``shown_from_sides`` against the reference answers, asked with and without ``settled``;
    ``swept`` counts the calls to ``settled`` (``shown_from_sides``'s fallback)."""
    found = None
    for ask in (True, False):
        before = len(swept)
        running, waiting = entries(c, policy.elastic)
        got = shown_from_sides(
            running, waiting, c.top_waiting, policy, now, free, holds, ask_settled=ask
        )
        swept[0] += len(swept) > before
        if got is None:
            assert not _serves(policy) or any(not c.jobs[i].preemptible for i in c.running)
            return None
        want = shown_from_all(c.jobs, c.live, c.keys, policy, now, free, holds, True, ask)
        assert (got.jobs, got.live, got.keys) == (want.jobs, want.live, want.keys), (now, free)
        assert got.settled == want.settled, (now, free, ask)
        assert got.best == (_best_short(got.jobs, got.live, got.keys, policy),), (now, free)
        found = got if ask else found
    return found


def _rebuilt(running: list[Running], waiting: list[Waiting]) -> Collected:
    """The Collected whose entries these are (arrival order by index)."""
    rows = sorted(
        [(i, j, n, k) for i, j, n, k in running] + [(w.index, w.job, 0, w.key) for w in waiting]
    )
    jobs = [r[1] for r in rows]
    live = [r[2] for r in rows]
    keys = [r[3] for r in rows]
    top = min((r[3] for r in rows if not r[2]), default=None)
    return Collected(
        jobs,
        live,
        keys,
        [i for i, n in enumerate(live) if n],
        [i for i, n in enumerate(live) if not n],
        top,
    )


def _collected(snap: Snapshot, policy: Policy, now: float) -> Collected:
    jobs = list(snap.jobs)
    key = sort_key(policy, now)
    live, keys = [_live(j) for j in jobs], [key(j) for j in jobs]
    running = [i for i, n in enumerate(live) if n]
    waiting = [i for i, n in enumerate(live) if not n]
    top = min((keys[i] for i in waiting), default=None)
    return Collected(jobs, live, keys, running, waiting, top)


@pytest.mark.parametrize("config", sorted(CONFIGS))
@pytest.mark.parametrize("name", sorted(POLICIES))
def test_shown_from_sides_equals_the_three_rules_on_every_snapshot(
    name: str, config: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    policy = POLICIES[name]
    unpruned = replace(CONFIGS[config], prune=False)
    sequence = recorded(monkeypatch, lambda: simulate(_jobs(policy), CLUSTER, policy, unpruned))
    assert sequence
    answered = settles = 0
    swept = [
        0
    ]  # [shown_from_sides's calls that reached the sweep, then one entry per settled call]
    real = showing.settled

    def counting(*args: object, **kw: object) -> bool:
        swept.append(0)
        return real(*args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(showing, "settled", counting)
    for snap, now in sequence:
        c = _collected(snap, policy, now)
        holds: list[tuple[Reservation, ...]] = [snap.reservations]
        if snap.jobs:
            extra = Reservation(snap.jobs[-1].name, snap.nodes[0].name, Role.WORKER, 1, 1e9)
            holds.append((*snap.reservations, extra))
        base = _free(snap)
        for free in (base, base + 3, 0, -1):
            for reservations in holds:
                got = _check(c, policy, now, free, reservations, swept)
                answered += got is not None
                settles += got is not None and got.settled
    monkeypatch.undo()
    if _serves(policy):
        assert answered > 0 and settles > 0
        if name in ("low-thresholds", "tiresias-pollux"):  # (others decide early)
            assert swept[0] > 0
    else:
        assert answered == 0


@pytest.mark.parametrize("config", sorted(CONFIGS))
@pytest.mark.parametrize("name", sorted(n for n, p in POLICIES.items() if _serves(p)))
def test_the_engine_shows_as_the_rules_do(
    name: str, config: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    policy, cfg = POLICIES[name], replace(CONFIGS[config], hide=True)
    seen: list[Shown] = []
    real_shown = showing.shown_from_sides

    def checked(
        running: list[Running],
        waiting: list[Waiting],
        top: Key | None,
        pol: Policy,
        now: float,
        free: int,
        holds: tuple[Reservation, ...],
        **kw: bool,
    ) -> Shown | None:
        got = real_shown(running, waiting, top, pol, now, free, holds, **kw)
        c = _rebuilt(running, waiting)
        assert top == c.top_waiting
        want = shown_from_all(
            c.jobs, c.live, c.keys, pol, now, free, holds, True, kw["ask_settled"]
        )
        assert got is not None
        assert (got.jobs, got.live, got.keys, got.settled) == (
            want.jobs,
            want.live,
            want.keys,
            want.settled,
        )
        assert got.best == (_best_short(got.jobs, got.live, got.keys, pol),)
        seen.append(got)
        return got

    monkeypatch.setattr(engine_module, "shown_from_sides", checked)
    engine = Engine(_jobs(policy), CLUSTER, policy, cfg)
    fast = engine.run()
    monkeypatch.undo()
    reference = simulate(_jobs(policy), CLUSTER, policy, CONFIGS[config])
    assert fast.jobs == reference.jobs and fast.timeline == reference.timeline
    assert fast.plans == reference.plans
    if name != "starving":  # (its rank keys are not kept: nothing is hidden)
        assert seen and any(v.settled for v in seen) and any(not v.settled for v in seen)


def test_a_running_job_short_of_its_size_is_the_best_short_job() -> None:
    # "s" runs 2 of its 4 workers in queue 0 and ranks above the waiting "w".
    snap = snapshot(
        [node("n0").gpus(4), node("n1").gpus(4)],
        [
            job("r").min(2).max(2).attained(9000).running(("n1", 2)),
            job("s").min(4).max(4).requested(4).running(("n0", 2)),
            job("w").min(1).max(1).submitted(20),
        ],
    )
    for policy in (TIRESIAS, preset("fifo-backfill")):
        c = _collected(snap, policy, 100.0)
        for free in (0, 2, 4):
            got = _check(c, policy, 100.0, free, (), [0])
            assert got is not None
            s_key = c.keys[1]
            assert got.best == (s_key,)
