"""The engine tells the planner how often each job's allocation changed (``Job.resizes``).

Aspects, on the hand-computed scenarios of ``test_engine``: a start is not a resize; a
shrink and a grow count one each, from the plan after they were made; a preemption counts
(so its restart is charged), and the count the planner saw last equals the job's record.
"""

from __future__ import annotations

import pytest

from edl_scheduler.core import preset
from simulations.engine import SimConfig, simulate
from simulations.workload import LINEAR, ClusterSpec, SimJob
from tests.simulations.recording import watch
from tests.simulations.test_engine import TRUSTING_EQUALS

NO_COSTS = SimConfig(tick_s=0.0, resize_pause_s=0.0, restart_pause_s=0.0, start_delay_s=0.0)

#: (time, job, resizes) for every job in every snapshot the planner was given.
Seen = list[tuple[float, str, int]]


@pytest.fixture
def seen(monkeypatch: pytest.MonkeyPatch) -> Seen:
    log: Seen = []
    watch(monkeypatch, lambda snap, now: log.extend((now, j.name, j.resizes) for j in snap.jobs))
    return log


def counts(seen: Seen, name: str) -> list[tuple[float, int]]:
    """The job's count at each plan, one entry per change of the count."""
    out: list[tuple[float, int]] = []
    for now, job, n in seen:
        if job == name and (not out or out[-1][1] != n):
            out.append((now, n))
    return out


def test_a_shrink_and_a_grow_count_one_each(seen: Seen) -> None:
    # As in test_engine (``edl`` shrinking equals, growing on the prior's word): a starts at
    # 4 workers, is shrunk to admit b at 300; b grows at 600.
    # c (one GPU for 10 s, arriving at 400, and d at 900) makes the planner look again.
    jobs = [
        SimJob("a", 0, 2, 1000, 1, 4, LINEAR),
        SimJob("b", 100, 2, 1000, 1, 4, LINEAR),
        SimJob("c", 400, 1, 10, 1, 1, LINEAR),
        SimJob("d", 900, 1, 10, 1, 1, LINEAR),
    ]
    config = SimConfig(tick_s=60.0, resize_pause_s=10.0, restart_pause_s=30.0)
    result = simulate(jobs, ClusterSpec(1, 4), TRUSTING_EQUALS, config)
    # a's shrink at 300 is seen at the next plan (c's arrival); b grew at 600 (seen at d's
    # arrival, 900), was shrunk there for d and is seen again when d ends.
    assert counts(seen, "a") == [(0, 0), (400, 1)]
    assert counts(seen, "b") == [(100, 0), (900, 1), (910, 2)]
    assert all(n == 0 for _, job, n in seen if job in ("c", "d"))
    assert [r.resizes for r in result.jobs][:1] == [1]


def test_a_preemption_counts_so_the_restart_is_charged(seen: Seen) -> None:
    # As in test_engine: long is suspended at 3250 for short and resumes at 3350.
    jobs = [SimJob("long", 0, 1, 10_000, 1, 1, LINEAR), SimJob("short", 1000, 1, 100, 1, 1, LINEAR)]
    result = simulate(jobs, ClusterSpec(1, 1), preset("tiresias"), NO_COSTS)
    assert counts(seen, "long") == [(0, 0), (3350, 1)]
    assert result.jobs[0].preemptions == 1
    assert all(n == 0 for _, job, n in seen if job == "short")
