"""What every data-parallel session does the same way, whatever its framework: keep the
same state (its entry and exit are `lifecycle.WorkerSession`'s), join the next generation
(and retry a failed formation), wait for news of a generation, hand rank 0's ledger
position to a new generation, and cut a rank's slice of a step into its micro-batches.

The PyTorch and Paddle sessions (`trainer_runtime.torch.session`,
`trainer_runtime.paddle.session`) differ in how they form a group, average gradients and
move tensors; what they send when a generation forms, and how a step's window is split
among the ranks, must not differ, or one framework would train a sample twice where the
other would not. So it is written here once, with no framework imported.

What must stay true: every rank of a generation adopts the same state (the one rank 0
sent), so all of them walk the same windows from the same step, and keep the same record of
the windows that led to that state (what a later rank 0 reconciles a coordinator with,
should one be replaced from a state older than them: ``coordinator/recovering.py``); a
rank's slice is the one `sharding.slice_of` cuts among the ranks that share the window
(all of them, unless some stand by: `Share`), run as the batch policy's
`accumulation(world_size)` consecutive micro-batches, times the ranks per sharing one
(the same number on every rank, so that every rank synchronizes at its last one); a
micro-batch with no sample of its own (a rank's empty slice, or more micro-batches than the
slice has samples) is one stand-in sample that weighs nothing, so the rank still takes part
in the step; a window is still one optimizer step, applied and committed after its last
micro-batch; a wait for news is bounded, and so are the attempts at forming a generation.
"""

from __future__ import annotations

import abc
import logging
import time
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

from trainer_runtime.adaptive import CARRIED, AdaptiveBatch, Decision
from trainer_runtime.agent import Assignment, Outcome, WorkerAgent
from trainer_runtime.batching import BatchPolicy, initial_batch
from trainer_runtime.checkpoints import Checkpoint, Keeper
from trainer_runtime.client import Fenced
from trainer_runtime.committing import AHEAD_WINDOWS, WINDOWS_KEPT, BatchInUse, Committer
from trainer_runtime.environment import WorkerContract
from trainer_runtime.lifecycle import WorkerSession
from trainer_runtime.noise import NoiseEstimator
from trainer_runtime.sharding import (
    DatasetPlan,
    SampleRange,
    StepWindow,
    Walk,
    counting,
    slice_of,
    splitting_among,
)

#: How long a worker whose step or formation failed waits for the coordinator's news of a
#: newer generation (at most a quarter of its timeout), and how often it looks.
NEWS_GRACE_S = 3.0
NEWS_POLL_S = 0.05

LOG = logging.getLogger(__name__)
#: What a rank without a re-decision adds to the step's vote on the batch.
NO_DECISION = (0.0,) * CARRIED


def hearing_news(agent: WorkerAgent, timeout_s: float) -> bool:
    """Whether a newer generation opened (or a drain or the end came), waiting up to
    NEWS_GRACE_S for the news: a step that failed because a peer died fails before the
    coordinator's notice of the departure arrives, and forming the same generation again
    would wait for the dead."""
    deadline = time.monotonic() + min(NEWS_GRACE_S, timeout_s / 4)
    while not agent.changed():
        if time.monotonic() > deadline:
            return False
        time.sleep(NEWS_POLL_S)
    return True


class StoreHosting(Protocol):
    """A framework's store server that this worker hosts for its groups' rendezvous."""

    @property
    def address(self) -> str: ...


class Member(WorkerSession):
    """A worker's membership of an elastic job's generations, as a session holds it: the
    rule by which it joins the next generation and retries a failed formation, and the
    state every data-parallel session keeps the same way. A framework's session says how it
    forms a generation (`forming_generation`), which failures of a formation it retries
    (`formation_failures`), how many times in a row (`max_failed_formations`), and what it
    does when drained (the hook).

    Its ranks agree on leaving a generation inside a step (`leaving_generation`, set at
    the step boundary where any rank saw a newer generation open): it is reset once a new
    generation is assigned, so that a failure from then on retries that generation, and set
    when the generation closed while it was forming, so that the worker asks for the newer."""

    max_failed_formations: ClassVar[int]
    formation_failures: ClassVar[tuple[type[Exception], ...]] = (RuntimeError,)
    stores: StoreHosting
    committer: Committer
    keeper: Keeper  # the adapter's: its framework saves and loads

    def __init__(self, policy: BatchPolicy[Any], contract: WorkerContract | None) -> None:
        self.contract = contract or WorkerContract.from_environ()
        self.policy = policy
        self.agent = WorkerAgent(self.contract)
        self.committer = Committer(self.agent, ahead=AHEAD_WINDOWS)
        self.noise = NoiseEstimator(initial_batch(policy, 1))
        self.assignment: Assignment | None = None  # the generation formed or being formed
        self.attempt = 0  # at forming `assignment`
        self.step_count = 0
        # the windows that led to this worker's state, for a later reconcile (`handover`)
        self.applied: deque[StepWindow] = deque(maxlen=WINDOWS_KEPT)
        self.walk: Walk | None = None
        self.window: StepWindow | None = None  # the step's window
        self.local_samples = 0  # of the step's window, this rank's own (all its micro-batches)
        self.window_size = 0  # samples of the step's window
        self.micro_samples = 0  # of this micro-batch, this rank's own (0: a stand-in)
        self.micro_batch = 0  # which micro-batch of the step this is, from 0
        self.micro_batches = 1  # this step's micro-batches on every rank
        self.stepped = True
        self.broken = True  # no group, or a failed one: re-form at the next boundary
        self.leaving_generation = False
        self.done = False
        self.generations_formed = 0
        self.step_started: float | None = None  # the wall clock at the last step boundary
        #: The formation (generation, attempt) whose state this rank adopted; None: a state
        #: of its own (a newcomer's, a restored one) or one a failure cut short
        #: (`state_mark`).
        self.origin: tuple[int, int] | None = None
        self.shape_steps = 0  # boundaries passed at the batch in force

    def state_mark(self) -> tuple[int, int, int] | None:
        """What names this rank's model and optimizer state when a generation forms: the
        formation it adopted and the step it reached since; None when it has no such name.
        Ranks with equal marks hold the same state (they adopted the same one and applied
        the same averaged gradients since), so a framework's state broadcast skips the
        members whose mark equals rank 0's when all of them do (`holding_state`). A session
        sets `origin` to None before anything could leave its state half-written (a
        broadcast it receives, an update that may fail half-way) and back once the state
        is whole."""
        return None if self.origin is None else (*self.origin, self.step_count)

    @property
    def store_address(self) -> str:
        return self.stores.address

    # ----- suspension to zero workers (``trainer_runtime/checkpoints.py``) -----

    def restored(self) -> Checkpoint | None:
        """A fresh rank 0 (no state of its own): the newest checkpoint of the job, its
        batch policy's state, step and windows taken here; the caller loads its model and
        optimizer from it. None: there is none (``Keeper.found``)."""
        checkpoint = self.keeper.found(lambda: int(self.agent.client.view_ledger().committed_step))
        if checkpoint is not None:
            self.policy.adopting(checkpoint.policy)
            self.step_count = checkpoint.step
            self.applied.clear()
            self.applied.extend(checkpoint.windows)
        return checkpoint

    # ----- an adaptive batch (``trainer_runtime/adaptive.py``) -----

    def deciding_batch(self, world_size: int) -> None:
        """Rank 0, as a generation forms, before its state is sent: an adaptive policy
        decides the batch for the generation's size (every rank adopts it with the
        state). The committer reports it from the first commit on (any policy)."""
        if isinstance(self.policy, AdaptiveBatch):
            self.policy.deciding(world_size, self.noise.estimate(), time.monotonic())
        self.committer.batch = self.batch_in_use(world_size)

    def batch_in_use(self, world_size: int) -> BatchInUse:
        """What this job runs at with `world_size` workers, as rank 0 reports it: an
        adaptive policy's decision and the goodput it predicts there by its own fitted step
        times and the gradient noise (0 until both are measured); another policy's batch,
        its accumulation and no goodput (it predicts none)."""
        policy = self.policy
        if not isinstance(policy, AdaptiveBatch):
            accumulation = accumulation_of(policy, world_size)
            return BatchInUse(policy.global_batch(world_size), accumulation, 0.0)
        goodput = policy.predicted_goodput(world_size, self.noise.estimate())
        accumulation = policy.accumulation(world_size)
        return BatchInUse(policy.global_batch(world_size), accumulation, goodput, policy.limits)

    def proposing_batch(self) -> tuple[float, ...]:
        """What this rank adds to the step's vote on the batch: rank 0 an adaptive policy's
        re-decision, if any (`Decision.carried`), everyone else zeros."""
        rank, world_size = self.placing()
        if rank != 0 or not isinstance(self.policy, AdaptiveBatch):
            return NO_DECISION
        decision = self.policy.proposing(world_size, self.noise.estimate(), time.monotonic())
        return NO_DECISION if decision is None else decision.carried()

    def adopting_batch(self, carried: Sequence[float]) -> None:
        """Every rank, at the same step boundary: adopt the re-decision the last step's
        vote carried (the numbers summed over the group), if there was one."""
        decision = Decision.read(carried)
        if decision is not None and isinstance(self.policy, AdaptiveBatch):
            self.policy.adopting_decision(decision)
            self.shape_steps = 0
            rank, world_size = self.placing()
            if rank == 0:
                self.committer.batch = self.batch_in_use(world_size)

    def timing_step(self) -> None:
        """Rank 0, at each step boundary: the last step's wall time, to an adaptive policy
        (not the first step at a shape, which pays its warm-up)."""
        now = time.monotonic()
        rank, world_size = self.placing()
        if self.sharing().among != world_size:  # some ranks stand by: not the shape's time
            self.shape_steps = 0
        elif (
            self.shape_steps >= 2
            and rank == 0
            and isinstance(self.policy, AdaptiveBatch)
            and self.step_started is not None
        ):
            self.policy.observing(world_size, now - self.step_started)
        self.step_started = now
        self.shape_steps += 1

    def ended_cleanly(self, kind: type[BaseException] | None) -> bool:
        if kind is None and not self.done:
            LOG.warning("the session ended before the job did")
        return kind is None

    @abc.abstractmethod
    def forming_generation(self, assignment: Assignment, attempt: int) -> None:
        """Form `assignment`'s group (its `attempt`-th try) and take rank 0's state."""

    @abc.abstractmethod
    def placing(self) -> tuple[int, int]:
        """This worker's rank in its generation, and the generation's size."""

    def sharing(self) -> Share:
        """Among which ranks a step's window is split, and this rank's part: all of the
        generation's ranks, by rank, unless a framework's session keeps some of them out
        for a while (members still taking in rank 0's state, `trainer_runtime.torch.
        streaming`)."""
        rank, world_size = self.placing()
        return Share(rank, world_size)

    @abc.abstractmethod
    def finishing(self) -> bool:
        """The walk is over: whether the job is done (False: re-form and go on)."""

    def leaving_at_boundary(self) -> bool:
        """Whether the group leaves its generation (or re-forms it) at this step boundary."""
        return self.broken or self.leaving_generation

    def checking_commits(self) -> None:
        """At each step boundary, before the step: raise what the committer kept, if the
        framework's session stops on it (nothing by default)."""
        return None

    @property
    def last_micro_batch(self) -> bool:
        """Whether this micro-batch closes the step: the one whose `s.step` synchronizes
        the gradients, applies the optimizer and commits the window."""
        return self.micro_batch == self.micro_batches - 1

    def walking(self) -> Iterator[RankSlice]:
        """This rank's micro-batches of every step's window, until the job ends or the
        worker is drained; the session fetches each one's samples and steps on them. A
        step broken on any micro-batch skips the rest of its window: the group re-forms and
        walks again from the step rank 0's state reached."""
        while True:
            if self.leaving_at_boundary() and not self.reforming():
                return
            self.checking_commits()
            self.timing_step()
            assert self.walk is not None
            _, world_size = self.placing()
            window = self.walk.next_window(self.policy.global_batch(world_size))
            if window is None:
                if self.finishing():
                    return
                continue
            share = self.sharing()
            # with fewer ranks computing than the batch is shaped for, more micro-batches,
            # so that none is larger than the policy's
            spread = -(-world_size // share.among)
            accumulation = accumulation_of(self.policy, world_size) * spread
            parts = micro_slicing(window, share.among, share.index, accumulation)
            self.window, self.window_size = window, parts[0].window_size
            self.local_samples = sum(part.samples for part in parts)
            self.micro_batches = len(parts)
            for self.micro_batch, part in enumerate(parts):
                self.micro_samples = part.samples
                self.stepped = False
                yield part
                if not self.stepped:
                    raise RuntimeError("call s.step(loss) once for every batch")
                if self.broken:
                    break

    def asked_to_leave(self) -> bool:
        """Whether this worker knows its generation is over without asking: this rank or
        a peer saw a change during the last step."""
        return self.leaving_generation

    def assigned(self) -> None:
        """A new generation was assigned: from here on, failures retry it."""
        self.leaving_generation = False

    def drained(self) -> None:
        """The worker is drained: it stops after this. As rank 0 of a generation, what it
        applied is committed first: drained by SIGTERM, its generation is still current (its
        peers may all be leaving too, as when a job's pods are deleted); drained by the
        controller, the generation has closed and these commits are fenced, harmlessly (the
        next reconcile carries them). Then it keeps the job's state (``Keeper.keeping``),
        for a later generation that may have no member of this one. A drained rank 0 whose
        peers stay keeps it too (harmless: their next rank 0 has state of its own and never
        reads it)."""
        if self.placing()[0] != 0 or self.generations_formed == 0:
            return
        self.committer.flushing(self.contract.timeout_s)
        self.keeper.keeping(self.step_count, self.state_to_keep, self.applied)

    @abc.abstractmethod
    def state_to_keep(self) -> tuple[Any, Any, dict[str, Any]]:
        """The model's, the optimizer's and the batch policy's state, to keep."""

    def fenced(self) -> None:
        """The generation closed while it was forming: ask for the newer one."""
        self.leaving_generation = True

    def reforming(self) -> bool:
        """Join the next generation and take rank 0's state; False when the worker must
        stop (drained, or the job is finished).

        A worker that leaves its generation because a newer one opened asks the coordinator
        for it. A worker whose formation or step failed while the coordinator still runs
        the same generation (a slow or stopped peer, a collective's timeout) forms that
        generation again, as its next attempt, under keys of its own: the coordinator opens
        a generation only when membership changes, so waiting for a newer one would wait
        for nothing. At most `max_failed_formations` attempts in a row."""
        for _ in range(self.max_failed_formations):
            if (
                self.assignment is None
                or self.asked_to_leave()
                or hearing_news(self.agent, self.contract.timeout_s)
            ):
                assignment = self.agent.awaiting_assignment()
                if assignment.outcome is Outcome.DRAINED:
                    LOG.info("%s drained at step %d", self.agent.worker_id, self.step_count)
                    self.drained()
                    self.done = True
                    return False
                if assignment.outcome is Outcome.FINISHED:
                    self.done = True
                    return False
                self.assignment, self.attempt = assignment, 0
                self.assigned()
            else:
                self.attempt += 1
            assert self.assignment is not None
            try:
                self.forming_generation(self.assignment, self.attempt)
                self.broken = False
                self.shape_steps = 0  # the step after a formation pays its warm-up
                return True
            except Fenced:
                LOG.info("generation %d closed while forming", self.assignment.generation)
                self.fenced()
            except self.formation_failures as error:  # a peer left, or was too slow
                LOG.info(
                    "forming generation %d (attempt %d) failed: %s",
                    self.assignment.generation,
                    self.attempt,
                    error,
                )
        raise RuntimeError(f"no generation formed after {self.max_failed_formations} attempts")


def holding_state(mark: Sequence[int] | None, leading: Sequence[int] | None) -> bool:
    """Whether a member whose `Member.state_mark` is `mark` holds the state of rank 0, whose
    mark is `leading` (as it came over the wire: a list or a tuple). A framework's state
    broadcast skips the state only when this holds on every member."""
    return mark is not None and leading is not None and tuple(mark) == tuple(leading)


def accumulation_of(policy: BatchPolicy[Any], world_size: int) -> int:
    """The micro-batches a step of `policy` takes at `world_size`: 1 for a job's own
    policy written before accumulation was (it has no `accumulation`)."""
    counting_micro_batches = getattr(policy, "accumulation", None)
    return 1 if counting_micro_batches is None else int(counting_micro_batches(world_size))


def handover(
    step: int,
    view: Any,
    policy_state: dict[str, Any],
    noise_state: dict[str, Any],
    windows: Iterable[StepWindow] = (),
) -> dict[str, Any]:
    """What rank 0 sends with its model when a generation forms: the step its state has
    reached, the coordinator's reconciled `view` of the ledger (epoch, the samples still to
    do, the dataset plan), its batch policy's and its gradient statistics' state, and the
    last `windows` its state applied.

    Why the windows: the coordinator committed them, but a coordinator replaced from a
    saved state older than those commits lacks them, and the rank 0 of the generation
    after that reconciles with the windows it holds. Kept only by the rank 0 that applied
    them, they were lost whenever another worker became rank 0 or a generation formed
    between that saved state and the replacement (measured: the reconcile was refused and
    the job could not form a generation again)."""
    return {
        "step": step,
        "epoch": view.epoch,
        "todo": [(r.start, r.stop) for r in view.todo],
        "plan": (view.samples, view.shard_size, view.epochs, view.seed),
        "policy": policy_state,
        "noise": noise_state,
        "windows": [(w.step, w.epoch, [(r.start, r.stop) for r in w.ranges]) for w in windows],
    }


def adopted_windows(sent: dict[str, Any]) -> list[StepWindow]:
    """The windows rank 0's `handover` says its state applied, oldest first."""
    return [
        StepWindow(int(step), int(epoch), tuple(SampleRange(a, b) for a, b in ranges))
        for step, epoch, ranges in sent.get("windows", ())
    ]


def adopting(sent: dict[str, Any], policy: BatchPolicy[Any], noise: NoiseEstimator) -> Walk:
    """Take rank 0's `handover`: its policy and noise state, and the walk of the samples
    left from its step on (the walk's `step` is the step every rank continues from)."""
    policy.adopting(sent["policy"])
    noise.adopting(sent["noise"])
    step = int(sent["step"])
    return Walk(
        DatasetPlan(*sent["plan"]),
        epoch=int(sent["epoch"]),
        step=step,
        todo=[SampleRange(a, b) for a, b in sent["todo"]],
    )


def noise_state(noise: NoiseEstimator, policy: BatchPolicy[Any], world_size: int) -> dict[str, Any]:
    """Rank 0's gradient statistics for the generation; a job that measured nothing yet
    takes its initial batch now (a custom policy's batch at its first size)."""
    if noise.steps == 0:
        noise.init_batch = initial_batch(policy, world_size)
    return noise.shared_state()


@dataclass(frozen=True, slots=True)
class RankSlice:
    """One rank's part of a step's window, or of its slice: one micro-batch."""

    #: What the rank fetches: its samples, or one stand-in sample when it has none.
    ranges: list[SampleRange]
    #: How many of the window's samples are really its own (0: the stand-in weighs nothing).
    samples: int
    #: How many samples the whole window holds.
    window_size: int


@dataclass(frozen=True, slots=True)
class Share:
    """How a step's window is split: among `among` ranks, this rank taking part `index`
    (None: no part, it stands by with stand-in samples and still takes part in every
    collective)."""

    index: int | None
    among: int


def slicing(window: StepWindow, world_size: int, rank: int | None) -> RankSlice:
    """Rank `rank`'s slice of `window` among `world_size` ranks (None: an empty one). With
    more ranks than samples in the step, an empty slice becomes one stand-in sample whose
    loss is weighted 0, so that the rank still takes part in the step's allreduce."""
    mine = [] if rank is None else slice_of(window.ranges, world_size, rank)
    return standing_in(window, mine)


def micro_slicing(
    window: StepWindow, world_size: int, rank: int | None, parts: int
) -> list[RankSlice]:
    """Rank `rank`'s slice of `window` cut into `parts` consecutive micro-batches (sizes
    within one of each other); an empty one is a stand-in sample weighted 0, as in
    `slicing`, so that every rank runs `parts` backward passes and the same collectives."""
    if parts == 1:  # the hot path without accumulation: nothing more is cut
        return [slicing(window, world_size, rank)]
    mine = [] if rank is None else slice_of(window.ranges, world_size, rank)
    return [standing_in(window, part) for part in splitting_among(mine, parts)]


def standing_in(window: StepWindow, mine: list[SampleRange]) -> RankSlice:
    """`mine` as a rank's part of `window`: one stand-in sample, the window's first, if
    it is empty."""
    samples = counting(mine)
    if samples == 0:
        first = window.ranges[0].start
        mine = [SampleRange(first, first + 1)]
    return RankSlice(mine, samples, counting(window.ranges))
