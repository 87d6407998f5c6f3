"""The elastic training session of PaddlePaddle: the loop a user writes, kept elastic.

```
with session(model, optimizer, dataset, batch_policy=KeepGlobalBatch(64)) as s:
    for inputs, labels in s.batches():
        s.step(loss_fn(s.model(inputs), labels))   # the loss is a mean over the batch
```
The same shape, coordinator and ledger as the PyTorch adapter. Each step, the session reads
from memory whether a new generation opened, and the ranks agree on it inside the step's
gradient allreduce (one extra element), so that all of them leave the generation at the same
step boundary; then each forms that
generation's process group in the running process (see `grouping.py`: a fresh group id in
rank 0's store, never Paddle's default group), reconciles the ledger, broadcasts rank 0's
state, and goes on. `s.step(loss)` backpropagates, averages the gradients over the group
(one allreduce per bucket) and applies the optimizer. A rank whose slice of a step is
empty gets one stand-in sample whose loss weighs 0, so every rank joins every allreduce.

Gradient accumulation: when the batch policy asks for k > 1 micro-batches a step
(`KeepGlobalBatch(B, max_local=M)`), `s.batches()` yields k batches per step and the loop
stays the same, `s.step(loss)` after each. The first k - 1 only backpropagate (Paddle adds
the gradients up in `.grad`); the last averages them over the group, in the one
allreduce that carries the vote and the noise probe, applies the optimizer and commits the
window. Each micro-batch's loss (a mean over it) is scaled by ``micro_samples *
world_size / window_size``, so that the average is the mean over the step's window.
`s.step_count` and `s.window_size` still count optimizer steps and the window's samples;
`s.micro_batch` says which micro-batch of the step this is.

Exactly-once: a generation walks the todo list in order (every rank cuts the same
windows); rank 0 commits each applied step's window in the background; a step whose
collective fails is not applied, the group re-forms, and the new rank 0 reconciles the
coordinator's ledger with the step its state has reached.

What must stay true: a step counts once committed, and the committed steps are those in
rank 0's state; every wait is bounded; a fenced worker raises, it never trains alone.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Iterator, Sequence
from typing import Any

import paddle
from paddle.io import TensorDataset
from paddle.io.dataloader.collate import default_collate_fn

from trainer_runtime import generations
from trainer_runtime.agent import Assignment
from trainer_runtime.batching import KeepGlobalBatch
from trainer_runtime.checkpoints import Keeper
from trainer_runtime.client import CoordinatorError, Fenced
from trainer_runtime.environment import WorkerContract
from trainer_runtime.paddle.batching import BatchPolicy
from trainer_runtime.paddle.checkpointing import as_tensors, loading, saving
from trainer_runtime.paddle.grouping import (
    Group,
    NoiseProbe,
    averaging_gradients,
    broadcasting_state,
    forming,
    trainable,
)
from trainer_runtime.paddle.stores import StoreHost
from trainer_runtime.sharding import SampleRange

LOG = logging.getLogger(__name__)
MAX_FAILED_FORMATIONS = 5


def fetching(dataset: Sequence[Any], ranges: Sequence[SampleRange]) -> Any:
    """The samples `ranges` of `dataset` as one batch: fresh tensors (a copy, never a view
    of the dataset)."""
    if isinstance(dataset, TensorDataset):  # ranges are contiguous: copy slices
        return tuple(paddle.concat([t[r.start : r.stop] for r in ranges]) for t in dataset.tensors)
    collating: Any = default_collate_fn
    return collating([dataset[i] for r in ranges for i in r.indices()])


class ElasticSession(generations.Member):
    """One worker's membership of an elastic data-parallel Paddle job (see the module
    docstring)."""

    max_failed_formations = MAX_FAILED_FORMATIONS
    formation_failures = (RuntimeError, OSError, ValueError)
    stores: StoreHost
    policy: BatchPolicy

    def __init__(
        self,
        model: paddle.nn.Layer,
        optimizer: Any,
        dataset: Sequence[Any],
        batch_policy: BatchPolicy,
        contract: WorkerContract | None = None,
    ) -> None:
        super().__init__(batch_policy, contract)
        self.module = model
        self.optimizer = optimizer
        self.dataset = dataset
        self.parameters = trainable(model)
        self.stores = StoreHost(self.contract.host, self.contract.timeout_s)
        self.group: Group | None = None
        self.retired: list[Group] = []
        self.keeper = Keeper(self.contract.job_id, self.contract.checkpoint_dir, saving, loading)
        #: Per generation formed: whether rank 0's parameters and optimizer state were sent
        #: (`broadcasting_state`; what a test or benchmark reads), the latest 64.
        self.states_sent: deque[tuple[int, bool]] = deque(maxlen=64)

    # ----- lifecycle -----

    def releasing(self) -> None:
        self.group = None

    @property
    def model(self) -> paddle.nn.Layer:
        """The model to call each step (the same object through every generation)."""
        return self.module

    @property
    def rank(self) -> int:
        return self.group.rank if self.group else -1

    @property
    def world_size(self) -> int:
        return self.group.world_size if self.group else 0

    @property
    def generation(self) -> int:
        return self.group.generation if self.group else 0

    # ----- generations -----

    # A failed attempt fails in every member of a generation, by error, by gloo's timeout
    # or by the roll call's single verdict, so every member counts its failures alike.

    def state_to_keep(self) -> tuple[Any, Any, dict[str, Any]]:
        return self.module.state_dict(), self.optimizer.state_dict(), self.policy.shared_state()

    def restoring(self) -> None:
        """A fresh rank 0: the model and optimizer of the newest checkpoint, if any."""
        checkpoint = self.restored()
        if checkpoint is not None:
            self.module.set_state_dict(as_tensors(checkpoint.model))
            self.optimizer.set_state_dict(as_tensors(checkpoint.optimizer))

    def forming_generation(self, assignment: Assignment, attempt: int) -> None:
        if self.group is not None:
            # Never destroyed: freeing a Paddle group while newer ones form breaks their
            # rendezvous (measured: refused connections, torn addresses), so it is kept.
            self.retired.append(self.group)
        self.group = None
        group = forming(
            assignment, attempt, self.stores, self.agent.changed, self.contract.timeout_s
        )
        extra: dict[str, Any] | None = None
        failure: CoordinatorError | None = None
        if group.rank == 0:
            try:
                extra = self.reconciling(group)
            except CoordinatorError as error:  # most often: a newer generation opened
                failure = error
        # Rank 0 abandons a generation by sending None: its peers are already in the
        # broadcast, and a Paddle group cannot be torn down to release them.
        mark = self.state_mark()
        self.origin = None  # until the state is whole again
        sent, state_sent = broadcasting_state(group, self.module, self.optimizer, extra, mark)
        if failure is not None:
            raise failure
        if sent is None:
            raise Fenced(f"rank 0 abandoned generation {group.generation}")
        self.origin = (assignment.generation, attempt)
        self.states_sent.append((assignment.generation, state_sent))
        self.walk = generations.adopting(sent, self.policy, self.noise)
        self.step_count = self.walk.step
        self.applied.clear()
        self.applied.extend(generations.adopted_windows(sent))
        self.leaving_generation = False
        self.group = group
        self.generations_formed += 1

    def reconciling(self, group: Group) -> dict[str, Any]:
        """Rank 0: make the ledger agree with this worker's state; what it sends along."""
        self.committer.flushing(self.contract.timeout_s)
        if self.generations_formed == 0 and self.step_count == 0:
            self.restoring()
        self.deciding_batch(group.world_size)
        view = self.agent.client.reconcile(
            self.agent.worker_id, group.generation, self.step_count, list(self.applied)
        )
        return generations.handover(
            self.step_count,
            view,
            self.policy.shared_state(),
            generations.noise_state(self.noise, self.policy, group.world_size),
            self.applied,
        )

    # ----- steps -----

    def fetching(self, ranges: Sequence[SampleRange]) -> Any:
        """This rank's batch (see `fetching`)."""
        return fetching(self.dataset, ranges)

    def placing(self) -> tuple[int, int]:
        return self.rank, self.world_size

    def batches(self) -> Iterator[Any]:
        """This rank's micro-batches of every step's window (its whole slice, without
        accumulation), until the job ends or it is drained."""
        for mine in self.walking():
            yield self.fetching(mine.ranges)

    def step(self, loss: paddle.Tensor) -> None:
        """Backpropagate this rank's loss (a mean over its batch); after the step's last
        micro-batch, average the gradients over the group and apply the step."""
        if self.stepped:
            raise RuntimeError("s.step(loss) called twice for one batch")
        self.stepped = True
        assert self.window is not None and self.group is not None
        scale = self.micro_samples * self.world_size / self.window_size
        (loss if scale == 1.0 else loss * scale).backward()
        if not self.last_micro_batch:
            return  # the gradients add up in `.grad` until the step's last micro-batch
        # the probe sees the rank's whole slice: the sum of its micro-batches' gradients
        whole = self.local_samples * self.world_size / self.window_size
        try:
            # every rank leaves at the boundary where any of them saw a change
            probe = (
                NoiseProbe(self.local_samples, whole, self.window_size)
                if self.world_size >= 2
                else None
            )
            news = (1.0 if self.agent.changed() else 0.0, *self.proposing_batch())
            stop, *decision = averaging_gradients(self.group, self.parameters, news, probe)
        except (RuntimeError, OSError, ValueError) as error:  # a peer died or went silent
            LOG.info("step %d failed (%s): re-forming", self.window.step, error)
            self.optimizer.clear_grad()
            self.broken = True
            return
        self.policy.adjusting(self.optimizer, self.world_size)
        self.optimizer.step()
        self.optimizer.clear_grad()
        self.step_count = self.window.step
        self.applied.append(self.window)
        self.leaving_generation = stop > 0
        self.adopting_batch(decision)
        if probe is not None and probe.sample is not None and self.noise.observing(probe.sample):
            self.committer.noise = self.noise.estimate() if self.group.rank == 0 else None
            if self.group.rank == 0:  # only rank 0 sends it (a fit: not on every rank)
                self.committer.batch = self.batch_in_use(self.world_size)
        if self.group.rank == 0:
            self.committer.enqueue(self.group.generation, self.window, time.monotonic())

    def finishing(self) -> bool:
        """The walk is over: rank 0 makes sure its commits landed; all vote once more, so
        that nobody leaves while a peer still has to re-form."""
        assert self.group is not None
        landed = True
        try:
            if self.rank == 0:
                if not self.committer.flushing(self.contract.timeout_s):
                    raise TimeoutError("the last commits were not acknowledged in time")
                self.agent.client.commit(self.agent.worker_id, self.generation, [], 0.0)
        except (CoordinatorError, TimeoutError) as error:
            LOG.info("finishing failed (%s): re-forming", error)
            landed = False
        try:
            agreed = self.group.agreeing(landed)
        except (RuntimeError, OSError, ValueError) as error:
            LOG.info("finishing failed (%s): re-forming", error)
            agreed = False
        if not agreed:
            self.broken = True
            return False
        self.done = True
        return True


def session(
    model: paddle.nn.Layer,
    optimizer: Any,
    dataset: Sequence[Any],
    batch_policy: BatchPolicy | None = None,
    contract: WorkerContract | None = None,
) -> ElasticSession:
    """An elastic session for this worker, configured by the environment contract."""
    return ElasticSession(model, optimizer, dataset, batch_policy or KeepGlobalBatch(32), contract)
