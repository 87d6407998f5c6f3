"""The planner's model of a job that adapts its batch (``throughput.BatchedSteps``): where
the job's efficiency carries the bounds it adapts within, a size's goodput is that of the
batch the job would choose there now, from a step time fitted as a function of the batch.

Aspects:
- the fit recovers the step-time terms the samples were made from (compute per micro-batch
  and per sample, synchronization on one node and across nodes);
- a size measured early, at a small batch whose synchronization dominated, is predicted
  faster now than that measurement weighed by today's efficiency says (the job would take
  a larger batch there), and faster than the smaller size it retreated to: the fixed-batch
  model says the opposite;
- without the bounds, or with a measured sample that lacks its batch, the model is the
  goodput model of a fixed batch, as before;
- bounds that cannot be right are refused with the field named.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from edl_gradients.goodput import BatchLimits, choosing
from edl_scheduler.core import Action, Job, ThroughputSample, plan, preset
from edl_scheduler.core.snapshot import Efficiency
from edl_scheduler.core.throughput import BatchedSteps, _goodput_fit, _step_fit, job_model
from tests.core.builders import job, nodes, snapshot

LIMITS = BatchLimits(init_batch=64, max_batch=4096, max_local=128)
#: fixed, per sample, sync on one node (alpha, beta), across nodes (alpha, beta): seconds.
TRUE = (0.02, 0.001, 0.01, 0.001, 0.2, 0.01)
#: Early in training: little gradient noise, a larger batch is worth little more.
EARLY = Efficiency(64, 1.0, 2.0, LIMITS.max_batch, LIMITS.max_local)
#: Later: much noise, a larger batch is worth almost its size.
LATE = Efficiency(64, 1.0, 400.0, LIMITS.max_batch, LIMITS.max_local)


def sample(nodes: int, workers: int, batch: int) -> ThroughputSample:
    """What a runtime measures at ``batch`` under the true step times."""
    truth = BatchedSteps(TRUE, LIMITS, EARLY)
    per_gpu = batch / workers
    accumulation = max(1, -(-int(per_gpu) // LIMITS.max_local))
    seconds = truth.step_time(nodes, workers, per_gpu / accumulation, accumulation)
    return ThroughputSample(nodes, workers, batch / seconds, batch)


def measured_early(efficiency: Efficiency | None) -> Job:
    """A job back at 4 workers on one node, which measured 1, 2 and 4 on one node and 8
    on two nodes early in training, each at the batch it chose then (small)."""
    built = job("a").min(1).max(16).running(("n0", 4)).build()
    samples = (sample(1, 1, 64), sample(1, 4, 128), sample(2, 8, 128), sample(1, 2, 96))
    return replace(built, throughput=samples, efficiency=efficiency)


def test_the_fit_recovers_the_step_times() -> None:
    samples = tuple(
        sample(on, workers, batch)
        for on, workers in ((1, 1), (1, 2), (1, 4), (2, 8), (4, 16))
        for batch in (64, 256, 1024)
    )
    params = _step_fit(samples, LIMITS)
    assert params is not None
    fitted, truth = BatchedSteps(params, LIMITS, LATE), BatchedSteps(TRUE, LIMITS, LATE)
    for at in ((1, 1, 64, 1), (1, 4, 100, 2), (4, 16, 128, 1)):
        assert fitted.step_time(*at) == pytest.approx(truth.step_time(*at), rel=0.05)


def test_a_size_is_worth_the_batch_the_job_would_choose_there_now() -> None:
    batched = job_model(measured_early(LATE))
    assert batched.batched is not None
    assert batched.batched.limits == LIMITS
    fixed = _goodput_fit(measured_early(LATE).throughput, replace(LATE, max_batch=0, max_local=0))
    # The fixed-batch model reads the 8-on-2-nodes sample as slower than 4 on one node...
    assert fixed.throughput(2, 8) < fixed.throughput(1, 4)
    # ...the batched one knows the job would take a larger batch there now, amortizing the
    # synchronization across nodes, and predicts it faster: what the true step times say.
    assert batched.throughput(2, 8) > batched.throughput(1, 4)
    truth = BatchedSteps(TRUE, LIMITS, LATE)
    assert truth.goodput(2, 8) > truth.goodput(1, 4)
    # (within a fifth: four samples at three batches pin the terms down only so far)
    assert batched.throughput(2, 8) == pytest.approx(truth.goodput(2, 8), rel=0.2)
    # Its throughput is the goodput of the job's own rule's choice.
    chosen = choosing(
        LIMITS,
        8,
        lambda local, acc: batched.batched.step_time(2, 8, local, acc),  # type: ignore[union-attr]
        LATE.gain,
    )
    assert batched.throughput(2, 8) == chosen.goodput


def test_the_planner_grows_the_job_back_across_nodes_where_it_now_pays() -> None:
    """Alone on four 4-GPU nodes, past its cool-down: by the batched model the job grows
    onto a second node; by the fixed-batch model of the same samples it stays."""
    plain = replace(LATE, max_batch=0, max_local=0)
    for efficiency, grows in ((LATE, True), (plain, False)):
        alone = replace(snapshot(nodes(4), []), jobs=(measured_early(efficiency),))
        decision = plan(alone, preset("edl"), 1000.0).decision("a")
        assert (decision.action is Action.GROW) is grows, decision.message


def test_early_in_training_the_larger_batch_is_worth_less() -> None:
    early, late = job_model(measured_early(EARLY)), job_model(measured_early(LATE))
    assert early.speedup(4, 16) < late.speedup(4, 16)


def test_without_bounds_or_batches_the_model_is_the_fixed_batch_one() -> None:
    plain = replace(LATE, max_batch=0, max_local=0)
    j = measured_early(plain)
    assert job_model(j) == _goodput_fit(j.throughput, plain)
    assert job_model(j).batched is None
    unbatched = (*measured_early(LATE).throughput, ThroughputSample(1, 3, 500.0))
    k = replace(measured_early(LATE), throughput=unbatched)
    assert _step_fit(unbatched, LIMITS) is None
    assert job_model(k) == _goodput_fit(unbatched, LATE)


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"max_batch": 1024}, "efficiency.max_local"),
        ({"max_local": 32}, "efficiency.max_batch"),
        ({"max_batch": 32, "max_local": 32}, "max_batch (32) is below init_batch (64)"),
        ({"max_batch": 1024, "max_local": 32, "min_local": 64}, "min_local"),
    ],
)
def test_bounds_that_cannot_be_right_are_refused(fields: dict[str, int], named: str) -> None:
    with pytest.raises(ValueError, match=r"efficiency") as raised:
        Efficiency(64, 1.0, 2.0, **fields)
    assert named in str(raised.value)
