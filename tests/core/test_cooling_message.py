"""Growth leaves the cool-down message of a job no move touched unwritten
(``growing.Grower.candidates``), and the plan writes it where it returns the decision
(``writing.said``): a full plan says it, and an incremental planner's plan of changes
carries exactly the full plan's changes, messages included, where cooling jobs are
restored, shrunk, grown around or left alone."""

from __future__ import annotations

from edl_scheduler.core import Reason, Snapshot, plan, preset
from edl_scheduler.core.incremental import IncrementalPlanner
from tests.core.builders import job, node, nodes, snapshot

EDL = preset("edl")


def _snapshots() -> list[tuple[Snapshot, float]]:
    return [
        # Restored to its minimum in its cool-down: the hold adds to the start's message.
        (snapshot(nodes(1), [job("a").min(2).max(6).running(("n0", 1)).started(at=90.0)]), 100.0),
        # The same beside an unmoved cooling job and a waiting job that starts.
        (
            snapshot(
                nodes(2),
                [
                    job("a").min(2).max(6).submitted(0).running(("n0", 1)).started(at=90.0),
                    job("c").min(1).max(4).submitted(1).running(("n1", 2)).started(at=95.0),
                    job("w").min(2).max(2).submitted(2),
                ],
            ),
            100.0,
        ),
        # A cooling job shrunk for a higher-priority arrival, another left cooling.
        (
            snapshot(
                [node("n0").gpus(4), node("n1").gpus(4)],
                [
                    job("c").min(1).max(4).submitted(0).running(("n0", 4)).started(at=95.0),
                    job("d").min(1).max(4).submitted(1).running(("n1", 2)).started(at=96.0),
                    job("h").priority(1).min(3).max(3).submitted(2),
                ],
            ),
            100.0,
        ),
        # Past the cool-down (no hold), for contrast.
        (snapshot(nodes(1), [job("a").min(2).max(6).running(("n0", 1)).started(at=0.0)]), 1e6),
    ]


def test_changes_only_plans_carry_the_full_plans_messages() -> None:
    cooling_changes = cooling_said = 0
    kept = IncrementalPlanner(EDL)
    for snap, now in _snapshots():
        full = plan(snap, EDL, now)
        for planner in (IncrementalPlanner(EDL), kept):
            got = planner.plan(snap, now)
            assert got.decisions == full.changes, (snap, now)
            assert got.reservations == full.reservations
        cooling_changes += sum(d.reason is Reason.COOLING_DOWN for d in full.changes)
        cooling = [d for d in full.decisions if d.reason is Reason.COOLING_DOWN]
        assert all("cooling down for" in d.message for d in cooling)
        cooling_said += len(cooling)
    assert cooling_changes >= 2  # the restored jobs: a cooling job's message was read
    assert cooling_said > cooling_changes  # and unmoved ones, written by the full plan
