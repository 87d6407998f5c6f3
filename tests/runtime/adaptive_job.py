"""A worker that trains a small classifier to a validation loss, under a fixed or an
adaptive batch (run as a script): the worker of `test_adaptive_convergence.py` and of
`benchmarks/adaptive_batch.py`.

The problem (`problem`): inputs drawn from a normal distribution, labels from a fixed random
linear teacher, a share of them replaced by a uniformly random class (label noise, so that
the gradient noise stays real near the optimum and a larger batch is worth less than
proportionally); a held-out validation set of the same distribution. Every worker makes the
same data from `--seed`. The model (`classifier`): a float32 MLP, SGD with momentum.

`--policy fixed` trains at `KeepGlobalBatch(--global-batch)` with rate `--lr`;
`--policy adaptive` at `AdaptiveBatch(initial_batch=--global-batch, max_batch, max_local,
base_lr=--lr)` with the policy's defaults (`--decide-every-s` only when given).

Rank 0 keeps the run's clock (`Recorder`): training time from its first step, less the time
it spends evaluating; every `--eval-every` samples trained it evaluates the validation loss
and appends a JSON line to `--trace` (`{"event": "eval", ...}`); it also appends one line
whenever the batch in force changes (`"decision"`: world size, global batch, accumulation,
lr factor, rate, noise estimate), the first time the loss is at most `--target-loss`
(`"reached"`), and at the end (`"end"`, with the mean step time at each shape). With
`--save-decisions`, each informed decision of an adaptive batch also saves the model as it
was then (`<out>/decision-<n>.pt`, with the decision and the estimate it came from), and
the model soon after the job's first noise-measured step (`<out>/first-noise.pt`).

What must stay true: evaluation time is not training time (nor a step time the policy
measures: the session's step clock is moved past it); the recorder only reads the session,
it never changes what is trained; `--start-file` holds a worker (torch imported, data made)
until the driver creates that file, so that starting it costs the running job nothing.

Only rank 0 records, and the runs that use this keep the first worker rank 0 throughout
(later workers join after it and leave before it).
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import torch
from torch import nn
from torch.utils.data import TensorDataset

if not __package__:  # run as a script: the repository's root is where `tests` is found
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.runtime.elastic_job import arguments
from trainer_runtime.adaptive import Decision
from trainer_runtime.noise import NoiseEstimate
from trainer_runtime.torch import AdaptiveBatch, ElasticSession, KeepGlobalBatch, session
from trainer_runtime.torch.batching import BatchPolicy

DIMS = 16
CLASSES = 8
LABEL_NOISE = 0.3
VALIDATION = 4096
WIDTH = 64
MOMENTUM = 0.9
MAX_LOCAL = 256  # an adaptive batch's micro-batch, unless `--max-local` says otherwise


@dataclass(frozen=True)
class Problem:
    train: TensorDataset
    val_inputs: torch.Tensor
    val_targets: torch.Tensor


def labelled(count: int, teacher: torch.Tensor, generator: torch.Generator) -> TensorDataset:
    """`count` samples of the teacher's problem, `LABEL_NOISE` of their labels random."""
    inputs = torch.randn(count, DIMS, generator=generator)
    targets = (inputs @ teacher).argmax(dim=1)
    noisy = torch.rand(count, generator=generator) < LABEL_NOISE
    random = torch.randint(0, CLASSES, (count,), generator=generator)
    return TensorDataset(inputs, torch.where(noisy, random, targets))


def problem(samples: int, seed: int) -> Problem:
    """The training set of `samples` and the validation set, the same on every worker."""
    generator = torch.Generator().manual_seed(1000 + seed)
    teacher = torch.randn(DIMS, CLASSES, generator=generator)
    train = labelled(samples, teacher, generator)
    val_inputs, val_targets = labelled(VALIDATION, teacher, generator).tensors
    return Problem(train, val_inputs, val_targets)


def classifier(seed: int, width: int = WIDTH) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(DIMS, width), nn.Tanh(), nn.Linear(width, CLASSES))


def validation_loss(model: nn.Module, data: Problem) -> float:
    with torch.no_grad():
        return float(nn.functional.cross_entropy(model(data.val_inputs), data.val_targets))


def noise_fields(s: ElasticSession) -> dict[str, Any]:
    return {"noise": estimate_fields(s.noise.estimate())}


def estimate_fields(estimate: NoiseEstimate | None) -> dict[str, Any] | None:
    if estimate is None:
        return None
    return {
        "init_batch": estimate.init_batch,
        "grad_sqr": estimate.grad_sqr,
        "grad_var": estimate.grad_var,
        "steps": estimate.steps,
        "sqr_error": estimate.sqr_error,
    }


def measures_of(s: ElasticSession) -> dict[str, Any]:
    """An adaptive batch's smoothed step times by shape (world, per-GPU batch, steps)."""
    if not isinstance(s.policy, AdaptiveBatch):
        return {}
    return {"measures": [[m.workers, m.local, m.accumulation, m.seconds]
                         for m in s.policy.measured()]}  # fmt: skip


@dataclass
class Recorder:
    """Rank 0's clock, evaluations and decisions (see the module docstring)."""

    data: Problem
    trace: TextIO
    eval_every: int
    target: float | None
    out: Path
    save_decisions: bool
    started: float | None = None
    evaluating_s: float = 0.0
    samples: int = 0
    next_eval: int = 0
    reached: bool = False
    last_shape: tuple[Any, ...] | None = None
    last_mark: float = 0.0
    decisions: int = 0
    first_noise_saved: bool = False
    step_times: dict[str, list[float]] = field(default_factory=dict)

    def now(self) -> float:
        """Training seconds so far (evaluation excluded)."""
        assert self.started is not None
        return time.perf_counter() - self.started - self.evaluating_s

    def writing(self, event: str, **fields: Any) -> None:
        self.trace.write(json.dumps({"event": event, **fields}) + "\n")

    def shape(self, s: ElasticSession) -> tuple[Any, ...]:
        policy = s.policy
        if isinstance(policy, AdaptiveBatch):
            chosen = policy.decision(s.world_size)
            return (s.world_size, chosen.local, chosen.accumulation, chosen.lr_factor)
        return (s.world_size, policy.global_batch(s.world_size), 1, 1.0)

    def before_step(self, s: ElasticSession) -> None:
        """At each step boundary (rank 0): the clock starts; a changed batch is written."""
        if self.started is None:
            self.started = time.perf_counter()
            self.last_mark = self.started
            self.evaluation(s)
        if self.save_decisions and not self.first_noise_saved and s.noise.steps > 0:
            self.first_noise_saved = True  # the model soon after the first measured step
            self.saving(s, "first-noise.pt", {"step": s.step_count, **noise_fields(s)})
        shape = self.shape(s)
        if shape != self.last_shape:
            self.last_shape = shape
            world, local, accumulation, factor = shape
            batch = s.policy.global_batch(world)
            used = estimate_fields(getattr(s.policy, "decided_with", None))
            fields = {"t": self.now(), "step": s.step_count, "samples": self.samples,
                      "world": world, "global_batch": batch, "local": local,
                      "accumulation": accumulation, "lr_factor": factor,
                      "lr": float(s.optimizer.param_groups[0]["lr"]), **noise_fields(s),
                      "decided_with": used}  # fmt: skip
            self.writing("decision", **fields)
            if self.save_decisions and fields["decided_with"] is not None:
                self.decisions += 1
                self.saving(s, f"decision-{self.decisions}.pt", fields)

    def saving(self, s: ElasticSession, name: str, fields: dict[str, Any]) -> None:
        state = {k: v.detach().clone() for k, v in s.module.state_dict().items()}
        torch.save({"model": state, "decision": fields}, self.out / name)

    def after_step(self, s: ElasticSession) -> None:
        """After each applied step (rank 0): its time at its shape; an evaluation if due."""
        now = time.perf_counter()
        key = f"{s.world_size}x{s.policy.global_batch(s.world_size)}"
        self.step_times.setdefault(key, []).append(now - self.last_mark)
        self.samples += s.window_size
        if self.samples >= self.next_eval:
            self.evaluation(s)
        self.last_mark = time.perf_counter()

    def evaluation(self, s: ElasticSession) -> None:
        began = time.perf_counter()
        loss = validation_loss(s.module, self.data)
        self.next_eval += self.eval_every
        spent = time.perf_counter() - began
        self.evaluating_s += spent
        if s.step_started is not None:  # the policy's step clock skips the evaluation
            s.step_started += spent
        progress = s.policy.progress if isinstance(s.policy, AdaptiveBatch) else s.step_count
        fields = {"t": self.now(), "step": s.step_count, "samples": self.samples,
                  "world": s.world_size, "global_batch": s.policy.global_batch(s.world_size),
                  "val_loss": loss, "progress": progress, **noise_fields(s),
                  **measures_of(s)}  # fmt: skip
        self.writing("eval", **fields)
        if self.target is not None and loss <= self.target and not self.reached:
            self.reached = True
            self.writing("reached", **fields)

    def ending(self, s: ElasticSession) -> None:
        if self.started is None:
            return
        self.evaluation(s)
        means = {k: sum(v[2:]) / max(1, len(v) - 2) for k, v in self.step_times.items()}
        self.writing("end", t=self.now(), samples=self.samples, step_s=means,
                     steps={k: len(v) for k, v in self.step_times.items()})  # fmt: skip


class TracedAdaptiveBatch(AdaptiveBatch):
    """The adaptive batch, remembering the estimate each of rank 0's decisions came from
    (what the test checks the adopted rate against)."""

    decided_with: Any = None

    def deciding(self, world_size: int, noise: NoiseEstimate | None, now: float) -> Decision:
        decision = super().deciding(world_size, noise, now)
        self.decided_with = noise
        return decision

    def proposing(
        self, world_size: int, noise: NoiseEstimate | None, now: float
    ) -> Decision | None:
        decision = super().proposing(world_size, noise, now)
        if decision is not None:
            self.decided_with = noise
        return decision


def policy_of(args: Any) -> BatchPolicy:
    if args.policy == "fixed":
        return KeepGlobalBatch(args.global_batch)
    options: dict[str, Any] = {}
    if args.decide_every_s is not None:
        options["decide_every_s"] = args.decide_every_s
    return TracedAdaptiveBatch(
        initial_batch=args.global_batch,
        max_batch=args.max_batch,
        max_local=args.max_local or MAX_LOCAL,
        base_lr=args.lr,
        **options,
    )


def main() -> None:
    parser = arguments()
    parser.add_argument("--policy", choices=["fixed", "adaptive"], default="fixed")
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--max-batch", type=int, default=1024)
    parser.add_argument("--decide-every-s", type=float, default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--width", type=int, default=WIDTH)
    parser.add_argument("--eval-every", type=int, default=4096, help="samples between evals")
    parser.add_argument("--target-loss", type=float, default=None)
    parser.add_argument("--save-decisions", action="store_true")
    parser.add_argument("--start-file", type=Path, help="wait for this file before joining")
    args = parser.parse_args()
    logging.basicConfig(level=os.environ.get("EDL_TEST_LOG_LEVEL", "WARNING"))
    torch.set_num_threads(1)
    data = problem(args.samples, args.seed)
    model = classifier(args.seed, args.width)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=MOMENTUM)
    args.out.mkdir(parents=True, exist_ok=True)
    while args.start_file is not None and not args.start_file.exists():
        time.sleep(0.02)
    trace = (args.trace or args.out / "trace").open("a", buffering=1)
    recorder = Recorder(
        data, trace, args.eval_every, args.target_loss, args.out, args.save_decisions
    )
    with session(model, optimizer, data.train, policy_of(args)) as s:
        for inputs, targets in s.batches():  # micro-batches: the recorder sees steps
            if s.rank == 0 and s.micro_batch == 0:
                recorder.before_step(s)
            s.step(nn.functional.cross_entropy(s.model(inputs), targets))
            if s.rank == 0 and s.last_micro_batch:
                recorder.after_step(s)
            if args.step_sleep_s:
                time.sleep(args.step_sleep_s / s.micro_batches)
        if s.rank == 0:
            recorder.ending(s)
    worker = os.environ["EDL_WORKER_ID"]
    torch.save(model.state_dict(), args.out / f"{worker}.pt")


if __name__ == "__main__":
    main()
