"""The elastic training session of PyTorch: the loop a user writes, kept elastic.

```
with session(model, optimizer, dataset, batch_policy=KeepGlobalBatch(64)) as s:
    for inputs, targets in s.batches():
        s.step(loss_fn(s.model(inputs), targets))   # the loss is a mean over the batch
```
`s.model` is the model wrapped in DistributedDataParallel for the current generation; call
through it each step (it changes object on a resize). Each step every rank reads, from
memory, whether a new generation opened, and the ranks agree on it in a small allreduce
that runs while the step does, so that all of them leave the generation at the same step
boundary; then the session re-forms the process group (`s.group`; torch's default group is
never initialized), reconciles the ledger and broadcasts rank 0's state, and goes on. A
generation that only adds members is built beside the running group while it trains, and
the group leaves once every rank's is built (`trainer_runtime.torch.joining`). A rank whose
slice of a
step is empty (more ranks than samples in the step) gets one stand-in sample whose loss is
weighted 0, so that every rank takes part in every allreduce.

Gradient accumulation: when the batch policy asks for k > 1 micro-batches a step
(`KeepGlobalBatch(B, max_local=M)`), `s.batches()` yields k batches per step and the loop
stays the same: `s.step(loss)` after each. The first k - 1 run under DDP's no-sync (their
gradients add up locally: backward only, no collective, no optimizer step); the last is
synchronized, and only then is the optimizer applied and the window committed. Each
micro-batch's loss (a mean over it) is scaled by ``micro_samples * world_size /
window_size``, so that the averaged gradient is the mean over the step's window, as a
step without accumulation. `s.step_count` and `s.window_size` still count optimizer steps
and the window's samples; `s.micro_batch` says which micro-batch of the step this is.

One step in `measuring.MEASURE_EVERY` also measures the job's gradient noise (the local
gradients are averaged by the session's meter instead of DDP, in one allreduce that carries
the statistics, after the step's last micro-batch); rank 0 sends the estimate with its
commits, for the planner's goodput model (see `trainer_runtime/noise.py`).

Exactly-once: a generation walks the todo list in order (every rank cuts the same windows);
rank 0 commits each applied step's window in the background; a step whose collective fails
is not applied, the group re-forms, and the new rank 0 reconciles the coordinator's ledger
with the step its state has reached (see `CoordinatorState.reconciling`).

What must stay true: a step counts once committed, and the committed steps are those in rank
0's state; every wait is bounded; a fenced worker raises, it never trains alone; a commit
refused for another reason than a fence (or never answered) stops the worker with
`CommitFailed` at the next step boundary, unless a new generation's reconcile repaired it.
"""

from __future__ import annotations

import logging
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import TensorDataset, default_collate

from trainer_runtime import generations
from trainer_runtime.adaptive import CARRIED
from trainer_runtime.agent import Assignment
from trainer_runtime.batching import KeepGlobalBatch
from trainer_runtime.checkpoints import Keeper
from trainer_runtime.client import Fenced
from trainer_runtime.environment import WorkerContract
from trainer_runtime.generations import Share
from trainer_runtime.sharding import SampleRange
from trainer_runtime.torch.batching import BatchPolicy
from trainer_runtime.torch.checkpointing import loading, saving
from trainer_runtime.torch.grouping import (
    Delivery,
    Holding,
    Reformed,
    StoreHost,
    attempt_store,
    broadcasting_state,
    dissolving,
    forming,
    settling,
    switching,
)
from trainer_runtime.torch.groups import Group
from trainer_runtime.torch.joining import Joiner
from trainer_runtime.torch.measuring import NoiseMeter
from trainer_runtime.torch.replicas import (
    completion,
    discarding,
    rebuilding_buckets,
    replicating,
    warming_up,
)
from trainer_runtime.torch.shrinking import Reformation, Shrinker, shrinker_for
from trainer_runtime.torch.streaming import MIN_CHUNK_BYTES, Stream, pruning

LOG = logging.getLogger(__name__)
MAX_FAILED_FORMATIONS = 8
REFORMATIONS_KEPT = 64


class CommitFailed(Exception):
    """Rank 0's background commits were refused or could not reach the coordinator; the
    steps since the last commit would not count, so the worker stops."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(f"committing applied steps failed: {cause}")
        self.__cause__ = cause


class ElasticSession(generations.Member):
    """One worker's membership of an elastic data-parallel job (see the module docstring)."""

    max_failed_formations = MAX_FAILED_FORMATIONS
    stores: StoreHost
    policy: BatchPolicy
    #: How this process's live group may shrink (`shrinking.shrinker_for`): None where it
    #: cannot, and the group is built anew. A test swaps in a stand-in on gloo.
    shrinker_of: Callable[[Group | None], Shrinker | None] = staticmethod(shrinker_for)
    #: Whether members without rank 0's state take it over a generation's first steps
    #: (`trainer_runtime.torch.streaming`) rather than all before the first; and its
    #: smallest chunk (a test streams a small model in several).
    streaming_state = True
    stream_min_bytes = MIN_CHUNK_BYTES

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        dataset: Sequence[Any],
        batch_policy: BatchPolicy,
        contract: WorkerContract | None = None,
        device: torch.device | None = None,
    ) -> None:
        super().__init__(batch_policy, contract)
        self.module = model
        self.optimizer = optimizer
        self.dataset = dataset
        self.device = device or next(model.parameters()).device
        self.stores = StoreHost(self.contract.host, self.contract.timeout_s)
        self.meter = NoiseMeter(self.noise)
        self.ddp: DistributedDataParallel | None = None
        #: This generation's process group (`trainer_runtime.torch.groups`; torch's
        #: default group is never initialized): every collective of the session names it.
        self.group: Group | None = None
        #: Builds the next generation's group beside this one when it only adds members.
        self.joiner = Joiner(self.agent, self.stores, self.contract.job_id, self.device)
        self.rank = -1
        self.world_size = 0
        self.generation = 0
        # The ranks' vote on leaving the generation: each step every rank adds whether it
        # has seen a newer generation open (summed over the group while the step runs);
        # all of them leave at the boundary after a step whose sum is not 0. The vote also
        # carries rank 0's re-decision of an adaptive batch (`generations.proposing_batch`),
        # which every rank adopts at that boundary. Its second number counts the ranks whose
        # group for the next generation is built (`joining`): all of them leave once every
        # rank's is, without anybody having asked to leave.
        self.vote = torch.zeros(2 + CARRIED, dtype=torch.float32, device=self.device)
        self.voting: dist.Work | None = None
        self.keeper = Keeper(self.contract.job_id, self.contract.checkpoint_dir, saving, loading)
        self.last_vote: dist.Work | None = None  # held until its group is gone (`unwrapping`)
        # The generation the live group was formed as (None: no live group): what a shrink
        # goes by (a skipped state broadcast goes by `state_mark`).
        self.formed: Assignment | None = None
        self.reformations: deque[Reformed] = deque(maxlen=REFORMATIONS_KEPT)
        self.stream: Stream | None = None  # rank 0's state on its way (`streaming`)

    # ----- lifecycle -----

    def preparing(self) -> None:
        """The one-off costs, paid before asking to join (`replicas.warming_up`)."""
        warming_up(self.module, self.optimizer)

    def releasing(self) -> None:
        self.joiner.cancelling()
        self.leaving_group()

    @property
    def model(self) -> torch.nn.Module:
        """The model to call this step (DistributedDataParallel of this generation)."""
        if self.ddp is None:
            raise RuntimeError("call the model inside `for batch in s.batches()`")
        return self.ddp

    # ----- generations -----

    def forming_generation(self, assignment: Assignment, attempt: int) -> None:
        prepared = self.joiner.taking(assignment, attempt)
        # a broken group is not shrunk: torch's watchdog aborted its communicator
        previous = None if self.broken else self.formed
        live, self.group = Holding(self.group), None  # held there alone (`Holding`)
        shrinker = self.shrinker_of(None if self.broken else live.group)
        self.formed = None
        self.unwrapping()
        live.works.append(self.last_vote)  # released with the group, before any roll call
        self.last_vote = None
        if prepared is not None:
            live.letting_go()
            path, group = Reformation.PREPARED, prepared
            try:
                store = attempt_store(assignment, attempt, self.contract.job_id, self.stores)
                timeout_s = self.stores.timeout.total_seconds()
                world_size = assignment.world_size
                switching(store, assignment.rank, world_size, timeout_s, self.agent.changed)
            except RuntimeError:
                dissolving(group)
                raise
        else:
            path, group = forming(
                assignment,
                attempt,
                self.contract.job_id,
                self.stores,
                self.device,
                self.agent.changed,
                live=live,
                previous=previous,
                shrinker=shrinker,
            )
        live.letting_go()  # (gone already, unless shrunk) with its last vote
        self.group = group
        self.rank, self.world_size = assignment.rank, assignment.world_size
        self.generation = assignment.generation
        extra: dict[str, Any] = {}
        if self.rank == 0:
            self.committer.flushing(self.contract.timeout_s)
            if self.generations_formed == 0 and self.step_count == 0:
                self.restoring()
            noise = self.noise_state()  # folded first: the decision goes by all of it
            self.deciding_batch(self.world_size)
            view = self.agent.client.reconcile(
                self.agent.worker_id, self.generation, self.step_count, list(self.applied)
            )
            extra = generations.handover(
                self.step_count, view, self.policy.shared_state(), noise, self.applied
            )
        mark = self.state_mark()
        self.origin = None  # until the state is whole again
        sent, delivery, holders = broadcasting_state(
            group, self.module, self.optimizer, extra, self.device, mark, self.streaming_state
        )
        origin = (assignment.generation, attempt)
        streamed = delivery is Delivery.STREAMED
        if not streamed or self.rank in holders:
            self.origin = origin
        self.formed = assignment
        self.reformations.append(Reformed(assignment.generation, attempt, path, delivery))
        self.committer.failure = None  # rank 0's reconcile made the ledger agree with `sent`
        self.walk = generations.adopting(sent, self.policy, self.noise)
        self.step_count = self.walk.step
        self.applied.clear()
        self.applied.extend(generations.adopted_windows(sent))
        self.ddp = replicating(self.module, group)
        self.meter.attaching(self.ddp, self.world_size)
        if streamed:
            self.stream = Stream(
                group, self.module, self.optimizer, holders, origin, self.stream_min_bytes
            )
        self.generations_formed += 1

    def unwrapping(self) -> None:
        """Let go of everything that holds the generation's group but the group itself.

        The old DDP (and the meter's reference to it) goes first: its reducer holds the
        group (`replicas.discarding`). The last vote is kept (`last_vote`) until the group
        is gone, dissolved or shrunk. On gloo a vote may still run after a failed step: if
        gloo's worker thread then held its last reference, releasing the vote tensor there
        would take the GIL, while the group's destructor joins that thread holding the GIL
        (seen: a survivor hung for ever in the re-form after a peer's SIGKILL, in 3 runs of
        9). So the vote is waited for (bounded by the group's timeout) and released after
        the group, on this thread (on NCCL each step's ``settling`` waited for it)."""
        left = None if self.ddp is None else weakref.ref(self.ddp)
        self.ddp = None
        self.meter.detaching()
        stream, self.stream = self.stream, None
        if stream is not None:  # before the vote's wait: its chunk was issued after it
            stream.abandoning(self.broken)
        pruning()  # the chunks of streams left behind, once gloo is done with them
        voting, self.voting = self.voting, None
        if voting is not None and self.device.type != "cuda":
            try:
                voting.wait()
            except RuntimeError as error:  # the group failed: the vote is moot
                LOG.debug("the vote of the group left behind failed (%s)", error)
        if voting is not None:
            self.last_vote = voting
        discarding(left, self.broken, self.device)  # the DDP gone, so the group can go

    def leaving_group(self) -> None:
        """Leave the group, if any, and all that holds it; the last vote after it."""
        self.unwrapping()
        self.formed = None
        group, self.group = self.group, None
        dissolving(group)
        del group
        self.last_vote = None

    def noise_state(self) -> dict[str, Any]:
        """Rank 0's gradient statistics for the generation; a job that measured nothing yet
        takes its initial batch now (a custom policy's batch at its first size)."""
        self.meter.folding()
        return generations.noise_state(self.noise, self.policy, self.world_size)

    # ----- suspension to zero workers (`trainer_runtime/checkpoints.py`) -----

    def state_to_keep(self) -> tuple[Any, Any, dict[str, Any]]:
        return self.module.state_dict(), self.optimizer.state_dict(), self.policy.shared_state()

    def restoring(self) -> None:
        """A fresh rank 0: the model and optimizer of the newest checkpoint, if any."""
        checkpoint = self.restored()
        if checkpoint is not None:
            self.module.load_state_dict(checkpoint.model)
            self.optimizer.load_state_dict(checkpoint.optimizer)

    # ----- steps -----

    def fetching(self, ranges: Sequence[SampleRange]) -> Any:
        """This rank's batch: fresh tensors (a copy, never a view of the dataset)."""
        if isinstance(self.dataset, TensorDataset) and len(ranges) == 1:
            start, stop = ranges[0].start, ranges[0].stop
            return tuple(t[start:stop].clone() for t in self.dataset.tensors)
        if isinstance(self.dataset, TensorDataset):  # ranges are contiguous: copy slices
            return tuple(
                torch.cat([t[r.start : r.stop] for r in ranges]) for t in self.dataset.tensors
            )
        return default_collate([self.dataset[i] for r in ranges for i in r.indices()])

    def placing(self) -> tuple[int, int]:
        return self.rank, self.world_size

    def sharing(self) -> Share:
        """While rank 0's state streams, the window is the holders' alone (`streaming`)."""
        if self.stream is None:
            return Share(self.rank, self.world_size)
        return self.stream.share

    def leaving_at_boundary(self) -> bool:
        leave = not self.broken and self.leaving()  # (a failed vote breaks the group)
        return self.broken or leave

    def checking_commits(self) -> None:
        if self.committer.failure is not None:
            raise CommitFailed(self.committer.failure)

    def batches(self) -> Iterator[Any]:
        """This rank's micro-batches of every step's window (its whole slice, without
        accumulation), until the job ends or it is drained (a rank whose slice is empty
        still runs DDP's forward and its allreduce)."""
        for mine in self.walking():
            assert self.window is not None
            # before the forward: whether DDP syncs this backward (the step's last
            # micro-batch, unless the meter averages this step itself)
            self.meter.arming(self.window.step, self.last_micro_batch)
            if self.world_size > 1 and self.micro_batch == 0:
                # every rank votes once a step, at the same point: its first micro-batch
                (leave, ready), decision = self.news(), self.proposing_batch()
                if any(decision) or ready:  # rare: a host copy (on a GPU, a synchronous one)
                    news = (float(leave), float(ready), *decision)
                    self.vote.copy_(torch.tensor(news, dtype=self.vote.dtype))
                else:  # every other step: kernels only, as the vote alone was
                    self.vote.zero_()
                    self.vote[:1].fill_(float(leave))
                assert self.group is not None
                self.voting = dist.all_reduce(self.vote, async_op=True, group=self.group.pg)
                if self.stream is not None:  # the next chunk of rank 0's state, meanwhile
                    self.stream.issuing()
            yield self.fetching(mine.ranges)

    def news(self) -> tuple[bool, bool]:
        """This rank's part of the vote on leaving the generation (`Joiner.news`, a memory
        read): whether to leave now, and whether its group for the next one is built."""
        return self.joiner.news(None if self.broken else self.formed, self.step_count)

    def leaving(self) -> bool:
        """Whether the group leaves its generation at this step boundary. Alone, this rank
        reads the news itself; in a group all ranks go by the last step's vote, so that they
        leave at the same boundary (one leaving while a peer starts the next step would
        leave that peer in an allreduce until the collective's timeout)."""
        if self.world_size <= 1:
            leave, ready = self.news()
            self.leaving_generation = leave or ready
            self.adopting_batch(self.proposing_batch())
            return self.leaving_generation
        voting, self.voting = self.voting, None
        if voting is None:  # no step yet in this generation: vote first
            return False
        try:
            voting.wait()
            stop, ready, *decision = self.vote.tolist()
            self.leaving_generation = stop > 0 or ready > self.world_size - 0.5
            self.adopting_batch(decision)
        except RuntimeError as error:  # the group failed: re-form it
            LOG.info("the vote on leaving failed (%s): re-forming", error)
            self.broken = True
        return self.leaving_generation

    def step(self, loss: torch.Tensor) -> None:
        """Backpropagate this rank's loss (a mean over its batch); after the step's last
        micro-batch, average the gradients and apply the step."""
        if self.stepped:
            raise RuntimeError("s.step(loss) called twice for one batch")
        self.stepping(loss)

    def stepping(self, loss: torch.Tensor) -> None:
        self.stepped = True
        assert self.window is not None
        try:
            scale = self.micro_samples * self.world_size / self.window_size
            torch.autograd.backward(loss if scale == 1.0 else loss * scale)
            if not self.last_micro_batch:
                return  # DDP's sync was off: the gradients add up on this rank
            # the meter sees the rank's whole slice: the sum of its micro-batches' gradients
            whole = self.local_samples * self.world_size / self.window_size
            self.meter.averaging(self.local_samples, whole, self.window_size)
            if self.world_size > 1 and self.group is not None and self.group.is_nccl:
                settling(self.group)  # NCCL: the allreduces ended, and whole
            if self.meter.keeping() and self.rank == 0:
                self.committer.noise = self.noise.estimate()
                self.committer.batch = self.batch_in_use(self.world_size)
            if self.stream is not None:  # the chunk in flight lands before the update
                self.stream.landing()
            # the state changes from here: a step that fails inside it (an out-of-memory
            # error half-way through the update) leaves no mark that a peer could match
            origin, self.origin = self.origin, None
            self.policy.adjusting(self.optimizer, self.world_size)
            self.optimizer.step()
            self.origin = origin
            if self.stream is not None and self.stream.done:  # all of it: a holder now
                self.origin, self.stream = self.stream.origin, None
        except RuntimeError as error:
            if self.group is None:
                raise
            LOG.info("step %d failed (%s): re-forming", self.window.step, error)
            self.meter.discarding()  # a partial sum, where the collective failed late
            self.optimizer.zero_grad(set_to_none=True)
            self.broken = True
            return
        self.optimizer.zero_grad(set_to_none=True)
        self.step_count = self.window.step
        self.applied.append(self.window)
        if self.rank == 0:
            self.committer.enqueue(
                self.generation, self.window, time.monotonic(), completion(self.device)
            )
        self.rebuilding_buckets()

    def rebuilding_buckets(self) -> None:
        """DDP's buckets rebuilt at the end of the step, if due (`replicas.rebuilding_buckets`);
        a failure breaks the group."""
        if self.ddp is None:
            return
        try:
            rebuilding_buckets(self.ddp)
        except RuntimeError as error:
            assert self.window is not None
            LOG.info("DDP's buckets after step %d failed (%s): re-forming", self.window.step, error)
            self.broken = True

    def finishing(self) -> bool:
        """The walk is over: rank 0 makes sure its commits landed; all meet once more."""
        try:
            if self.rank == 0 and not self.committer.flushing(self.contract.timeout_s):
                raise TimeoutError("the last commits were not acknowledged in time")
            if self.committer.failure is not None:  # not a fence: re-forming would not help
                raise CommitFailed(self.committer.failure)
            if self.rank == 0:
                self.agent.client.commit(self.agent.worker_id, self.generation, [], 0.0)
            assert self.group is not None
            dist.barrier(group=self.group.pg)
        except (Fenced, RuntimeError) as error:
            LOG.info("finishing failed (%s): re-forming", error)
            self.broken = True
            return False
        self.done = True
        return True


def session(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    dataset: Sequence[Any],
    batch_policy: BatchPolicy | None = None,
    contract: WorkerContract | None = None,
) -> ElasticSession:
    """An elastic session for this worker, configured by the environment contract."""
    return ElasticSession(model, optimizer, dataset, batch_policy or KeepGlobalBatch(32), contract)
