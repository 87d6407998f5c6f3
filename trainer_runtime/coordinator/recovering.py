"""What a coordinator started from a saved state learns from its workers before it hands
out work.

Why: a replacement coordinator may start from a state older than the last one its
predecessor answered from. With ``state.kind: snapshot`` the controller keeps the document
``GetSnapshot`` gave at its last poll (every ``snapshot_period_s``), so the commits of up
to one period are missing from it; in independent mode their shards would be leased again
and trained twice. The workers that made those commits know them. Each coordinator process
is an *incarnation* (a random name it gives in every reply); a worker that meets another
incarnation than the one it registered with (a notice, a reply, or a lease or commit
refused for naming the old one) registers again, and reports what it trained in its latest
epoch (``RegisterRequest.trained``), the newest generation it was a member of and the
newest lease id it held. The new incarnation merges each report into its ledger
(``merging_trained``), and hands out no shard and gives no generation until every worker
its state knew has registered again or gone, or the grace (the lease timeout) has passed.
The generation it then opens, and its lease ids, are newer than any a worker reported, so
no number the old incarnation gave out is given again to a live worker. (In group mode the
steps are given back otherwise: that generation's rank 0 reconciles with the windows its
state applied, ``generations.handover``.)

```
RecoveryPhase:
(state loaded from a document) -> AWAITING --every known worker heard from or gone,
                                              and SETTLE_S passed; or the grace passed--> OPEN
(state started afresh)         -> OPEN
```

What must stay true:
- merging a report only moves samples of the ledger's epoch from todo, or from a lease the
  saved state held, to done, and ends the epochs a report shows ended (a report of a later
  epoch: the old incarnation advanced only once every sample of the epoch was committed);
  merging a report again changes nothing;
- a lease granted by this incarnation is never taken back by a report (its holder is
  training it): samples reported late, once the recovery opened, that were leased again
  are counted in ``Merged.conflicting`` and trained twice;
- while AWAITING, no shard is leased and no generation is given;
- a report that names an epoch outside the plan or samples outside the dataset is refused
  whole (``ReportError``), the ledger unchanged.

Trust: a report is believed as a commit is, from the worker whose credential sent it (a
worker acts only for itself: ``protocol/checks``); it can mark done only samples of the
dataset not yet done.

Limit: what a worker trained is known only to it. A worker that committed after the saved
state and then died or left before the replacement heard from it takes that knowledge
along: those samples are trained again. That needs a second failure within one snapshot
period; ``state.kind: volume`` (every change saved before it is answered) has no such window.
A coordinator that starts afresh (replaced before the controller kept any snapshot) merges
reports too, but does not wait for them: a shard it leased before the report came is
trained twice.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from trainer_runtime.coordinator.ledger import Ledger
from trainer_runtime.protocol.statuses import Malformed
from trainer_runtime.sharding import DatasetPlan, SampleRange

#: The least time a recovery waits once every worker its state knew has been heard from,
#: for the workers that joined after the saved state (it does not know them): a live
#: worker reconnects within a few tenths of a second (its retry pauses are at most 0.1 s).
SETTLE_S = 1.0


class ReportError(Malformed, ValueError):
    """A worker's report of what it trained is malformed; nothing of it was merged."""


class RecoveryPhase(enum.Enum):
    """Whether the coordinator still waits for its workers' reports (the module docstring
    has the diagram)."""

    AWAITING = "awaiting"
    OPEN = "open"


@dataclass(frozen=True, slots=True)
class TrainedRange:
    """Samples one worker trained in one epoch (``RegisterRequest.trained``)."""

    epoch: int
    samples: SampleRange


@dataclass(frozen=True, slots=True)
class Merged:
    """What merging one report did."""

    samples: int = 0  # samples newly marked done
    epochs_ended: int = 0  # epochs the report showed ended
    conflicting: int = 0  # samples this incarnation had leased again: trained twice


@dataclass(slots=True)
class Recovery:
    """The workers a restarted coordinator waits for, and until when."""

    phase: RecoveryPhase = RecoveryPhase.OPEN
    awaited: set[str] = field(default_factory=set)
    since: float = 0.0
    grace_s: float = 0.0
    #: The newest generation a worker reported: the next one opened is newer.
    newest_generation: int = 0
    #: Leases numbered from here on were granted by this incarnation.
    first_lease_id: int = 0

    @classmethod
    def awaiting(
        cls, workers: Iterable[str], now: float, grace_s: float, first_lease_id: int
    ) -> Recovery:
        if grace_s <= 0:
            raise ValueError(f"the recovery grace is {grace_s} s: it must be positive")
        return cls(RecoveryPhase.AWAITING, set(workers), now, grace_s, 0, first_lease_id)

    def is_open(self) -> bool:
        return self.phase is RecoveryPhase.OPEN

    def hearing(self, worker_id: str, last_generation: int) -> None:
        """A worker registered (again): it is no longer awaited."""
        self.awaited.discard(worker_id)
        self.newest_generation = max(self.newest_generation, last_generation)

    def forgetting(self, worker_id: str) -> None:
        """A worker left or expired: its report will not come."""
        self.awaited.discard(worker_id)

    def opening_due(self, now: float) -> bool:
        if self.is_open():
            return False
        waited = now - self.since
        return waited >= self.grace_s or (not self.awaited and waited >= SETTLE_S)

    def opening(self) -> None:
        self.phase = RecoveryPhase.OPEN
        self.awaited.clear()


def checking_report(plan: DatasetPlan, trained: Sequence[TrainedRange]) -> None:
    """Refuse a report that no worker of this dataset plan could have made."""
    for item in trained:
        if not 0 <= item.epoch < plan.epochs:
            raise ReportError(
                f"a trained range is of epoch {item.epoch}, outside the plan's "
                f"[0, {plan.epochs}): report only epochs of this job"
            )
        if item.samples.stop > plan.samples:
            raise ReportError(
                f"trained samples {item.samples.start}..{item.samples.stop} are outside "
                f"the dataset [0, {plan.samples})"
            )


def merging_trained(ledger: Ledger, trained: Sequence[TrainedRange], first_lease_id: int) -> Merged:
    """Merge one worker's report into `ledger` (the module docstring says what holds)."""
    checking_report(ledger.plan, trained)
    if ledger.finished or not trained:
        return Merged()
    latest = max(item.epoch for item in trained)
    ended = 0
    done = conflicting = 0
    if latest > ledger.epoch:
        # The old incarnation advanced past this epoch: each of its samples was committed.
        # The saved state's leases of it are dropped; a lease this incarnation granted
        # (a late report) stays with its holder, whose commit of it is still answered.
        ended = latest - ledger.epoch
        ledger.epoch = latest
        ledger.todo = ledger.plan.epoch_order(latest)
        for lease_id, lease in list(ledger.leases.items()):
            if lease_id >= first_lease_id:
                conflicting += len(lease.samples)
            else:
                del ledger.leases[lease_id]
    for item in trained:
        if item.epoch != ledger.epoch:
            continue  # an epoch already ended here
        ledger.todo, removed = subtracting(ledger.todo, item.samples)
        done += removed
        for lease in sorted(ledger.leases.values(), key=lambda lease: lease.lease_id):
            if lease.epoch != item.epoch:
                continue
            overlap = overlapping(lease.samples, item.samples)
            if overlap == 0:
                continue
            if lease.lease_id >= first_lease_id:
                conflicting += overlap
                continue
            # A lease of the saved state, trained and committed after it was saved: done.
            # Whatever of it the report does not cover goes back to the front of todo.
            del ledger.leases[lease.lease_id]
            rest, _ = subtracting([lease.samples], item.samples)
            ledger.todo = rest + ledger.todo
            done += overlap
    ledger.advancing_epoch()
    return Merged(done, ended, conflicting)


def overlapping(a: SampleRange, b: SampleRange) -> int:
    return max(0, min(a.stop, b.stop) - max(a.start, b.start))


def subtracting(ranges: Sequence[SampleRange], cut: SampleRange) -> tuple[list[SampleRange], int]:
    """`ranges` without the samples of `cut`, in their order; and how many were removed."""
    kept: list[SampleRange] = []
    removed = 0
    for current in ranges:
        overlap = overlapping(current, cut)
        if overlap == 0:
            kept.append(current)
            continue
        removed += overlap
        if current.start < cut.start:
            kept.append(SampleRange(current.start, cut.start))
        if cut.stop < current.stop:
            kept.append(SampleRange(cut.stop, current.stop))
    return kept, removed
