"""The data-shard ledger: which samples of the current epoch are todo, leased (doing) or done.

The ledger is what makes training exactly-once. It is pure (no clock, no I/O) and
serializable, so the coordinator can persist it after every change and a restarted
coordinator continues from the same ledger.

Two ways to consume it, one per kind of worker group:
- group (allreduce): a generation walks the todo list in order, one global step window at
  a time (see `trainer_runtime.sharding.Walk`); its rank 0 commits the windows, which must be
  exactly the next samples of todo. The last committed windows are kept, so that a new rank 0
  whose state is behind them can take them back (`reverting_to`).
- independent (framework-free workers): each worker leases whole shards from the front of
  todo and commits them; a failed worker's leases go back to the front of todo.

What must stay true: a sample is in exactly one of todo, a lease, or done; done only grows
through a commit; the epoch advances only when todo and the leases are both empty.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from trainer_runtime.protocol.statuses import Conflict
from trainer_runtime.sharding import (
    DatasetPlan,
    SampleRange,
    StepWindow,
    counting,
    is_prefix,
    merging_in_order,
    taking_window,
)

HISTORY_STEPS = 256


class LedgerError(Conflict, ValueError):
    """A commit that would lose or repeat a sample; the ledger is left unchanged."""


@dataclass(frozen=True, slots=True)
class ShardLease:
    lease_id: int
    holder: str
    epoch: int
    samples: SampleRange


@dataclass(slots=True)
class Ledger:
    plan: DatasetPlan
    epoch: int = 0
    committed_step: int = 0
    todo: list[SampleRange] = field(default_factory=list)
    leases: dict[int, ShardLease] = field(default_factory=dict)
    history: deque[StepWindow] = field(default_factory=lambda: deque(maxlen=HISTORY_STEPS))
    next_lease_id: int = 1
    recent_commits: deque[tuple[str, int]] = field(
        default_factory=lambda: deque(maxlen=HISTORY_STEPS)
    )

    @classmethod
    def starting(cls, plan: DatasetPlan) -> Ledger:
        return cls(plan=plan, todo=plan.epoch_order(0))

    # ----- reading -----

    @property
    def finished(self) -> bool:
        return self.epoch >= self.plan.epochs

    @property
    def samples_done_in_epoch(self) -> int:
        if self.finished:
            return 0
        leased = counting(lease.samples for lease in self.leases.values())
        return self.plan.samples - counting(self.todo) - leased

    @property
    def samples_done(self) -> int:
        """Samples committed over the whole job, all epochs."""
        return min(self.epoch, self.plan.epochs) * self.plan.samples + self.samples_done_in_epoch

    def leases_of(self, holder: str) -> list[ShardLease]:
        return [lease for lease in self.leases.values() if lease.holder == holder]

    # ----- group mode: step windows -----

    def committing_windows(self, windows: list[StepWindow]) -> None:
        """Commit consecutive step windows; each must be the next samples of todo.

        The windows of one epoch are checked against todo together: one cut of todo for
        them all (``_cutting_run``), not one per window. A cut walks and copies the rest of
        todo, which holds one range per shard (10^4 for 10^7 samples in shards of 1,000), and
        a commit carries up to a thousand windows: cut per window, the coordinator committed
        under 200 windows a second there, a rank 0 stepping faster ran ever further ahead of
        it, and once past the windows it keeps it could not reconcile a new generation. Any
        commit the fast path refuses goes through ``_committing_one_by_one``, which names the
        first window at fault (and is the reference the tests compare with)."""
        trial = self.copying()
        position = 0
        while position < len(windows):
            end = _run_end(windows, position, trial)
            if end == position or not trial._cutting_run(windows[position:end]):
                trial = self._committing_one_by_one(windows)  # the reference decides
                break
            position = end
        self.adopting(trial)

    def _cutting_run(self, run: list[StepWindow]) -> bool:
        """Take ``run`` (consecutive windows of this epoch, checked by ``_run_end``) off the
        front of todo, if together they are exactly its first samples; False otherwise."""
        if self.leases or any(not w.ranges for w in run):
            return False
        taken = [r for w in run for r in w.ranges]
        size = counting(taken)
        if size > counting(self.todo):
            return False
        expected, rest = taking_window(self.todo, size)
        if merging_in_order(expected) != merging_in_order(taken):
            return False
        self.todo = rest
        self.committed_step = run[-1].step
        self.history.extend(run)
        self.advancing_epoch()
        return True

    def _committing_one_by_one(self, windows: list[StepWindow]) -> Ledger:
        """``committing_windows`` one window at a time: each the next step, of the current
        epoch, and the next samples of todo (raises ``LedgerError`` at the first that is
        not); the ledger it would become."""
        trial = self.copying()
        for window in windows:
            if window.step <= trial.committed_step:
                raise LedgerError(f"step {window.step} is already committed")
            if window.step != trial.committed_step + 1:
                raise LedgerError(f"step {window.step} skips steps after {trial.committed_step}")
            if trial.finished or window.epoch != trial.epoch:
                raise LedgerError(
                    f"step {window.step} is of epoch {window.epoch}, not {trial.epoch}"
                )
            if trial.leases:
                raise LedgerError("shards are leased to single workers: no group commits")
            if not is_prefix(window.ranges, trial.todo):
                raise LedgerError(f"step {window.step} does not take the next samples of todo")
            _, trial.todo = taking_window(trial.todo, counting(window.ranges))
            trial.committed_step = window.step
            trial.history.append(window)
            trial.advancing_epoch()
        return trial

    def reverting_to(self, step: int) -> None:
        """Take back the committed steps after `step` (their samples return to todo's front)."""
        if step >= self.committed_step:
            return
        if self.committed_step - step > len(self.history):
            raise LedgerError(f"cannot revert to step {step}: history too short")
        while self.committed_step > step:
            window = self.history.pop()
            if window.epoch != self.epoch:
                self.epoch = window.epoch
                self.todo = []
            self.todo = merging_in_order([*window.ranges, *self.todo])
            self.committed_step -= 1

    # ----- independent mode: shard leases -----

    def leasing_shard(self, holder: str) -> ShardLease | None:
        """Lease the shard at the front of todo to `holder`; None when todo is empty."""
        if not self.todo:
            return None
        taken, self.todo = taking_window(self.todo, min(len(self.todo[0]), self.plan.shard_size))
        lease = ShardLease(self.next_lease_id, holder, self.epoch, taken[0])
        self.next_lease_id += 1
        self.leases[lease.lease_id] = lease
        return lease

    def committing_leases(self, holder: str, lease_ids: list[int]) -> int:
        """Mark leased shards done; returns the samples committed. Repeating a commit that
        was accepted (its answer was lost) is accepted again and changes nothing."""
        if lease_ids and all((holder, i) in self.recent_commits for i in lease_ids):
            return 0
        for lease_id in lease_ids:
            lease = self.leases.get(lease_id)
            if lease is None or lease.holder != holder:
                raise LedgerError(f"lease {lease_id} is not held by {holder}")
        samples = 0
        for lease_id in lease_ids:
            samples += len(self.leases.pop(lease_id).samples)
            self.recent_commits.append((holder, lease_id))
        self.committed_step += 1
        self.advancing_epoch()
        return samples

    def releasing_leases(self, holder: str) -> int:
        """Return every lease of `holder` to the front of todo; returns how many."""
        released = sorted(self.leases_of(holder), key=lambda lease: lease.lease_id)
        for lease in released:
            del self.leases[lease.lease_id]
        self.todo = [lease.samples for lease in released] + self.todo
        return len(released)

    # ----- shared -----

    def advancing_epoch(self) -> None:
        if self.todo or self.leases or self.finished:
            return
        self.epoch += 1
        if not self.finished:
            self.todo = self.plan.epoch_order(self.epoch)

    def copying(self) -> Ledger:
        return Ledger(
            plan=self.plan,
            epoch=self.epoch,
            committed_step=self.committed_step,
            todo=list(self.todo),
            leases=dict(self.leases),
            history=deque(self.history, maxlen=HISTORY_STEPS),
            next_lease_id=self.next_lease_id,
            recent_commits=deque(self.recent_commits, maxlen=HISTORY_STEPS),
        )

    def adopting(self, other: Ledger) -> None:
        self.epoch = other.epoch
        self.committed_step = other.committed_step
        self.todo = other.todo
        self.leases = other.leases
        self.history = other.history
        self.next_lease_id = other.next_lease_id
        self.recent_commits = other.recent_commits

    # ----- persistence -----

    def to_dict(self) -> dict[str, Any]:
        return {
            "plan": {
                "samples": self.plan.samples,
                "shard_size": self.plan.shard_size,
                "epochs": self.plan.epochs,
                "seed": self.plan.seed,
            },
            "epoch": self.epoch,
            "committed_step": self.committed_step,
            "todo": [[r.start, r.stop] for r in self.todo],
            "leases": [
                [lease.lease_id, lease.holder, lease.epoch, lease.samples.start, lease.samples.stop]
                for lease in self.leases.values()
            ],
            "history": [
                [w.step, w.epoch, [[r.start, r.stop] for r in w.ranges]] for w in self.history
            ],
            "next_lease_id": self.next_lease_id,
            "recent_commits": [[holder, lease_id] for holder, lease_id in self.recent_commits],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Ledger:
        leases = {
            int(lid): ShardLease(int(lid), str(holder), int(epoch), SampleRange(start, stop))
            for lid, holder, epoch, start, stop in data["leases"]
        }
        history = deque(
            (
                StepWindow(int(step), int(epoch), tuple(SampleRange(a, b) for a, b in ranges))
                for step, epoch, ranges in data["history"]
            ),
            maxlen=HISTORY_STEPS,
        )
        plan = DatasetPlan(**data["plan"])
        epoch, step = int(data["epoch"]), int(data["committed_step"])
        todo = [SampleRange(int(a), int(b)) for a, b in data["todo"]]
        if not 0 <= epoch <= plan.epochs:
            raise ValueError(f"epoch {epoch} is outside [0, {plan.epochs}]")
        if step < 0:
            raise ValueError(f"committed_step {step} is negative")
        if any(not 0 <= r.start < r.stop <= plan.samples for r in todo):
            raise ValueError(f"a todo range is outside the dataset [0, {plan.samples})")
        return cls(
            plan=plan,
            epoch=epoch,
            committed_step=step,
            todo=todo,
            leases=leases,
            history=history,
            next_lease_id=int(data["next_lease_id"]),
            recent_commits=deque(
                ((str(h), int(i)) for h, i in data["recent_commits"]), maxlen=HISTORY_STEPS
            ),
        )


def _run_end(windows: list[StepWindow], start: int, ledger: Ledger) -> int:
    """The end of the run of ``windows`` from ``start`` that ``ledger`` could take in one
    cut: consecutive steps after its committed step, all of its current epoch."""
    if ledger.finished:
        return start
    end, step = start, ledger.committed_step
    while end < len(windows) and windows[end].step == step + 1:
        if windows[end].epoch != ledger.epoch:
            break
        step += 1
        end += 1
    return end
