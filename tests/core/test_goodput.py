"""The planner's goodput model: measured throughput weighed by the job's statistical
efficiency now (``snapshot.Efficiency``, ``throughput.job_model``).

Aspects:
- the gain of a batch: 1 at the initial batch, between 1 and the batch's scale above it,
  nearer the scale as gradient noise dominates;
- without an efficiency (or a sample's batch) the model is the throughput model;
- at a fixed batch, efficiency cancels out of every speed-up;
- with adapted batches, a size measured at a larger batch counts less than its samples per
  second, and more as training goes on (the noise grows): the same samples, told a later
  efficiency, predict more from growth, with no sample measured again;
- the planner decides by it (the speed-ups its decisions state are the goodput model's);
- an efficiency that cannot be right is refused with the field named.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from edl_scheduler.core import Action, Job, ThroughputSample, plan, preset
from edl_scheduler.core.snapshot import Efficiency
from edl_scheduler.core.throughput import fit, goodput, job_model
from tests.core.builders import job, nodes, snapshot

EARLY = Efficiency(init_batch=64, grad_sqr=1.0, grad_var=4.0)  # little noise: big batches waste
LATE = Efficiency(init_batch=64, grad_sqr=1.0, grad_var=400.0)  # much noise: big batches pay


def test_gain_of_a_batch() -> None:
    assert EARLY.gain(64) == pytest.approx(1.0)
    for eff in (EARLY, LATE):
        assert 1.0 < eff.gain(256) < 4.0
    assert LATE.gain(256) > EARLY.gain(256)


def adapted(efficiency: Efficiency | None, name: str = "a") -> Job:
    """A job running 4 workers that grew its batch with its workers (64 per worker): its
    samples per second scale linearly, its progress per second by the batches' gain."""
    built = job(name).min(1).max(8).running(("n0", 4)).build()
    samples = tuple(ThroughputSample(1, w, 100.0 * w, 64 * w) for w in (1, 2, 4))
    return replace(built, throughput=samples, efficiency=efficiency)


def test_without_efficiency_the_model_is_the_throughput_model() -> None:
    j = adapted(None)
    assert job_model(j) == fit(j.throughput)
    unbatched = ThroughputSample(1, 2, 150.0)
    assert goodput(unbatched, EARLY) == unbatched


def test_at_a_fixed_batch_efficiency_cancels_out() -> None:
    samples = (ThroughputSample(1, 1, 100.0, 256), ThroughputSample(1, 4, 300.0, 256))
    plain, weighed = fit(samples), fit(tuple(goodput(s, EARLY) for s in samples))
    assert weighed.speedup(1, 4) == pytest.approx(plain.speedup(1, 4))


def test_larger_batches_count_by_their_efficiency_now() -> None:
    early, late = job_model(adapted(EARLY)), job_model(adapted(LATE))
    plain = job_model(adapted(None))
    assert early.speedup(1, 4) < late.speedup(1, 4) < plain.speedup(1, 4)
    assert early.speedup(1, 4) == pytest.approx(EARLY.gain(256), rel=0.05)


def test_the_planner_predicts_by_goodput() -> None:
    """Grown into idle GPUs, the job's decision states the speed-up of its goodput model."""
    for eff in (EARLY, LATE):
        alone = replace(snapshot(nodes(1), []), jobs=(adapted(eff),))
        grew = plan(alone, preset("edl"), 1000.0).decision("a")
        model = job_model(adapted(eff))
        assert grew.action is Action.GROW
        assert f"{model.speedup(1, 4):.2f}x -> {model.speedup(1, 8):.2f}x" in grew.message


def test_an_impossible_efficiency_is_refused() -> None:
    with pytest.raises(ValueError, match="init_batch"):
        Efficiency(0, 1.0, 1.0)
    with pytest.raises(ValueError, match="grad_sqr"):
        Efficiency(64, -1.0, 1.0)
    with pytest.raises(ValueError, match="grad_sqr"):
        Efficiency(64, 0.0, 0.0)
