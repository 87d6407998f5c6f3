"""An incremental planner leaves out the second admission round where it can start nothing
(``admitting.rounds_start_nothing``: no growth, no priorities, preemption none or whole-job
suspension): it returns only changes, and that round could only restate reasons.

Aspects:
- on generated snapshots (rigid and elastic jobs, priorities, jobs suspended by their spec,
  holds carried over), under every preset and ``edl`` shrinking equals, the incremental
  plan's decisions and reservations are the full plan's changes and reservations; the full
  plan runs every round;
- the premise is needed: where growth runs, a later round may start a job (a snapshot
  found by a search of generated ones under ``edl`` when it shrank equals); there the
  incremental planner runs it.
  Seen to fail with the rounds left out under every policy.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from edl_scheduler.core import (
    PRESETS,
    Job,
    Node,
    Replica,
    Resources,
    Role,
    RoleSpec,
    Snapshot,
    plan,
)
from edl_scheduler.core.admitting import Admitter, rounds_start_nothing
from edl_scheduler.core.incremental import IncrementalPlanner
from edl_scheduler.core.session import JobState
from tests.core.strategies import NOW, SHRINKING_EQUALS, snapshots

CASES = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.mark.parametrize("name", [*sorted(PRESETS), SHRINKING_EQUALS.name])
@CASES
@given(data=st.data())
def test_incremental_plans_equal_the_full_plans_changes(name: str, data: st.DataObject) -> None:
    policy = PRESETS.get(name, SHRINKING_EQUALS)
    snap: Snapshot = data.draw(
        snapshots(rigid=not policy.elastic, priorities=st.integers(0, 2)), label="snapshot"
    )
    full = plan(snap, policy, NOW)
    quick = IncrementalPlanner(policy).plan(snap, NOW)
    assert quick.decisions == full.changes
    assert quick.reservations == full.reservations


def _grown_then_started() -> Snapshot:
    """Found by a search of generated snapshots with the rounds left out under every
    policy: j0 (below its minimum, one worker draining) is restored and grows, and only a
    later round starts j1."""
    mem = 1 << 30
    nodes = tuple(
        Node(name, Resources(gpu, 8000, 32 * mem), schedulable=ok)
        for name, gpu, ok in (("n0", 5, True), ("n1", 5, True), ("n2", 1, False))
    )
    j0 = Job(
        name="j0",
        worker=RoleSpec(2, 3, Resources(2, 500, mem)),
        submit_time=19_700.0,
        start_time=19_700.0,
        replicas=(
            Replica("j0-w0", Role.WORKER, "n0"),
            Replica("j0-w1", Role.WORKER, "n0", draining=True),
        ),
    )
    j1 = Job(
        name="j1",
        worker=RoleSpec(2, 2, Resources(3, 500, mem)),
        submit_time=20_000.0,
        preemptible=False,
        pserver=RoleSpec(0, 1, Resources(0, 1000, 4 * mem)),
    )
    return Snapshot(nodes, (j0, j1))


def test_where_growth_runs_a_later_round_may_start_a_job(monkeypatch: pytest.MonkeyPatch) -> None:
    policy, snap = SHRINKING_EQUALS, _grown_then_started()
    later: list[int] = []
    real = Admitter.run

    def counting(self: Admitter, jobs: list[JobState] | None = None) -> int:
        started = real(self, jobs)
        if jobs is not None:
            later.append(started)
        return started

    monkeypatch.setattr(Admitter, "run", counting)
    full = plan(snap, policy, NOW)
    assert any(later)  # a later round started a job
    quick = IncrementalPlanner(policy).plan(snap, NOW)
    assert quick.decisions == full.changes
    assert "j1" in {d.job for d in full.changes}


def test_the_rule_holds_only_where_growth_never_runs() -> None:
    assert rounds_start_nothing(PRESETS["tiresias"])
    assert rounds_start_nothing(PRESETS["fifo-gang"])
    assert not rounds_start_nothing(PRESETS["edl"])
