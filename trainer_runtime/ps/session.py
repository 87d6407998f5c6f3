"""The PyTorch worker of parameter-server mode (`strategy: ps`).

```
config = PsConfig(global_batch=64, lr=0.1, momentum=0.9, snapshot_dir="/shared/ps")
with ps_session(model, dataset, config) as s:
    for inputs, targets in s.batches():
        s.step(loss_fn(model(inputs), targets))   # the loss is a mean over the batch
```
The model's parameters become views of one flat buffer (and their gradients of another), so
a pull writes the partitions' bytes straight into the parameters and a push reads the
gradient's bytes straight from the buffer. The optimizer runs on the servers.

- `Consistency.SYNC`: every step's window is split among the workers; each pushes its share
  of the window's mean gradient; the leader (rank 0) seals the step on every partition,
  then applies it; everyone pulls the new parameters. The result equals one process
  training with the same global batch.
- `Consistency.ASYNC`: step s belongs to the worker of rank `(s - 1) % world`, which trains
  the whole window on parameters at most `staleness` steps old (it pulls "at least step
  s - 1 - staleness"), pushes, and applies it; partitions apply steps in step order.

Worker resizes only change who takes which samples (the windows are fixed by the step
number, `layout.window_of`); the leader re-forms the PS group at every generation
(`forming.py`) and commits applied windows to the coordinator's ledger in the background.
Every wait is bounded, and between bounded waits the worker checks, from memory, whether a
new generation opened (a peer or a server left), so nobody hangs on a dead peer.
"""

from __future__ import annotations

import enum
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import TensorDataset

from trainer_runtime.agent import WorkerAgent
from trainer_runtime.client import CoordinatorUnreachable, Fenced
from trainer_runtime.committing import Committer
from trainer_runtime.environment import WorkerContract
from trainer_runtime.lifecycle import WorkerSession
from trainer_runtime.protocol import pb
from trainer_runtime.ps.forming import Model, Optimizer, forming, reconciling_ledger
from trainer_runtime.ps.layout import Piece, laying_out, total_steps, window_of, windows_between
from trainer_runtime.ps.snapshots import SnapshotDirectory
from trainer_runtime.ps.transport import GroupChanged, Links
from trainer_runtime.sharding import DatasetPlan, SampleRange, StepWindow, counting, splitting_among

LOG = logging.getLogger(__name__)
POLL_S = 1.0
#: How long a closing leader waits for its last commits to be answered.
CLOSING_FLUSH_S = 10.0


class Consistency(enum.Enum):
    """How workers' steps relate (fixed for the job's life)."""

    SYNC = "sync"
    ASYNC = "async"


class Reassigning(Exception):
    """A new generation opened (or a server refused ours): ask the coordinator again."""


class Ended(Exception):
    """This worker was drained, or the job finished."""


@dataclass(frozen=True, slots=True)
class PsConfig:
    global_batch: int
    lr: float
    snapshot_dir: Path | str
    momentum: float = 0.0
    consistency: Consistency = Consistency.SYNC
    staleness: int = 0
    snapshot_every: int = 20
    channels_per_server: int = 2

    def __post_init__(self) -> None:
        if self.global_batch <= 0:
            raise ValueError(f"global_batch must be positive, got {self.global_batch}")
        if self.staleness < 0:
            raise ValueError(f"staleness must be 0 or more, got {self.staleness}")
        if not 1 <= self.snapshot_every <= 128:
            raise ValueError(
                f"snapshot_every must be 1..128 steps (the ledger can take back 256), "
                f"got {self.snapshot_every}"
            )


@dataclass(frozen=True, slots=True)
class Place:
    generation: int
    rank: int
    world: int
    servers: tuple[tuple[str, str], ...]
    retiring: tuple[tuple[str, str], ...]


def flattening(model: torch.nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
    """Make every parameter a view of one flat tensor, and its gradient a view of another."""
    parameters = [p for p in model.parameters() if p.requires_grad]
    if not parameters:
        raise ValueError("the model has no trainable parameters")
    dtypes = {p.dtype for p in parameters}
    if len(dtypes) != 1 or next(iter(dtypes)) not in (torch.float32, torch.float64):
        raise ValueError(f"parameter-server mode needs one dtype, float32 or float64: {dtypes}")
    with torch.no_grad():
        flat = torch.cat([p.detach().reshape(-1) for p in parameters]).contiguous()
        gradient = torch.zeros_like(flat)
        offset = 0
        for p in parameters:
            n = p.numel()
            p.data = flat[offset : offset + n].view_as(p)
            p.grad = gradient[offset : offset + n].view_as(p)
            offset += n
    return flat, gradient


class PsSession(WorkerSession):
    """One worker of a parameter-server job (see the module docstring)."""

    closing_flush_s = CLOSING_FLUSH_S

    def __init__(
        self,
        model: torch.nn.Module,
        dataset: TensorDataset,
        config: PsConfig,
        contract: WorkerContract | None = None,
    ) -> None:
        self.model = model
        self.dataset = dataset
        self.config = config
        self.contract = contract or WorkerContract.from_environ()
        self.agent = WorkerAgent(self.contract)
        self.links = Links(self.contract.token, config.channels_per_server, self.contract.tls)
        self.directory = SnapshotDirectory(config.snapshot_dir)
        self.flat, self.gradient = flattening(model)
        self.parameters = [p for p in model.parameters() if p.requires_grad]
        self.model_shape = Model(self.flat.numel(), str(self.flat.dtype).removeprefix("torch."))
        self.committer: Committer | None = None
        self.place: Place | None = None
        self.pieces: tuple[Piece, ...] = ()
        self.plan: DatasetPlan | None = None
        self.step_count = 0
        self.generations_formed = 0
        self.rolled_back = 0
        self.loss_taken = False
        self.window_size = 0  # samples of the current step's whole window (all workers)
        self.pulled = -1  # the step of the parameters this worker holds (-1: its own)

    # ----- lifecycle -----

    @property
    def store_address(self) -> str:
        return ""  # a PS worker forms no group of its own: its servers meet it

    def started(self) -> None:
        view = self.agent.client.view_ledger()
        self.plan = DatasetPlan(
            int(view.samples), int(view.shard_size), int(view.epochs), int(view.seed)
        )
        if self.plan.samples > len(self.dataset):
            raise ValueError(
                f"the coordinator plans {self.plan.samples} samples, the dataset has "
                f"{len(self.dataset)}: start the coordinator with --samples {len(self.dataset)}"
            )

    def ended_cleanly(self, kind: type[BaseException] | None) -> bool:
        return kind is None or issubclass(kind, (Ended, GeneratorExit))

    def releasing(self) -> None:
        self.links.closing()

    # ----- membership -----

    def assigning(self) -> Place:
        deadline = time.monotonic() + self.contract.timeout_s
        client = self.agent.client
        while True:
            if self.agent.is_terminating():  # SIGTERM: a drain it gives itself (agent.py)
                raise Ended(pb.GenerationStatus.Name(pb.DRAINED))
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise CoordinatorUnreachable(
                    f"no generation formed within {self.contract.timeout_s:.0f} s"
                )
            reply = client.awaiting_generation(
                self.agent.worker_id, self.agent.generation, timeout_s=min(remaining, 5.0)
            )
            if self.agent.is_replaced(reply.incarnation):  # see ``agent.rejoining``
                self.agent.rejoining()
                continue
            if reply.status == pb.PENDING:
                continue
            if reply.status == pb.FENCED:
                self.agent.re_registering()
                continue
            if reply.status in (pb.DRAINED, pb.FINISHED):
                raise Ended(pb.GenerationStatus.Name(reply.status))
            self.agent.generation = int(reply.number)
            return Place(
                int(reply.number),
                int(reply.rank),
                len(reply.members),
                tuple((m.worker_id, m.store_address) for m in reply.servers),
                tuple((m.worker_id, m.store_address) for m in reply.retiring),
            )

    def checking(self) -> None:
        if self.agent.changed():
            raise Reassigning()

    # ----- training -----

    @property
    def leader(self) -> bool:
        return self.place is not None and self.place.rank == 0

    def batches(self) -> Iterator[Any]:
        """The batches this worker trains, generation after generation, until the job ends."""
        assert self.plan is not None
        following: Place | None = None
        try:
            while True:
                self.place = following or self.assigning()
                following = None
                try:
                    start = self.entering()
                    if self.config.consistency is Consistency.SYNC:
                        yield from self.walking_sync(start)
                    else:
                        yield from self.walking_async(start)
                    # every step is applied: wait for the coordinator to say the job finished
                    # (Ended), or for a new generation (the leader died before its last commit)
                    following = self.assigning()
                except (Reassigning, GroupChanged) as reason:
                    LOG.info("re-forming: %s", reason or "a new generation opened")
                    self.awaiting_change(str(reason) or "a new generation opened")
        except Ended as end:
            total = total_steps(self.plan, self.config.global_batch)
            if str(end) == "FINISHED" and self.pulled < total:
                LOG.warning(
                    "the job finished before this worker pulled the final parameters "
                    "(it holds step %d of %d)",
                    self.pulled,
                    total,
                )
            return

    def awaiting_change(self, reason: str) -> None:
        """After a failed call, wait (bounded) for the generation that replaces ours."""
        deadline = time.monotonic() + self.contract.timeout_s
        while not self.agent.changed():
            if time.monotonic() > deadline:
                raise CoordinatorUnreachable(
                    f"{reason}, and no new generation opened within {self.contract.timeout_s:.0f} s"
                )
            time.sleep(0.02)

    def entering(self) -> int:
        """Join the generation's PS layout; returns the step its parameters are at."""
        place, plan = self.place, self.plan
        assert place is not None and plan is not None
        if not place.servers:
            raise Reassigning(
                "the job has no parameter server: start `python -m trainer_runtime.ps "
                "--snapshot-dir DIR` with the job's environment"
            )
        if self.leader:
            formation = forming(
                self.links,
                place.generation,
                place.servers,
                place.retiring,
                self.model_shape,
                Optimizer(self.config.lr, self.config.momentum),
                self.flat.numpy(),
                self.directory,
                self.config.snapshot_every,
            )
            self.rolled_back += formation.rolled_back
            try:
                reconciling_ledger(
                    self.agent.client,
                    self.agent.worker_id,
                    place.generation,
                    plan,
                    self.config.global_batch,
                    formation.cut,
                )
            except Fenced as error:  # another generation opened while this one formed
                raise Reassigning(str(error)) from error
            if self.committer is None:
                self.committer = Committer(self.agent, retry=False, name="ps-commit")
        self.pieces = tuple(laying_out(self.model_shape.size, place.servers))
        self.generations_formed += 1
        deadline = time.monotonic() + self.contract.timeout_s
        while True:
            try:
                return self.pulling(0)
            except GroupChanged:
                self.checking()
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def pulling(self, at_least: int) -> int:
        """Pull every partition once it applied step `at_least`; returns the lowest watermark."""
        assert self.place is not None
        while True:
            mark = self.links.pulling(
                self.pieces, self.place.generation, at_least, POLL_S, self.flat.numpy()
            )
            if mark is not None:
                self.pulled = mark
                return mark
            self.checking()

    def window_batch(self, ranges: list[SampleRange]) -> Any:
        index = torch.cat([torch.arange(r.start, r.stop) for r in ranges])
        return tuple(tensor[index] for tensor in self.dataset.tensors)

    def step(self, loss: torch.Tensor) -> None:
        """Compute this worker's gradient of `loss` (a mean over its batch)."""
        self.gradient.zero_()
        torch.autograd.backward(loss)
        offset = 0
        for p in self.parameters:  # an optimizer or user code may have replaced a grad
            n = p.numel()
            view = self.gradient[offset : offset + n]
            if p.grad is not None and p.grad.data_ptr() != view.data_ptr():
                view.copy_(p.grad.reshape(-1))
                p.grad = view.view_as(p)
            offset += n
        self.loss_taken = True

    def pushing(self, step: int, contributor: int, contributors: int) -> None:
        assert self.place is not None
        header = {
            "generation": self.place.generation,
            "step": step,
            "contributor": contributor,
            "contributors": contributors,
        }
        self.links.pushing(self.pieces, header, self.gradient.numpy())

    def deciding(self, step: int, seal: bool) -> None:
        assert self.place is not None
        if seal:
            while not all(
                reply.done
                for reply in self.links.stepping(
                    self.pieces, "Seal", self.place.generation, step, POLL_S
                )
            ):
                self.checking()
        self.links.stepping(self.pieces, "Apply", self.place.generation, step, POLL_S)

    def walking_sync(self, start: int) -> Iterator[Any]:
        place, plan = self.place, self.plan
        assert place is not None and plan is not None
        batch, last = self.config.global_batch, total_steps(plan, self.config.global_batch)
        for step in range(start + 1, last + 1):
            self.checking()
            window = window_of(plan, batch, step)
            mine = splitting_among(window.ranges, place.world)[place.rank]
            self.loss_taken = False
            self.window_size = counting(window.ranges)
            if mine:
                yield self.window_batch(mine)
                if not self.loss_taken:
                    raise RuntimeError("call s.step(loss) once for every batch")
                self.gradient.mul_(counting(mine) / counting(window.ranges))
            else:
                self.gradient.zero_()
            self.pushing(step, place.rank, place.world)
            if self.leader:
                self.deciding(step, seal=True)
                self.committing([window])
            self.pulling(step)
            self.step_count += 1

    def walking_async(self, start: int) -> Iterator[Any]:
        place, plan = self.place, self.plan
        assert place is not None and plan is not None
        batch, last = self.config.global_batch, total_steps(plan, self.config.global_batch)
        committed = start
        for step in range(start + 1, last + 1):
            if (step - 1) % place.world != place.rank:
                continue
            self.checking()
            mark = self.pulling(max(step - 1 - self.config.staleness, 0))
            committed = self.committing_through(committed, mark)
            window = window_of(plan, batch, step)
            self.loss_taken = False
            self.window_size = counting(window.ranges)
            yield self.window_batch(list(window.ranges))
            if not self.loss_taken:
                raise RuntimeError("call s.step(loss) once for every batch")
            self.pushing(step, 0, 1)
            self.deciding(step, seal=False)
            self.step_count += 1
        mark = self.pulling(last)
        self.committing_through(committed, mark)

    def committing_through(self, committed: int, mark: int) -> int:
        if not self.leader or mark <= committed:
            return committed
        assert self.place is not None and self.plan is not None and self.committer is not None
        self.committing(windows_between(self.plan, self.config.global_batch, committed, mark))
        return mark

    def committing(self, windows: list[StepWindow]) -> None:
        """The leader hands the windows it just applied to its committer."""
        assert self.place is not None and self.committer is not None
        applied_at = time.monotonic()
        for window in windows:
            self.committer.enqueue(self.place.generation, window, applied_at)


def ps_session(
    model: torch.nn.Module,
    dataset: TensorDataset,
    config: PsConfig,
    contract: WorkerContract | None = None,
) -> PsSession:
    return PsSession(model, dataset, config, contract)


__all__ = ["Consistency", "Fenced", "PsConfig", "PsSession", "ps_session"]
