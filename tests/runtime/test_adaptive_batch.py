"""The adaptive batch policy and the one decision rule it shares with the simulator.

Aspects:
- the candidates stay within the job's bounds (global batch, micro-batch per GPU);
- the rule takes the batch of the most goodput: the initial batch where a bigger batch only
  costs, a bigger one where a step's fixed cost or its sync dominates and the noise is small;
- the step-time fit recovers a model from its measurements;
- the policy trains at its initial batch until it has measured noise (enough of it, with a
  signal) and a step, then at the rule's choice, at most twice or half the batch in force;
  a re-decision waits for news of the noise and a timed batch, and takes only a material
  gain;
- the rate follows AdaScale (the gain of the batch), or the square-root or linear rule,
  ramped and momentum-compensated; a newcomer adopting rank 0's state runs the same rate;
- a decision survives the float32 vote that carries it;
- the simulator's model of adaptation and the runtime's policy, given the same measured
  Pollux profile, choose the same batch.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from edl_gradients.goodput import (
    BatchLimits,
    StepMeasure,
    StepTimes,
    candidates,
    choosing,
    fitting,
    gain,
)
from simulations.profiles import ProfileSpeed, load_application
from simulations.traces import default_traces
from trainer_runtime.adaptive import Decision, LrScaling
from trainer_runtime.noise import NoiseEstimate
from trainer_runtime.torch import AdaptiveBatch

LIMITS = BatchLimits(init_batch=64, max_batch=4096, max_local=256, min_local=8)
PROFILES = default_traces() / "pollux" / "traces"


def test_candidates_stay_within_the_bounds() -> None:
    for workers in (1, 2, 3, 7, 16):
        pairs = candidates(LIMITS, workers)
        batches = [local * steps * workers for local, steps in pairs]
        assert batches == sorted(batches) and len(set(pairs)) == len(pairs)
        assert batches[0] >= LIMITS.init_batch and batches[-1] <= LIMITS.max_batch
        assert all(LIMITS.min_local <= local <= LIMITS.max_local for local, _ in pairs)
        assert batches[-1] > LIMITS.max_batch * 0.9  # the grid reaches the top
    with pytest.raises(ValueError, match="max_batch"):
        BatchLimits(init_batch=64, max_batch=32, max_local=16)


def test_a_batch_that_only_costs_is_not_taken_and_one_that_pays_is() -> None:
    noisy = (1.0, 100.0)  # sqr, var: gain grows almost as the batch
    quiet = (1.0, 0.01)  # a bigger batch is worth almost nothing more
    proportional = StepTimes(fixed=0.0, per_sample=0.001, alpha=0.0, beta=0.0)
    overhead = StepTimes(fixed=1.0, per_sample=0.0001, alpha=0.5, beta=0.0)

    def decide(model: StepTimes, stats: tuple[float, float]) -> int:
        choice = choosing(
            LIMITS,
            4,
            lambda local, steps: model.step_time(4, local, steps),
            lambda batch: gain(LIMITS.init_batch, *stats, batch),
        )
        return choice.global_batch

    assert decide(proportional, quiet) == LIMITS.init_batch  # time grows, worth does not
    assert decide(overhead, noisy) > 1000  # each step costs ~1.5 s whatever its size
    assert decide(overhead, quiet) < decide(overhead, noisy)


def test_the_step_time_fit_recovers_its_model() -> None:
    truth = StepTimes(fixed=0.02, per_sample=0.001, alpha=0.03, beta=0.004)
    shapes = [(1, 32, 1), (1, 64, 1), (2, 64, 1), (4, 128, 2), (4, 32, 1), (8, 64, 1)]
    measures = [StepMeasure(w, b, k, truth.step_time(w, b, k)) for w, b, k in shapes]
    model = fitting(measures)
    assert model is not None
    for w, b, k in [(4, 256, 1), (8, 128, 3), (1, 16, 1)]:
        assert model.step_time(w, b, k) == pytest.approx(truth.step_time(w, b, k), rel=0.05)
    assert fitting([]) is None


def optimizer(lr: float = 0.1) -> torch.optim.SGD:
    return torch.optim.SGD(nn.Linear(3, 1).parameters(), lr=lr, momentum=0.9)


def noise(sqr: float, var: float, init_batch: int = 64) -> NoiseEstimate:
    return NoiseEstimate(init_batch, sqr, var, steps=100)


def policy(**options: object) -> AdaptiveBatch:
    values: dict[str, object] = {
        "initial_batch": 64,
        "max_batch": 4096,
        "max_local": 256,
        "base_lr": 0.1,
        "min_local": 8,
    }
    values.update(options)
    return AdaptiveBatch(**values)  # type: ignore[arg-type]


def measuring(p: AdaptiveBatch, world: int, model: StepTimes, *locals_: int) -> None:
    """Feed rank 0's step times, as a session does: at the decision in force, then at
    each of `locals_` per GPU (as if the job had run there) and back."""
    before = p.decision(world)
    for local in (before.local, *locals_):
        p._decision, p._workers = Decision(local, 1, before.lr_factor), world
        for _ in range(5):
            p.observing(world, model.step_time(world, local, 1))
    p._decision = before


def timing(p: AdaptiveBatch, world: int, model: StepTimes, steps: int = 4) -> None:
    """Rank 0 times `steps` steps at the decision in force."""
    chosen = p.decision(world)
    for _ in range(steps):
        p.observing(world, model.step_time(world, chosen.local, chosen.accumulation))


def test_the_policy_starts_at_its_initial_batch_and_decides_by_the_rule() -> None:
    p = policy()
    assert p.global_batch(4) == 64 and p.accumulation(4) == 1
    overhead = StepTimes(fixed=1.0, per_sample=0.0001, alpha=0.5, beta=0.0)
    quiet = noise(1.0, 50.0)
    assert p.deciding(4, quiet, now=0.0) == p.decision(4)
    assert p.global_batch(4) == 64  # no step measured yet
    measuring(p, 4, overhead, 64)
    decided = p.deciding(4, quiet, now=1.0)
    model = fitting(p.measured())
    assert model is not None
    expected = choosing(
        p.limits,
        4,
        lambda local, steps: model.step_time(4, local, steps),
        lambda batch: gain(64, 1.0, 50.0, batch),
        [(16, 1)],
        within=(32, 128),  # at most twice the batch in force, or half
    )
    assert (decided.local, decided.accumulation) == (expected.local, expected.accumulation)
    assert p.global_batch(4) == expected.global_batch == 128
    assert decided.lr_factor == pytest.approx(gain(64, 1.0, 50.0, expected.global_batch))
    # another size: the decision in force is for 4 workers, so 2 start at the initial batch
    assert p.global_batch(2) == 64


def test_a_re_decision_waits_for_news_and_needs_a_material_gain() -> None:
    p = policy(decide_every_s=2.0)
    overhead = StepTimes(fixed=1.0, per_sample=0.0001, alpha=0.5, beta=0.0)
    measuring(p, 4, overhead, 64)
    p.deciding(4, noise(1.0, 50.0), now=0.0)  # 64 -> 128
    p.adopting(p.shared_state())  # every rank takes it with the state, rank 0 too
    assert p.global_batch(4) == 128
    louder = NoiseEstimate(64, 1.0, 5000.0, steps=100)  # far noisier: a bigger batch pays
    timing(p, 4, overhead)
    assert p.proposing(4, louder, now=10.0) is None  # no news: as many noise steps as before
    news = NoiseEstimate(64, 1.0, 5000.0, steps=140)
    assert p.proposing(4, news, now=1.0) is None  # too soon
    p._timed = 0
    assert p.proposing(4, news, now=10.0) is None  # the batch in force not timed yet
    timing(p, 4, overhead)
    proposal = p.proposing(4, news, now=10.0)
    assert proposal is not None
    assert proposal.local * proposal.accumulation * 4 == 256  # at most twice, each time
    assert p.global_batch(4) == 128  # not adopted until every rank does, at a boundary
    p.adopting_decision(proposal)
    assert p.decision(4) == proposal
    timing(p, 4, overhead)
    again = p.proposing(4, NoiseEstimate(64, 1.0, 5000.0, steps=180), now=20.0)
    assert again is not None and again.local * again.accumulation * 4 == 512
    p.adopting_decision(again)
    # at the rule's own choice for this noise, the same noise again changes nothing
    p.adopting_decision(p.best(4, NoiseEstimate(64, 1.0, 5000.0, steps=220), bounded=False))
    timing(p, 4, overhead)
    assert p.proposing(4, NoiseEstimate(64, 1.0, 5000.0, steps=260), now=40.0) is None


def test_noise_on_few_steps_or_without_signal_is_not_used() -> None:
    p = policy()
    overhead = StepTimes(fixed=1.0, per_sample=0.0001, alpha=0.5, beta=0.0)
    measuring(p, 4, overhead, 64)
    few = NoiseEstimate(64, 1.0, 5000.0, steps=8)
    flat = NoiseEstimate(64, 0.0, 5000.0, steps=400)  # |G|^2 = 0: every batch looks free
    assert p.deciding(4, few, now=0.0) == p.deciding(4, flat, now=0.0) == p.decision(4)
    assert p.global_batch(4) == 64
    timing(p, 4, overhead)
    assert p.proposing(4, flat, now=10.0) is None
    proposal = p.proposing(4, NoiseEstimate(64, 1.0, 5000.0, steps=40), now=10.0)
    assert proposal is not None and proposal.local * proposal.accumulation * 4 == 128


@pytest.mark.parametrize(
    ("scaling", "factor"),
    [
        (LrScaling.ADASCALE, lambda b: gain(64, 1.0, 50.0, b)),
        (LrScaling.SQRT, lambda b: math.sqrt(b / 64)),
        (LrScaling.LINEAR, lambda b: b / 64),
    ],
)
def test_the_rate_follows_the_batch_by_its_rule(scaling: LrScaling, factor: object) -> None:
    p = policy(lr=scaling)
    overhead = StepTimes(fixed=1.0, per_sample=0.0001, alpha=0.5, beta=0.0)
    measuring(p, 4, overhead)
    chosen = p.deciding(4, noise(1.0, 50.0), now=0.0)
    opt = optimizer()
    p.adjusting(opt, 4)
    batch = chosen.local * chosen.accumulation * 4
    assert opt.param_groups[0]["lr"] == pytest.approx(0.1 * factor(batch))  # type: ignore[operator]


def test_a_changed_rate_is_ramped_compensated_and_the_same_on_a_newcomer() -> None:
    p = policy(warmup_steps=4)
    opt = optimizer()
    p.adjusting(opt, 4)  # the first rate: at once
    assert opt.param_groups[0]["lr"] == pytest.approx(0.1)
    for parameter in opt.param_groups[0]["params"]:
        parameter.grad = torch.ones_like(parameter)
    opt.step()
    buffer = next(iter(opt.state.values()))["momentum_buffer"].clone()
    p.adopting_decision(Decision(64, 2, 3.0))
    p._workers = 4  # the decision is for this generation's size
    p.adjusting(opt, 4)
    first = opt.param_groups[0]["lr"]
    assert first == pytest.approx(0.1 + (0.3 - 0.1) / 4)
    moved = next(iter(opt.state.values()))["momentum_buffer"]
    assert torch.allclose(moved * first, buffer * 0.1)
    newcomer = policy(warmup_steps=4)
    newcomer.adopting(p.shared_state())
    other = optimizer(lr=first)
    rates = []
    for _ in range(4):
        p.adjusting(opt, 4)
        newcomer.adjusting(other, 4)
        rates.append((opt.param_groups[0]["lr"], other.param_groups[0]["lr"]))
    assert all(a == b for a, b in rates)
    assert rates[-1][0] == pytest.approx(0.3)


def test_a_decision_survives_the_float32_vote() -> None:
    decision = Decision(96, 3, 2.718281828)
    carried = torch.tensor([0.0, *decision.carried()], dtype=torch.float32)
    summed = carried + torch.zeros_like(carried)  # the other ranks add 0
    read = Decision.read(summed[1:].tolist())
    assert read is not None and (read.local, read.accumulation) == (96, 3)
    assert read.lr_factor == pytest.approx(decision.lr_factor, rel=1e-6)
    assert Decision.read([0.0, 0.0, 0.0]) is None


@pytest.mark.parametrize("name", ["cifar10", "imagenet", "bert"])
def test_the_simulator_and_the_runtime_choose_the_same_batch(name: str) -> None:
    """Drive the runtime's policy with what a job of a measured Pollux profile would
    measure (its step times at a few batches on 4 GPUs of one node, its noise at the
    initial batch at epoch 0) and compare its choice with the simulator's."""
    app = load_application(PROFILES, name)
    placement = (4,)
    speed = ProfileSpeed(app, 0, adapt=True)
    simulated = speed.measured(placement, 0.0)[1]  # the global batch the simulator runs
    p = policy(
        initial_batch=app.init_batch,
        max_batch=app.max_batch,
        max_local=app.max_local,
        min_local=app.min_local,
    )
    sqr, var = app.grad_stats(simulated, 0)
    start = max(app.min_local, app.init_batch // 4)  # the initial batch, then larger ones,
    shapes = {(min(k * start, app.max_local), 1) for k in (1, 2, 4)}  # and one accumulated
    for local, steps in sorted(shapes | {(app.max_local, 2)}):
        p.adopting_decision(Decision(local, steps, 1.0))
        p._workers = 4
        for _ in range(3):
            p.observing(4, app.accumulated_time(placement, local, steps))
    # the rule's own choice, free of the bound on one decision's change
    chosen = p.best(4, NoiseEstimate(app.init_batch, sqr, var, 100), bounded=False)
    runtime = chosen.local * chosen.accumulation * 4
    # The same batch, as far as goodput tells batches apart: the simulator reads the
    # profile's step time and gradient statistics at every batch, the runtime its own
    # measurements (and its fit between them) and one noise estimate, so where goodput is
    # flat near its peak they may settle a few grid steps apart (bert at 4 GPUs: 240
    # against 384, 1.5% apart by the profile). By the profile, the runtime's choice is
    # within 2% of the simulator's; where the peak is sharp, the batches are close too.
    step = (app.max_batch / app.init_batch) ** (1 / 49)
    assert simulated / step**8 <= runtime <= simulated * step**8, (simulated, runtime)

    def truth(local: int, steps: int) -> float:
        seconds = app.accumulated_time(placement, local, steps)
        return app.gain(local * steps * 4, 0) / seconds

    sim_local, sim_steps = speed_choice(speed, placement)
    assert truth(chosen.local, chosen.accumulation) >= 0.98 * truth(sim_local, sim_steps)


def speed_choice(speed: ProfileSpeed, placement: tuple[int, ...]) -> tuple[int, int]:
    """The simulator's (per-GPU micro-batch, accumulation) at `placement`, epoch 0."""
    per_gpu = speed.measured(placement, 0.0)[1] / sum(placement)
    steps = max(1, math.ceil(per_gpu / speed.app.max_local))
    return round(per_gpu / steps), steps


def test_another_policys_state_is_not_taken_and_a_failed_formation_moves_no_bound() -> None:
    p = policy()
    p.adopting({"world_size": 4, "from_lr": 0.1, "since_resize": 3})  # a ScaleBatch's
    p.adopting({})  # a KeepGlobalBatch's
    assert p.global_batch(4) == 64
    overhead = StepTimes(fixed=1.0, per_sample=0.0001, alpha=0.5, beta=0.0)
    measuring(p, 4, overhead, 64)
    loud = NoiseEstimate(64, 1.0, 5000.0, steps=100)
    first = p.deciding(4, loud, now=0.0)
    again = p.deciding(4, loud, now=1.0)  # the first formation failed: decided anew
    assert first == again  # still at most 2x the batch every rank adopted (64)
    assert first.local * first.accumulation * 4 == 128


def test_the_noise_estimate_knows_its_standard_error() -> None:
    """Identical steps: no error; scattered steps: the error of their mean (n equal
    weights, as the smoothing nearly is over a few steps at theta near 1)."""
    from trainer_runtime.noise import NoiseEstimator, NoiseSample

    def sample(global_sqr: float) -> NoiseSample:  # two ranks, 8 samples each: B = 16
        return NoiseSample(local_sqr=2 * 3.0, inverse_batch=2 / 8, ranks=2,
                           global_sqr=global_sqr, batch=16)  # fmt: skip

    steady = NoiseEstimator(16, smoothing=0.999999)
    for _ in range(10):
        steady.observing(sample(2.0))
    estimate = steady.estimate()
    assert estimate is not None and estimate.sqr_error == pytest.approx(0.0, abs=1e-9)
    scattered = NoiseEstimator(16, smoothing=0.999999)
    values = [1.5, 2.5] * 10
    sqrs = []
    for value in values:
        scattered.observing(sample(value))
        unbiased = sample(value).unbiased()
        assert unbiased is not None
        sqrs.append(unbiased[0])
    estimate = scattered.estimate()
    assert estimate is not None
    mean = sum(sqrs) / len(sqrs)
    spread = sum((v - mean) ** 2 for v in sqrs) / len(sqrs)
    assert estimate.sqr_error == pytest.approx(math.sqrt(spread / len(sqrs)), rel=1e-3)


def test_measured_step_times_are_read_between_measurements() -> None:
    from edl_gradients.goodput import MeasuredSteps

    model = StepTimes(fixed=0.0, per_sample=0.01, alpha=0.1, beta=0.0)
    measures = (StepMeasure(4, 32, 1, 0.5), StepMeasure(4, 64, 1, 0.6))
    steps = MeasuredSteps(model, measures)
    assert steps.step_time(4, 32, 1) == pytest.approx(0.5)  # as measured
    assert steps.step_time(4, 48, 1) == pytest.approx(0.55)  # between: interpolated
    # accumulation adds the compute share (the time less the model's sync) per micro-batch
    assert steps.step_time(4, 48, 3) == pytest.approx(0.55 + 2 * (0.55 - 0.1))
    assert steps.step_time(4, 128, 1) == pytest.approx(model.step_time(4, 128, 1))  # beyond
    assert steps.step_time(2, 48, 1) == pytest.approx(model.step_time(2, 48, 1))  # elsewhere
