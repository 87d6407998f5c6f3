"""The adaptive batch policy: each job trains at the batch that makes it progress fastest
(goodput), re-chosen as its gradient noise and its step times are measured.

```
policy = AdaptiveBatch(initial_batch=128, max_batch=4096, max_local=256, base_lr=0.1)
```
At every generation's formation, and then each time its gradient-noise estimate has news
while the generation trains, rank 0 asks the one decision rule
(`edl_gradients.goodput.choosing`) for the per-GPU batch and the accumulation steps that
maximize throughput times statistical efficiency, from this job's own measurements: the
step times it ran at (as measured between measured batches, fitted by
`edl_gradients.goodput.fitting` elsewhere: `MeasuredSteps`) and its gradient noise
(`trainer_runtime.noise`, with |G|^2 taken one standard error up: `usable`). The
learning rate follows the global batch by `lr` (`LrScaling`): AdaScale by default (the
rate is multiplied by the gain of the batch, Johnson et al., ICML'20), or the square-root
or linear rule; every change of the rate is ramped over `warmup_steps` and compensated in
the momentum, and the optimizer's state is kept.

How every rank agrees: the decision made at a formation travels with rank 0's state
(`shared_state`); one made inside a generation travels with the step's vote on leaving
(`Decision.carried`: three numbers every rank sums, rank 0's the only ones not 0), and
every rank adopts it at the boundary after that step, before it cuts the next window. So
every rank of a generation runs the same batch and the same rate at every step, and a
changed batch is only a differently sized step window: the ledger commits windows, not
batches, so exactly-once holds whatever the batch does.

Until the job has measured its noise (which needs two ranks) on `MIN_NOISE_STEPS` steps,
and a step time, it trains at its initial batch, split over the workers. Then a decision
moves the global batch by at most `MAX_CHANGE` either way, and one inside a generation is
adopted only when it predicts at least `min_speedup` more goodput, or moves AdaScale's rate
as much: noise in the estimate neither swings the batch nor the rate far, and a job whose
estimate holds grows its batch step by step, measuring each.

What must stay true: the batch and rate are a pure function of the shared state and the
world size; only rank 0 decides (`deciding`, `proposing`) and measures (`observing`);
every rank adopts the same `Decision` at the same step; a framework's subclass says only
how its optimizer's rate is read and set and its momentum rescaled.
"""

from __future__ import annotations

import abc
import dataclasses
import enum
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Generic

from edl_gradients.goodput import (
    BatchLimits,
    MeasuredSteps,
    StepMeasure,
    choosing,
    fitting,
    gain,
    shaping,
)
from trainer_runtime.batching import OptimizerT, ramped_lr, setting_lr
from trainer_runtime.noise import NoiseEstimate

#: When rank 0 may re-decide inside a generation: once the noise estimate rests on this
#: many more measured steps than at the last decision (its news: a step-count, so a fast
#: job re-decides in seconds and a slow one in minutes), the batch in force was timed this
#: often, and at least `DECIDE_EVERY_S` after the last; the predicted gain it takes.
NOISE_STEPS_PER_DECISION = 32
TIMED_STEPS = 4
DECIDE_EVERY_S = 2.0
MIN_SPEEDUP = 1.05
#: Noise resting on fewer measured steps, or with no signal left (|G|^2 = 0, which makes
#: every batch look free), is not used.
MIN_NOISE_STEPS = 32
#: One decision changes the global batch by at most this factor either way.
MAX_CHANGE = 2.0
#: Step-time measurements kept (one per shape: workers, per-GPU batch, accumulation).
MEASURES_KEPT = 32
#: The weight of a new step time in its shape's smoothed time.
STEP_SMOOTHING = 0.1
#: Numbers a decision takes in a step's vote (`Decision.carried`).
CARRIED = 3


class LrScaling(enum.Enum):
    """How the learning rate follows the global batch ``B`` (``init`` the initial batch)."""

    ADASCALE = "adascale"  # base_lr * gain(B): the progress a step at B makes
    SQRT = "sqrt"  # base_lr * sqrt(B / init)
    LINEAR = "linear"  # base_lr * B / init


@dataclass(frozen=True, slots=True)
class Decision:
    """A per-GPU batch, its accumulation steps and the factor on the base learning rate."""

    local: int
    accumulation: int
    lr_factor: float

    def carried(self) -> tuple[float, float, float]:
        """The decision as the numbers a step's vote sums (every other rank sends 0s)."""
        return (float(self.local), float(self.accumulation), self.lr_factor)

    @staticmethod
    def read(values: Sequence[float]) -> Decision | None:
        """The decision a step's vote carried, or None (no rank proposed one)."""
        local, accumulation, factor = (float(v) for v in values[:CARRIED])
        if local < 1 or accumulation < 1 or not factor > 0:
            return None
        return Decision(round(local), round(accumulation), factor)


@dataclass(slots=True)
class AdaptiveBatch(abc.ABC, Generic[OptimizerT]):
    """The batch that maximizes goodput, within ``[initial_batch, max_batch]`` globally
    and ``max_local`` per GPU at once (see the module docstring)."""

    initial_batch: int
    max_batch: int
    max_local: int
    base_lr: float
    lr: LrScaling = LrScaling.ADASCALE
    min_local: int = 1
    warmup_steps: int = 0
    momentum_compensation: bool = True
    decide_every_s: float = DECIDE_EVERY_S
    min_speedup: float = MIN_SPEEDUP
    # shared by every rank (`shared_state`)
    _decision: Decision | None = field(default=None, init=False)
    _workers: int = field(default=0, init=False)  # the world `_decision` is for
    _target_lr: float = field(default=0.0, init=False)
    _from_lr: float = field(default=0.0, init=False)
    _since_change: int = field(default=0, init=False)
    _progress: float = field(default=0.0, init=False)
    _measures: dict[tuple[int, int, int], float] = field(default_factory=dict, init=False)
    # derived once: the bounds, and the initial batch's shape at each world size (every
    # step asks for the decision in force: a hot path)
    _limits: BatchLimits = field(init=False, repr=False)
    _initial: dict[int, Decision] = field(default_factory=dict, init=False, repr=False)
    # the decision every rank adopted last, and its world: what one decision may move 2x
    _basis: tuple[Decision | None, int] = field(default=(None, 0), init=False, repr=False)
    # rank 0's own: when it last decided, on how many measured noise steps, and how many
    # steps it timed at the batch in force since
    _decided_at: float = field(default=-math.inf, init=False)
    _noise_steps: int = field(default=0, init=False)
    _timed: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        self._limits = BatchLimits(
            self.initial_batch, self.max_batch, self.max_local, self.min_local
        )
        if not self.base_lr > 0:
            raise ValueError(f"AdaptiveBatch.base_lr is {self.base_lr}: it must be > 0")
        if self.warmup_steps < 0:
            raise ValueError("AdaptiveBatch.warmup_steps cannot be negative")
        if self.min_speedup < 1:
            raise ValueError("AdaptiveBatch.min_speedup must be >= 1 (1.05: 5% more goodput)")

    @abc.abstractmethod
    def read_lr(self, optimizer: OptimizerT) -> float: ...

    @abc.abstractmethod
    def set_lr(self, optimizer: OptimizerT, lr: float) -> None: ...

    @abc.abstractmethod
    def rescale_momentum(self, optimizer: OptimizerT, factor: float) -> None: ...

    @property
    def limits(self) -> BatchLimits:
        return self._limits

    # ----- what every rank reads -----

    def decision(self, world_size: int) -> Decision:
        """The decision in force at `world_size` (the initial batch before any)."""
        if self._decision is not None and self._workers == world_size:
            return self._decision
        return self.initial(world_size)

    def initial(self, world_size: int) -> Decision:
        """The initial batch split over `world_size` workers, at its rate."""
        initial = self._initial.get(world_size)
        if initial is None:
            local, accumulation = shaping(self.initial_batch / world_size, self.limits)
            factor = self.lr_factor(local * accumulation * world_size)
            initial = self._initial[world_size] = Decision(local, accumulation, factor)
        return initial

    def global_batch(self, world_size: int) -> int:
        chosen = self.decision(world_size)
        return chosen.local * chosen.accumulation * world_size

    def accumulation(self, world_size: int) -> int:
        return self.decision(world_size).accumulation

    def lr_factor(self, batch: int, noise: NoiseEstimate | None = None) -> float:
        """The factor on `base_lr` at global batch `batch` by `lr`; AdaScale's is 1 until
        the noise is measured."""
        if self.lr is LrScaling.SQRT:
            return math.sqrt(batch / self.initial_batch)
        if self.lr is LrScaling.LINEAR:
            return batch / self.initial_batch
        if noise is None:
            return 1.0
        return gain(noise.init_batch, noise.grad_sqr, noise.grad_var, batch)

    def adjusting(self, optimizer: OptimizerT, world_size: int) -> None:
        """Before every optimizer step: the rate of the decision in force, ramped."""
        old_lr = self.read_lr(optimizer)
        target = self.base_lr * self.decision(world_size).lr_factor
        if target != self._target_lr:
            self._from_lr = old_lr if self._target_lr else target
            self._target_lr, self._since_change = target, 0
        new_lr = ramped_lr(self._from_lr, target, self._since_change, self.warmup_steps)
        self._since_change += 1
        self._progress += self.worth(world_size)
        setting_lr(self, optimizer, old_lr, new_lr, self.momentum_compensation)

    @property
    def progress(self) -> float:
        """The steps at the initial batch the job's steps so far were worth: AdaScale's
        scale-invariant iterations (a job that trains to a loss its fixed-batch run
        reached after N steps gets there at progress N, at whatever batch)."""
        return self._progress

    def worth(self, world_size: int) -> float:
        """What one step of the decision in force adds to `progress`: AdaScale's gain
        (its rate factor); under the square-root or linear rule, which measure no gain,
        the batch over the initial one."""
        chosen = self.decision(world_size)
        if self.lr is LrScaling.ADASCALE:
            return chosen.lr_factor
        return chosen.local * chosen.accumulation * world_size / self.initial_batch

    def adopting_decision(self, decision: Decision) -> None:
        """Every rank, at the same step boundary: take the decision a step's vote carried
        (for the world the current one is for)."""
        self._decision, self._timed = decision, 0
        self._basis = (decision, self._workers)

    # ----- rank 0 -----

    def observing(self, world_size: int, seconds: float) -> None:
        """A step at the decision in force took `seconds` (rank 0 measures)."""
        if not seconds > 0:
            return
        chosen = self.decision(world_size)
        key = (world_size, chosen.local, chosen.accumulation)
        before = self._measures.pop(key, None)
        smoothed = seconds if before is None else before + STEP_SMOOTHING * (seconds - before)
        self._measures[key] = smoothed  # the newest last
        while len(self._measures) > MEASURES_KEPT:
            del self._measures[next(iter(self._measures))]
        self._timed += 1

    def deciding(self, world_size: int, noise: NoiseEstimate | None, now: float) -> Decision:
        """Rank 0, as a generation forms: decide for its size (sent with the state)."""
        self._decision, self._workers = self.best(world_size, noise), world_size
        self.decided(now, usable(noise))
        return self._decision

    def decided(self, now: float, noise: NoiseEstimate | None) -> None:
        """Start the wait for the next re-decision (see `proposing`)."""
        self._decided_at, self._timed = now, 0
        self._noise_steps = noise.steps if noise is not None else 0

    def proposing(
        self, world_size: int, noise: NoiseEstimate | None, now: float
    ) -> Decision | None:
        """Rank 0, at a step boundary: a new decision worth adopting, or None. One is
        looked for only once the noise estimate rests on `NOISE_STEPS_PER_DECISION` more
        measured steps than at the last decision, the batch in force was timed
        `TIMED_STEPS` times, and `decide_every_s` passed; it is taken only if it predicts
        `min_speedup` more goodput (or moves AdaScale's rate as much)."""
        informed = usable(noise)
        if (
            informed is None
            or now - self._decided_at < self.decide_every_s
            or informed.steps < self._noise_steps + NOISE_STEPS_PER_DECISION
            or self._timed < TIMED_STEPS
        ):
            return None
        self.decided(now, informed)
        current = self.decision(world_size)
        best = self.best(world_size, noise)  # (it makes the estimate cautious itself)
        if (best.local, best.accumulation) == (current.local, current.accumulation):
            moved = abs(math.log(best.lr_factor / current.lr_factor))
            return best if moved >= math.log(self.min_speedup) else None
        model = self.step_model()
        if model is None:
            return None
        before = self.goodput(model, informed, world_size, current)
        after = self.goodput(model, informed, world_size, best)
        return best if after >= self.min_speedup * before else None

    def best(self, world_size: int, noise: NoiseEstimate | None, bounded: bool = True) -> Decision:
        """The decision with the most goodput at `world_size` by this job's measurements,
        within a factor `MAX_CHANGE` of the global batch every rank adopted last (the
        initial batch before any), so that one noisy estimate cannot swing the batch, and
        the rate, far; the initial batch where the job has measured no usable noise or no
        step yet. Not `bounded`: the rule's own choice (what the simulator models)."""
        informed, model = usable(noise), self.step_model()
        if informed is None or model is None:
            return self.initial(world_size)
        # the basis is what every rank adopted: a failed formation's decision, made
        # again for its retry, does not move the bound
        before, workers = self._basis
        if before is None or workers <= 0:
            before, workers = self.initial(world_size), world_size
        in_force = before.local * before.accumulation * workers
        within = (in_force / MAX_CHANGE, in_force * MAX_CHANGE) if bounded else None
        also = [(before.local, before.accumulation)] if workers == world_size else []
        choice = choosing(
            self.limits,
            world_size,
            lambda local, steps: model.step_time(world_size, local, steps),
            lambda batch: gain(informed.init_batch, informed.grad_sqr, informed.grad_var, batch),
            also,
            within,
        )
        return Decision(
            choice.local, choice.accumulation, self.lr_factor(choice.global_batch, informed)
        )

    def step_model(self) -> MeasuredSteps | None:
        """Step times as this job measured them, fitted between and beyond; None before
        the first measured step."""
        measured = self.measured()
        fitted = fitting(measured)
        return None if fitted is None else MeasuredSteps(fitted, tuple(measured))

    def predicted_goodput(self, world_size: int, noise: NoiseEstimate | None) -> float:
        """The goodput the decision in force at `world_size` should give, by this job's
        step times and its noise as it decides by (`usable`); 0 until both are measured."""
        informed, model = usable(noise), self.step_model()
        if informed is None or model is None:
            return 0.0
        return self.goodput(model, informed, world_size, self.decision(world_size))

    def goodput(
        self, model: MeasuredSteps, noise: NoiseEstimate, world_size: int, chosen: Decision
    ) -> float:
        """Predicted samples per second at the initial batch's efficiency."""
        seconds = model.step_time(world_size, chosen.local, chosen.accumulation)
        batch = chosen.local * chosen.accumulation * world_size
        worth = gain(noise.init_batch, noise.grad_sqr, noise.grad_var, batch)
        return noise.init_batch * worth / seconds if seconds > 0 else 0.0

    def measured(self) -> list[StepMeasure]:
        return [StepMeasure(w, local, steps, s) for (w, local, steps), s in self._measures.items()]

    # ----- shared state -----

    def shared_state(self) -> dict[str, Any]:
        chosen = self._decision
        return {
            "decision": None if chosen is None else list(chosen.carried()),
            "workers": self._workers,
            "target_lr": self._target_lr,
            "from_lr": self._from_lr,
            "since_change": self._since_change,
            "progress": self._progress,
            "measures": [[*key, seconds] for key, seconds in self._measures.items()],
        }

    def adopting(self, state: dict[str, Any]) -> None:
        if "measures" not in state:  # none, or another policy's (a checkpoint of it)
            return
        carried = state.get("decision")
        self._decision = None if carried is None else Decision.read(carried)
        self._workers = int(state["workers"])
        self._target_lr = float(state["target_lr"])
        self._from_lr = float(state["from_lr"])
        self._since_change = int(state["since_change"])
        self._progress = float(state.get("progress", 0.0))
        self._basis = (self._decision, self._workers)
        self._measures = {
            (int(w), int(local), int(steps)): float(s) for w, local, steps, s in state["measures"]
        }


def usable(noise: NoiseEstimate | None) -> NoiseEstimate | None:
    """The estimate to decide by, once it rests on `MIN_NOISE_STEPS` measured steps and
    still shows a gradient (|G|^2 > 0): with |G|^2 one standard error higher than
    measured. An |G|^2 too low makes a larger batch look as good as its size (the gain
    near the scale) and AdaScale's rate near the linear rule's; one standard error up
    leans the other way, toward the batch and rate of less noise, by as much as the
    estimate is unsure (measured: a |G|^2 of 36 steps six times below its offline value)."""
    if noise is None or noise.steps < MIN_NOISE_STEPS or not noise.grad_sqr > 0:
        return None
    return dataclasses.replace(noise, grad_sqr=noise.grad_sqr + noise.sqr_error)
