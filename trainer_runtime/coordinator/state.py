"""The whole state of one job's coordinator, and every decision it makes, with no I/O.

The server (`serving.py`) is a thin executor: it authenticates a call, takes one lock, calls
one method here, persists `to_json()` when the state changed, and wakes waiting workers.
Everything that decides (fencing, who is rank 0, whether a commit is exactly-once, when a
generation opens) lives here or in the ledger and membership it holds, and is unit-tested
with a fake clock.

What must stay true:
- A commit from a worker that is not rank 0 of the current generation (group mode), or
  that does not hold its leases (independent mode), is refused, with the state unchanged.
- A lease or a commit that names another incarnation than this state's is refused
  (`Reincarnated`): its lease ids and generation numbers are another process's.
- A worker that departs gives back its leases at once.
- `from_json(to_json())` is the same state, so a restarted coordinator goes on from it;
  a state loaded so recovers first (`recovering.py`): it may be older than what its
  predecessor answered, and its workers report what it lacks.
"""

from __future__ import annotations

import json
import logging
import secrets
from dataclasses import dataclass, field
from typing import Any

from trainer_runtime.coordinator.ledger import Ledger, LedgerError, ShardLease
from trainer_runtime.coordinator.membership import Membership, WorkerPhase
from trainer_runtime.coordinator.records import BatchRecord, NoiseRecord, ThroughputRecord
from trainer_runtime.coordinator.recovering import (
    Recovery,
    ReportError,
    TrainedRange,
    merging_trained,
)
from trainer_runtime.protocol.options import ConsumptionMode
from trainer_runtime.protocol.statuses import Replaced, Stale
from trainer_runtime.sharding import DatasetPlan, StepWindow, counting

LOG = logging.getLogger(__name__)


class FencedError(Stale, PermissionError):
    """The caller may not do this in the current generation (a stale or foreign worker)."""


class Reincarnated(Replaced, FencedError):
    """The call names another incarnation of the coordinator (the one the worker registered
    with was replaced): the worker registers again and reports what it trained."""


def new_incarnation() -> str:
    """A name for one coordinator process, unique across its replacements."""
    return secrets.token_hex(8)


@dataclass(frozen=True, slots=True)
class Rejoin:
    """A worker registering again because the incarnation it knew was replaced: which one,
    the newest generation it was a member of, and what it trained in its latest epoch."""

    previous_incarnation: str
    last_generation: int
    trained: tuple[TrainedRange, ...] = ()
    last_lease_id: int = 0


@dataclass(frozen=True, slots=True)
class GenerationView:
    """What one worker learns when it asks for the current generation."""

    phase: WorkerPhase
    number: int
    rank: int
    members: tuple[tuple[str, int, str, str], ...]  # (worker_id, rank, node, store_address)
    finished: bool
    servers: tuple[tuple[str, int, str, str], ...] = ()  # parameter servers, layout order
    retiring: tuple[tuple[str, int, str, str], ...] = ()  # drained servers not yet released


@dataclass(slots=True)
class CoordinatorState:
    mode: ConsumptionMode
    ledger: Ledger
    membership: Membership
    throughput: dict[tuple[int, int], ThroughputRecord] = field(default_factory=dict)
    worker_rates: dict[str, float] = field(default_factory=dict)
    noise: NoiseRecord | None = None
    batch: BatchRecord | None = None  # what rank 0 runs at, as it last reported
    #: This process's name, given in every reply; not saved (a replacement has its own).
    incarnation: str = field(default_factory=new_incarnation)
    #: Open, unless this state was loaded from a document (``from_json``).
    recovery: Recovery = field(default_factory=Recovery)

    @classmethod
    def starting(
        cls,
        plan: DatasetPlan,
        mode: ConsumptionMode = ConsumptionMode.GROUP,
        join_window_s: float = 0.2,
        lease_timeout_s: float = 10.0,
    ) -> CoordinatorState:
        return cls(
            mode=mode,
            ledger=Ledger.starting(plan),
            membership=Membership(join_window_s=join_window_s, lease_timeout_s=lease_timeout_s),
        )

    # ----- membership -----

    def registering(
        self,
        worker_id: str,
        node: str,
        store_address: str,
        now: float,
        server: bool = False,
        rejoin: Rejoin | None = None,
    ) -> None:
        """Add a worker (or, `server`, a parameter server) to the next generation; with
        `rejoin`, merge what it trained under the incarnation it knew (``rejoining``).

        One that arrives after the last commit is not added and not refused: its next
        question (`AwaitGeneration`, `Watch`) tells it the job finished, so it exits 0 like
        its peers. (A controller may start a replacement or a grown worker just as the job
        ends; refusing it made it fail, and its failure was charged to the job's restarts.)
        """
        if not server and worker_id in self.membership.servers:
            raise FencedError(f"{worker_id} is registered as a parameter server")
        if rejoin is not None:
            self.rejoining(worker_id, rejoin)  # checks the whole report before it changes
        if self.ledger.finished:
            return
        if not server:
            self.membership.registering(worker_id, node, store_address, now)
            self.recovery.hearing(worker_id, rejoin.last_generation if rejoin else 0)
            return
        if self.mode is not ConsumptionMode.GROUP:
            raise FencedError("parameter servers need a coordinator in group mode")
        try:
            self.membership.registering_server(worker_id, node, store_address, now)
        except ValueError as error:
            raise FencedError(str(error)) from error

    def rejoining(self, worker_id: str, rejoin: Rejoin) -> None:
        """Merge what a worker trained under the incarnation it knew into the ledger.

        Its report is all it trained and it holds no shard now (a plain worker rejoins
        between shards, or once its commit was refused, that shard in the report): the
        leases the saved state gives it and the report does not cover go back to todo."""
        if rejoin.previous_incarnation == self.incarnation:
            raise ReportError(
                "previous_incarnation is this coordinator's own: a worker reports only to "
                "the incarnation that replaced the one it registered with"
            )
        if rejoin.last_generation < 0 or rejoin.last_lease_id < 0:
            raise ReportError(
                f"last_generation {rejoin.last_generation} or last_lease_id "
                f"{rejoin.last_lease_id} is negative: neither ever is"
            )
        if rejoin.trained and self.mode is not ConsumptionMode.INDEPENDENT:
            raise ReportError(
                "trained ranges are reported in independent mode only: a group's rank 0 "
                "reports its steps by Reconcile"
            )
        merged = merging_trained(self.ledger, rejoin.trained, self.recovery.first_lease_id)
        released = self.ledger.releasing_leases(worker_id)
        # Lease ids, like generations, go on past the old incarnation's, as far as its
        # live workers know them: a log or a worker's record never names two leases alike.
        self.ledger.next_lease_id = max(self.ledger.next_lease_id, rejoin.last_lease_id + 1)
        LOG.info(
            "%s registers again (it knew incarnation %s): %d samples it trained merged, "
            "%d epochs ended, %d leases of the saved state back to todo",
            worker_id,
            rejoin.previous_incarnation[:16],
            merged.samples,
            merged.epochs_ended,
            released,
        )
        if merged.conflicting:
            LOG.warning(
                "%s reported %d samples this coordinator had leased again: trained twice",
                worker_id,
                merged.conflicting,
            )
        if self.recovery.is_open() and rejoin.last_generation >= self.membership.generation:
            # A worker this state did not know reported late, from a generation this
            # incarnation has not reached: open a newer one, so that it is not waited for.
            self.membership.generation = rejoin.last_generation
            self.membership.departed = True

    def is_recovering(self) -> bool:
        """Whether the workers' reports are still awaited: no shard, no generation yet."""
        return not self.recovery.is_open()

    def checking_incarnation(self, incarnation: str) -> None:
        if not incarnation:
            raise ReportError(
                "incarnation is empty: register first, and name the incarnation its reply gave"
            )
        if incarnation != self.incarnation:
            raise Reincarnated(
                f"incarnation {incarnation[:16]} was replaced by {self.incarnation}: "
                "register again, reporting what was trained"
            )

    def departing(self, worker_id: str) -> None:
        """A worker left, failed or expired: forget it and take back its leases."""
        self.recovery.forgetting(worker_id)
        self.membership.removing(worker_id)
        self.ledger.releasing_leases(worker_id)
        self.worker_rates.pop(worker_id, None)

    def draining(self, worker_id: str) -> bool:
        return self.membership.draining(worker_id)

    def ticking(self, now: float) -> bool:
        """Expire silent workers and open a generation when one is due; True if it changed."""
        changed = False
        for worker_id in self.membership.expiring(now):
            self.ledger.releasing_leases(worker_id)
            self.worker_rates.pop(worker_id, None)
            self.recovery.forgetting(worker_id)
            changed = True
        if self.is_recovering():
            if not self.recovery.opening_due(now):
                return changed
            # Newer than any generation a worker reported: no number is used twice.
            self.recovery.opening()
            self.membership.generation = max(
                self.membership.generation, self.recovery.newest_generation
            )
            self.membership.opening()
            self.worker_rates.clear()
            LOG.info("recovered: generation %d opens", self.membership.generation)
            return True
        if self.membership.opening_due(now):
            self.membership.opening()
            # A rate belongs to the membership it was measured in: a new size's record
            # waits until each of its members has committed in it.
            self.worker_rates.clear()
            changed = True
        return changed

    def viewing_generation(self, worker_id: str) -> GenerationView:
        phase = self.membership.phase_of(worker_id)
        members = tuple(
            (w.worker_id, rank, w.node, w.store_address)
            for rank, w in enumerate(self.membership.members())
        )
        is_worker = worker_id in self.membership.ranked
        rank = self.membership.rank_of(worker_id) if is_worker else -1
        servers = tuple(
            (s.worker_id, rank, s.node, s.store_address)
            for rank, s in enumerate(self.membership.server_members())
        )
        retiring = tuple(
            (s.worker_id, -1, s.node, s.store_address) for s in self.membership.retiring.values()
        )
        return GenerationView(
            phase,
            self.membership.generation,
            rank,
            members,
            self.ledger.finished,
            servers,
            retiring,
        )

    # ----- group mode -----

    def checking_rank0(self, worker_id: str, generation: int) -> None:
        if self.mode is not ConsumptionMode.GROUP:
            raise FencedError("this job's workers lease shards; step windows are refused")
        if generation != self.membership.generation:
            raise FencedError(
                f"generation {generation} is stale; the current one is {self.membership.generation}"
            )
        if not self.membership.ranked or self.membership.ranked[0] != worker_id:
            raise FencedError(f"{worker_id} is not rank 0 of generation {generation}")

    def reconciling(
        self, worker_id: str, generation: int, step: int, windows: list[StepWindow]
    ) -> None:
        """Make the ledger match the state rank 0 broadcast: take back committed steps its
        state lacks, then commit the steps its state has and the ledger lacks."""
        self.checking_rank0(worker_id, generation)
        trial = self.ledger.copying()
        if step == 0 and self.ledger.committed_step > 0:
            # rank 0 has no state (a job suspended to zero workers without a checkpoint):
            # the job starts over, said loudly, even past what the history could revert
            LOG.warning(
                "rank 0 %s has no state: the ledger rolls back from step %d to step 0",
                worker_id,
                self.ledger.committed_step,
            )
            trial = Ledger.starting(self.ledger.plan)
            trial.next_lease_id = self.ledger.next_lease_id
        trial.reverting_to(step)
        missing = [w for w in windows if w.step > trial.committed_step]
        trial.committing_windows(missing)
        if trial.committed_step != step:
            raise LedgerError(
                f"rank 0 is at step {step} but the ledger reached {trial.committed_step}"
            )
        self.ledger.adopting(trial)

    def committing_windows(
        self,
        worker_id: str,
        generation: int,
        windows: list[StepWindow],
        step_time_s: float,
        noise: NoiseRecord | None = None,
        incarnation: str | None = None,
        batch: BatchRecord | None = None,
    ) -> None:
        """Commit rank 0's windows; `incarnation`, when given, must be this one.

        The size's throughput is recorded at the global batch of the last fresh window that
        does not end its epoch: a window's samples are its step's global batch, except an
        epoch's last window, which holds what was left (shorter): counted, it would start
        the record again at a batch the job does not run at."""
        if incarnation is not None:
            self.checking_incarnation(incarnation)
        self.checking_rank0(worker_id, generation)
        fresh = [w for w in windows if w.step > self.ledger.committed_step]
        self.ledger.committing_windows(fresh)
        after = [w.epoch for w in fresh[1:]] + [self.ledger.epoch]  # the next step's epoch
        whole = [w for w, then in zip(fresh, after[: len(fresh)], strict=True) if then == w.epoch]
        if whole:
            size = counting(whole[-1].ranges)
            self.recording_throughput(size, step_time_s, batch=size)
        if noise is not None:
            self.recording_noise(noise)
        if batch is not None:
            self.recording_batch(batch)

    def recording_batch(self, batch: BatchRecord) -> None:
        """Keep the latest valid report of what rank 0 runs at; an invalid one is dropped
        with a warning (the previous one stays), never refusing the commit it came with."""
        problem = batch.problem()
        if problem is not None:
            LOG.warning("batch in use dropped: %s", problem)
            return
        self.batch = batch

    def recording_noise(self, noise: NoiseRecord) -> None:
        """Keep the latest valid gradient statistics; an invalid record is dropped with a
        warning (the previous one stays), never refusing the commit it came with."""
        problem = noise.problem()
        if problem is not None:
            LOG.warning("gradient statistics dropped: %s", problem)
            return
        self.noise = noise

    # ----- independent mode -----

    def checking_holder(self, worker_id: str) -> None:
        if self.mode is not ConsumptionMode.INDEPENDENT:
            raise FencedError("this job is an allreduce group; single shard leases are refused")
        if self.membership.phase_of(worker_id) not in (WorkerPhase.MEMBER, WorkerPhase.DRAINED):
            raise FencedError(f"{worker_id} is not a member of the job")

    def leasing_shard(
        self, worker_id: str, generation: int, incarnation: str | None = None
    ) -> ShardLease | None:
        """The worker's next shard; None when there is none to give now (drained, todo
        empty, or the workers' reports still awaited). `incarnation`, when given (always,
        over the API), must be this one."""
        if incarnation is not None:
            self.checking_incarnation(incarnation)
        self.checking_holder(worker_id)
        if self.membership.phase_of(worker_id) is WorkerPhase.DRAINED or self.is_recovering():
            return None
        if generation != self.membership.generation:
            raise FencedError(f"generation {generation} is stale")
        held = self.ledger.leases_of(worker_id)
        if held:  # asking again (the answer was lost) gets the lease already held
            return held[0]
        return self.ledger.leasing_shard(worker_id)

    def committing_leases(
        self,
        worker_id: str,
        lease_ids: list[int],
        step_time_s: float,
        incarnation: str | None = None,
    ) -> None:
        """Commit leases the worker holds; `incarnation`, when given (always, over the
        API), must be this one: lease ids are numbered by each incarnation."""
        if incarnation is not None:
            self.checking_incarnation(incarnation)
        self.checking_holder(worker_id)
        samples = self.ledger.committing_leases(worker_id, lease_ids)
        if step_time_s > 0:
            self.worker_rates[worker_id] = samples / step_time_s
        # The size's throughput is the sum of its members' rates in this generation,
        # recorded only once each member has one: a worker that just joined has not
        # committed yet (counted as 0, it undercounted a grown size and biased the planner's
        # speed-ups), and a survivor's rate from the old size is not this size's (the rates
        # are cleared when a generation opens).
        rates = [self.worker_rates.get(w.worker_id) for w in self.membership.members()]
        known = [rate for rate in rates if rate is not None]
        if len(known) == len(rates):
            self.recording_throughput(sum(known) * step_time_s, step_time_s)

    # ----- throughput -----

    def recording_throughput(self, samples: float, step_time_s: float, batch: int = 0) -> None:
        """One step of `samples` in `step_time_s` at the current size, at global `batch`
        (0: not known)."""
        key = (self.membership.nodes(), len(self.membership.ranked))
        record = self.throughput.setdefault(key, ThroughputRecord(*key))
        record.recording(round(samples), step_time_s, batch)

    # ----- persistence -----

    def to_json(self) -> str:
        return json.dumps(
            {
                "format": 1,
                "mode": self.mode.value,
                "ledger": self.ledger.to_dict(),
                "membership": self.membership.to_dict(),
                "throughput": [
                    [r.nodes, r.workers, r.samples_per_s, r.step_time_s, r.steps, r.batch]
                    for r in self.throughput.values()
                ],
                "batch": None
                if self.batch is None
                else [
                    self.batch.global_batch,
                    self.batch.accumulation,
                    self.batch.goodput,
                    *self.batch.bounds(),
                ],
                "noise": None
                if self.noise is None
                else [
                    self.noise.init_batch,
                    self.noise.grad_sqr,
                    self.noise.grad_var,
                    self.noise.steps,
                ],
            },
            sort_keys=True,
        )

    @classmethod
    def from_json(cls, text: str, now: float, incarnation: str | None = None) -> CoordinatorState:
        """The state a document holds, recovering (``recovering.py``); a new incarnation
        unless `incarnation` names this process's own (a state read back in place)."""
        data: dict[str, Any] = json.loads(text)
        if not isinstance(data, dict):
            raise ValueError(f"the document is a JSON {type(data).__name__}, not an object")
        if data.get("format") != 1:
            raise ValueError(f"unknown coordinator state format {data.get('format')!r}")
        throughput = {  # a row saved before the batch was kept has 5 numbers: batch 0
            (int(row[0]), int(row[1])): ThroughputRecord(
                int(row[0]),
                int(row[1]),
                float(row[2]),
                float(row[3]),
                int(row[4]),
                int(row[5]) if len(row) > 5 else 0,
            )
            for row in data["throughput"]
        }
        batch = data.get("batch")  # absent in states saved before it was reported
        membership = Membership.from_dict(data["membership"], now)
        membership.restoring_after_restart(now)
        noise = data.get("noise")  # absent in states saved before it was measured
        ledger = Ledger.from_dict(data["ledger"])
        return cls(
            mode=ConsumptionMode(data["mode"]),
            ledger=ledger,
            membership=membership,
            throughput=throughput,
            noise=None
            if noise is None
            else NoiseRecord(int(noise[0]), float(noise[1]), float(noise[2]), int(noise[3])),
            batch=None
            if batch is None
            # (a row saved before the bounds were kept has 3 numbers: no bounds)
            else BatchRecord(int(batch[0]), int(batch[1]), float(batch[2]), *map(int, batch[3:6])),
            incarnation=new_incarnation() if incarnation is None else incarnation,
            # The document may be older than what the last incarnation answered: hear
            # from the workers it knew (each has a full lease timeout to reconnect).
            recovery=Recovery.awaiting(
                membership.workers, now, membership.lease_timeout_s, ledger.next_lease_id
            ),
        )
