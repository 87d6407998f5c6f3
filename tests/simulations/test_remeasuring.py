"""What the simulator reports as a profiled job's measured throughput.

Aspects:
- the sample at a running job's current size (samples per second at its batch) and its
  efficiency follow the job now: a Pollux-workload job's progress rate changes at epoch
  boundaries (statistical efficiency), and the goodput the planner derives from the two is
  the new rate at the next plan, as the coordinator's measurements reach the status;
- a plan is made when a running job enters a new epoch (the controller, which plans every
  cycle, would see the change), even where nothing else happens.
"""

from __future__ import annotations

import pytest

from edl_scheduler.core import Snapshot, preset
from edl_scheduler.core.throughput import goodput
from simulations.engine import SimConfig, simulate
from simulations.profiles import ProfileSpeed, load_application
from simulations.traces import default_traces
from simulations.workload import ClusterSpec, SimJob
from tests.simulations.recording import watch

PROFILES = default_traces() / "pollux" / "traces"
ROUNDS = SimConfig(tick_s=60.0, plan_on_events=False, resize_pause_s=30.0, start_delay_s=30.0)


def test_the_current_size_is_measured_again_as_the_epoch_changes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    bert = load_application(PROFILES, "bert")
    speed = ProfileSpeed(bert, 48)
    seen: list[tuple[float, float]] = []

    def recording(snapshot: Snapshot, now: float) -> None:
        for job in snapshot.jobs:
            seen.extend(
                (now, goodput(s, job.efficiency).samples_per_second)
                for s in job.throughput
                if s.workers == 4
            )

    watch(monkeypatch, recording)
    job = SimJob("b", 0.0, 4, 0.0, 4, 4, profile=speed)
    result = simulate([job], ClusterSpec(1, 4), preset("fifo-gang"), ROUNDS)
    end = result.jobs[0].end
    assert end is not None
    first_epoch = bert.curves[bert.init_batch].progress[0]
    rates = (speed.rate((4,), 0.0), speed.rate((4,), first_epoch))
    assert rates[0] != rates[1]
    # The epoch ends at 30 s (start) + first_epoch / rates[0]; plans after it see rates[1].
    boundary = 30.0 + first_epoch / rates[0]
    before = [r for t, r in seen if t < boundary]
    after = [r for t, r in seen if t > boundary + 1.0]
    assert after, "no plan after the epoch changed the job's speed"
    assert before == pytest.approx([rates[0]] * len(before))
    assert after == pytest.approx([rates[1]] * len(after))


def test_a_running_job_reports_the_samples_it_has_left(monkeypatch: pytest.MonkeyPatch) -> None:
    """As its runtime's ledger would (``SnapshotJobs.remaining``): the samples left fall as
    the job runs (plans come at its epochs' ends here), and a job without a profile, whose
    duration is a trace's and not what its user declared, reports nothing."""
    bert = load_application(PROFILES, "bert")
    seen: list[tuple[float, str, float | None, float]] = []

    def recording(snapshot: Snapshot, now: float) -> None:
        for job in snapshot.jobs:
            if job.replicas:
                rate = max(s.samples_per_second for s in job.throughput if s.workers == 4)
                seen.append((now, job.name, job.remaining_samples, rate))

    watch(monkeypatch, recording)
    profiled = SimJob("b", 0.0, 4, 0.0, 4, 4, profile=ProfileSpeed(bert, 48))
    plain = SimJob("p", 0.0, 4, 3000.0, 4, 4)
    simulate([profiled, plain], ClusterSpec(2, 4), preset("fifo-gang"), ROUNDS)
    assert all(left is None for _, name, left, _ in seen if name == "p")
    lefts = [(t, left, rate) for t, name, left, rate in seen if name == "b"]
    assert len(lefts) >= 2 and all(left is not None and left > 0 for _, left, _ in lefts)
    values = [left for _, left, _ in lefts]
    assert values == sorted(values, reverse=True) and values[-1] < values[0]
