"""Jobs that leave the snapshot and come back as the same Job object take back what the memo
derived from them (``incremental.memo.PlanMemo.parked``, ``incremental.ranking``).

Aspects:
- the engine with hiding (which leaves running jobs out and shows them again) gives the
  same records, timeline and plan count with parking as without it (``USE_PARKED`` off),
  under every preset and the LAS variants (low thresholds with demotions, a starvation
  limit, a least-attained ranking), ticks and event-driven; where jobs are hidden, some
  come back and are taken back;
- on the recorded snapshots of those runs, replayed in a shuffled order through one
  incremental planner, every plan equals the changes of ``plan()`` (jobs leave and come back at
  random there, and a job's Job object changes while it is away).
Seen to fail with a parked entry taken back by the job's name instead of its Job object.
"""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from edl_scheduler.core import plan
from edl_scheduler.core.incremental import IncrementalPlanner
from edl_scheduler.core.incremental import planner as planner_module
from edl_scheduler.core.incremental import ranking as ranking_module
from edl_scheduler.core.incremental.unchangeable import applies
from edl_scheduler.core.ordering import key_varies
from simulations.engine import Engine, simulate
from tests.simulations.recording import recorded
from tests.simulations.test_settled import CLUSTER, CONFIGS, POLICIES, _jobs


@pytest.mark.parametrize("config", sorted(CONFIGS))
@pytest.mark.parametrize("name", sorted(POLICIES))
def test_parking_changes_no_result(name: str, config: str, monkeypatch: pytest.MonkeyPatch) -> None:
    policy, cfg = POLICIES[name], replace(CONFIGS[config], hide=True)
    derived = [0]
    real = planner_module._derive

    def counting(*args: object) -> object:
        derived[0] += 1
        return real(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(planner_module, "_derive", counting)
    engine = Engine(_jobs(policy), CLUSTER, policy, cfg)
    fast = engine.run()
    with_parking = derived[0]
    monkeypatch.setattr(ranking_module, "USE_PARKED", False)
    reference = simulate(_jobs(policy), CLUSTER, policy, cfg)
    assert fast.jobs == reference.jobs
    assert fast.timeline == reference.timeline
    assert fast.plans == reference.plans
    if engine.leaves_out:  # jobs left out came back and were taken back, not derived again
        assert with_parking <= derived[0] - with_parking
        if name in ("low-thresholds", "tiresias-pollux"):  # (LAS with demotions)
            assert with_parking < derived[0] - with_parking


@pytest.mark.parametrize("name", sorted(n for n, p in POLICIES.items() if applies(p)))
def test_shuffled_snapshots_with_parking_plan_as_without_a_memo(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    policy = POLICIES[name]
    sequence = recorded(
        monkeypatch,
        lambda: simulate(_jobs(policy), CLUSTER, policy, replace(CONFIGS["events"], hide=True)),
    )
    assert sequence
    random.Random(7).shuffle(sequence)
    planner = IncrementalPlanner(policy)
    back = 0
    for snap, now in sequence[:400]:
        before = dict(planner.memo.parked)
        got = planner.plan(snap, now)
        back += sum(1 for j in snap.jobs if id(j) in before and before[id(j)].job is j)
        want = plan(snap, policy, now)
        assert got.decisions == want.changes, now
        assert got.reservations == want.reservations, now
    assert back > 0 or key_varies(policy)  # jobs came back and were taken back
