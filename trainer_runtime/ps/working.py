"""The framework-free worker of parameter-server mode: what the PyTorch and Paddle workers share.

A framework's worker (`ps.session` for PyTorch, `paddle.ps` for Paddle) holds the model's
parameters in one flat numpy vector `values` and their gradients in another, `gradient`,
and says how to build a batch (`window_batch`), how to make the batch's gradient
(`step`) and how to hand pulled values back to the model (`loaded`). Everything else is
here: assignment, generations, the PS layout, pushes and pulls by partition, the leader's
seal, apply and commits.

- `Consistency.SYNC`: every step's window is split among the workers; each pushes its share
  of the window's mean gradient; the leader (rank 0) seals the step on every partition,
  then applies it; everyone pulls the new parameters. The result equals one process
  training with the same global batch.
- `Consistency.ASYNC`: step s belongs to the worker of rank `(s - 1) % world`, which trains
  the whole window on parameters at most `staleness` steps old (it pulls "at least step
  s - 1 - staleness"), pushes, and applies it; partitions apply steps in step order.

Embedding tables (`sparse`: a parameter's name -> a function giving the ids a batch looks
up) move by row: a worker pulls only the rows its next batch touches (with every dense
parameter) and pushes only those rows' gradients; the servers update only pushed rows (see
`partition.py`). A generation starts with a full pull, and so does the job's end, so every
worker ends holding the whole model.

Worker resizes only change who takes which samples (the windows are fixed by the step
number, `layout.window_of`); the leader re-forms the PS group at every generation
(`forming.py`) and commits applied windows to the coordinator's ledger in the background.
Every wait is bounded, and between bounded waits the worker checks, from memory, whether a
new generation opened (a peer or a server left), so nobody hangs on a dead peer.
"""

from __future__ import annotations

import abc
import enum
import logging
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from trainer_runtime.agent import WorkerAgent
from trainer_runtime.client import CoordinatorUnreachable, Fenced
from trainer_runtime.committing import Committer
from trainer_runtime.environment import WorkerContract
from trainer_runtime.lifecycle import WorkerSession
from trainer_runtime.protocol import pb
from trainer_runtime.ps.forming import Model, Optimizer, forming, reconciling_ledger
from trainer_runtime.ps.layout import (
    Flat,
    Piece,
    Table,
    laying_out,
    total_steps,
    window_of,
    windows_between,
)
from trainer_runtime.ps.snapshots import SnapshotDirectory
from trainer_runtime.ps.transport import GroupChanged, Links, Rows
from trainer_runtime.sharding import DatasetPlan, SampleRange, StepWindow, counting, splitting_among

LOG = logging.getLogger(__name__)
POLL_S = 1.0
#: How long a closing leader waits for its last commits to be answered.
CLOSING_FLUSH_S = 10.0
Array = npt.NDArray[Any]
#: A parameter's name -> the ids (rows of that embedding table) a batch looks up.
Sparse = Mapping[str, Callable[[Any], Any]]


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


class PsWorker(WorkerSession):
    """One worker of a parameter-server job (see the module docstring); a framework's
    worker fills `values` and `gradient` and implements the hooks below."""

    closing_flush_s = CLOSING_FLUSH_S

    def __init__(
        self,
        dataset_length: int,
        config: PsConfig,
        values: Array,
        gradient: Array,
        tables: Mapping[str, Table],
        sparse: Sparse,
        contract: WorkerContract | None = None,
    ) -> None:
        self.dataset_length = dataset_length
        self.config = config
        self.contract = contract or WorkerContract.from_environ()
        self.agent = WorkerAgent(self.contract)
        self.links = Links(self.contract.token, config.channels_per_server, self.contract.tls)
        self.directory = SnapshotDirectory(config.snapshot_dir)
        self.values, self.gradient = values, gradient
        self.tables = tuple(sorted(tables.values(), key=lambda t: t.start))
        self.lookups = [(tables[name], ids) for name, ids in sparse.items()]
        self.model_shape = Model(values.size, str(values.dtype), self.tables)
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
        self.touched: Rows = {}  # the rows of the tables the current batch looks up
        self.upcoming: dict[int, tuple[Any, Rows]] = {}  # step -> its batch, pulled ahead

    # ----- the framework's part -----

    @abc.abstractmethod
    def window_batch(self, ranges: list[SampleRange]) -> Any:
        """The batch of the samples `ranges`, as the framework's tensors."""

    @abc.abstractmethod
    def step(self, loss: Any) -> None:
        """Write this worker's gradient of `loss` (a mean over its batch) into `gradient`
        (of the tables, the `touched` rows are enough) and set `loss_taken`."""

    def loaded(self, touched: Rows | None) -> None:
        """Pulled values are in `values` (of the tables, only the `touched` rows, unless
        None): hand them to the model (nothing to do where parameters view `values`)."""
        return None

    def ids_of(self, found: Any) -> Array:
        """The ids a `sparse` function returned, as a numpy array."""
        return np.asarray(found)

    # ----- lifecycle -----

    @property
    def store_address(self) -> str:
        return ""  # a PS worker forms no group of its own: its servers meet it

    def started(self) -> None:
        view = self.agent.client.view_ledger()
        self.plan = DatasetPlan(
            int(view.samples), int(view.shard_size), int(view.epochs), int(view.seed)
        )
        if self.plan.samples > self.dataset_length:
            raise ValueError(
                f"the coordinator plans {self.plan.samples} samples, the dataset has "
                f"{self.dataset_length}: start the coordinator with --samples "
                f"{self.dataset_length}"
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
                self.upcoming.clear()
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
                self.values,
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
        self.pieces = tuple(laying_out(self.model_shape.size, place.servers, self.tables))
        self.generations_formed += 1
        deadline = time.monotonic() + self.contract.timeout_s
        while True:
            try:
                return self.pulling(0, None)
            except GroupChanged:
                self.checking()
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def pulling(self, at_least: int, touched: Rows | None) -> int:
        """Pull every partition (of the tables, the `touched` rows only, unless None) once
        it applied step `at_least`; returns the lowest watermark."""
        assert self.place is not None
        generation = self.place.generation
        while True:
            mark = self.links.pulling(
                self.pieces, generation, at_least, POLL_S, self.values, self.tables, touched
            )
            if mark is not None:
                self.pulled = mark
                self.loaded(touched)
                return mark
            self.checking()

    def touching(self, batch: Any) -> Rows:
        """The rows of each table the batch looks up (ascending, unique)."""
        touched: dict[Table, npt.NDArray[np.int64]] = {}
        for table, ids in self.lookups:
            rows = np.unique(self.ids_of(ids(batch)).astype(np.int64, copy=False).reshape(-1))
            if rows.size and (rows[0] < 0 or rows[-1] >= table.rows):
                raise ValueError(f"sparse: ids must lie in 0..{table.rows - 1}")
            touched[table] = rows
        return touched

    def batch_of(self, step: int, ranges: list[SampleRange]) -> Any:
        """The batch of `ranges` (pulled ahead at the step before, where tables are)."""
        found = self.upcoming.pop(step, None)
        if found is None:
            found = (batch := self.window_batch(ranges)), self.touching(batch)
        self.touched = found[1]
        return found[0]

    def scaling(self, factor: float) -> None:
        """Scale this worker's gradient (of the tables, the touched rows) by `factor`."""
        if not self.tables:
            self.gradient *= factor
            return
        position = 0
        for table in self.tables:
            self.gradient[position : table.start] *= factor
            rows = self.touched.get(table)
            if rows is not None and rows.size:
                view = self.gradient[table.start : table.stop].reshape(-1, table.row_length)
                view[rows] *= factor
            position = table.stop
        self.gradient[position:] *= factor

    def pushing(self, step: int, contributor: int, contributors: int) -> None:
        assert self.place is not None
        header = {
            "generation": self.place.generation,
            "step": step,
            "contributor": contributor,
            "contributors": contributors,
        }
        self.links.pushing(self.pieces, header, self.gradient, self.tables, self.touched)

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

    def share_of(self, step: int) -> tuple[StepWindow, list[SampleRange]]:
        place, plan = self.place, self.plan
        assert place is not None and plan is not None
        window = window_of(plan, self.config.global_batch, step)
        return window, splitting_among(window.ranges, place.world)[place.rank]

    def ahead(self, step: int, last: int) -> Rows | None:
        """What the pull after step `step - 1` fetches of the tables: the rows step `step`'s
        batch looks up (None: everything, at the end or without tables)."""
        if not self.tables or step > last:
            return None
        _, mine = self.share_of(step)
        if not mine:
            return {}
        batch = self.window_batch(mine)
        self.upcoming[step] = (batch, self.touching(batch))
        return self.upcoming[step][1]

    def walking_sync(self, start: int) -> Iterator[Any]:
        place, plan = self.place, self.plan
        assert place is not None and plan is not None
        last = total_steps(plan, self.config.global_batch)
        for step in range(start + 1, last + 1):
            self.checking()
            window, mine = self.share_of(step)
            self.loss_taken = False
            self.window_size = counting(window.ranges)
            if mine:
                yield self.batch_of(step, mine)
                if not self.loss_taken:
                    raise RuntimeError("call s.step(loss) once for every batch")
                self.scaling(counting(mine) / counting(window.ranges))
            else:
                self.touched = {}
                self.gradient[:] = 0
            self.pushing(step, place.rank, place.world)
            if self.leader:
                self.deciding(step, seal=True)
                self.committing([window])
            self.pulling(step, self.ahead(step + 1, last))
            self.step_count += 1

    def walking_async(self, start: int) -> Iterator[Any]:
        place, plan = self.place, self.plan
        assert place is not None and plan is not None
        last = total_steps(plan, self.config.global_batch)
        committed = start
        for step in range(start + 1, last + 1):
            if (step - 1) % place.world != place.rank:
                continue
            self.checking()
            window = window_of(plan, self.config.global_batch, step)
            batch = self.batch_of(step, list(window.ranges))
            touched = self.touched if self.tables else None
            mark = self.pulling(max(step - 1 - self.config.staleness, 0), touched)
            committed = self.committing_through(committed, mark)
            self.loss_taken = False
            self.window_size = counting(window.ranges)
            yield batch
            if not self.loss_taken:
                raise RuntimeError("call s.step(loss) once for every batch")
            self.pushing(step, 0, 1)
            self.deciding(step, seal=False)
            self.step_count += 1
        mark = self.pulling(last, None)
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


__all__ = ["Consistency", "Fenced", "Flat", "PsConfig", "PsWorker", "Sparse"]
