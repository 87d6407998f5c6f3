"""Keeping the live group when a generation only loses members: the shrink-or-re-form seam.

Re-forming a group is destroy, meet, build anew (`grouping.forming`); on NCCL the build is
most of a resize's pause (0.6 s for a graceful shrink on an H200, against 0.33 s for a
process-group shrink in the same setting). A generation whose members are the previous
generation's minus some, in the same order, can instead keep its communicator and drop the
leavers (`torch.distributed.shrink_group`, NCCL's `ncclCommShrink`, NCCL >= 2.27).

When a worker shrinks (`leavers` says which old ranks go):
- its live group is whole and healthy, formed as the previous generation, and this is the
  new generation's first attempt (any failure before falls back to building anew; after
  a failed collective torch's watchdog has aborted the communicator, so the survivors of
  a lost peer build anew);
- every member of the new generation was a member of the previous one, ranked in the same
  order, and at least one member left; the previous rank 0 stays (a shrunk group keeps the
  old group's store, which lives in that worker's process);
- the backend can shrink (`shrinker_for`: NCCL with a PyTorch that has the call).

The members of a generation must all take the same path, since a shrink is a collective of
the survivors. Each one that could shrink says so in the generation's store before it checks
in at the roll call (`offering`); once the roll call's verdict is to build, every member
reads the same count (`agreed`), and all shrink only when all offered. After the shrink
each member reports how it went, and one verdict (the first proposed, as the roll call's)
says whether all shrank (`confirming`); if not, all of them build a new group in the same
attempt, under keys of their own. A failure NCCL reports on every member costs one round
trip; one member's failure alone can cost the others NCCL's own bound on the shrink (the
group's timeout), and a member that never reports is given twice that.

What must stay true: the members of one attempt all shrink or all build; a member that
shrank alone never trains (it reads the one verdict, bounded); a failed or missing shrink
leaves today's path (`grouping.forming`) whole.
"""

from __future__ import annotations

import enum
import logging
import time
from collections.abc import Callable, Sequence

from torch._C._distributed_c10d import ErrorType, PrefixStore

from trainer_runtime.agent import Assignment
from trainer_runtime.rollcall import (
    ABANDON,
    BUILD,
    ROLL_POLL_S,
    CountingStore,
    proposing,
    verdict_in,
)
from trainer_runtime.torch.groups import Group, aborting, wrapping

LOG = logging.getLogger(__name__)
OFFER_KEY = "shrink/offered"
SHRUNK_KEY = "shrink/shrunk"
FAILED_KEY = "shrink/failed"
VERDICT_PREFIX = "shrink/"  # the verdict's keys (`rollcall.proposing`)
KEPT, DROPPED = BUILD, ABANDON  # the verdict: every member shrank, or all build anew

#: Shrink the live group: the old ranks to drop; returns the survivors' group (the live
#: one is left for the caller to let go).
Shrinker = Callable[[Group, list[int]], Group]


class Reformation(enum.Enum):
    """How a worker's group became the new generation's."""

    SHRUNK = "shrunk"  # the live group kept, without the leavers
    FORMED = "formed"  # a new group built: let go, meet, build
    PREPARED = "prepared"  # built beside the running group while it trained, switched to


def leavers(previous: Assignment | None, current: Assignment) -> list[int] | None:
    """The previous generation's ranks that `current` drops, when it keeps only members of
    `previous`, in their order, drops at least one and keeps the previous rank 0; None
    otherwise (a newcomer, a reordering, nobody left, or no previous group)."""
    if previous is None or current.generation <= previous.generation:
        return None
    before = [peer.worker_id for peer in sorted(previous.peers, key=lambda p: p.rank)]
    after = [peer.worker_id for peer in sorted(current.peers, key=lambda p: p.rank)]
    kept = [worker for worker in before if worker in after]
    if kept != after or len(after) == len(before) or not after or after[0] != before[0]:
        return None
    return [rank for rank, worker in enumerate(before) if worker not in after]


def nccl_shrinking(live: Group, excluded: list[int]) -> Group:
    """The survivors' group from NCCL's shrink of the live communicator (the backend's
    `shrink`, what `torch.distributed.shrink_group` calls), ranks compacted in their order,
    wrapped as torch wraps a shrunk group, over the live group's store."""
    # (torch's stubs lack `Backend.shrink`; `shrinker_for` checked that it is there)
    shrunk = live.backend().shrink(sorted(excluded))  # type: ignore[attr-defined]
    store = PrefixStore(f"shrunk{live.size}/", live.store)
    return wrapping(shrunk, store, live.device, f"{live.name}/shrunk")


def shrinker_for(live: Group | None) -> Shrinker | None:
    """The shrink this process's live group can take, or None: only NCCL's, with a PyTorch
    whose backend says it can, and a communicator that has not failed (torch's watchdog
    aborts a failed one, `grouping.nccl_environment`: after a lost peer the survivors build
    anew)."""
    if live is None or not live.is_nccl:
        return None
    try:
        backend = live.backend()
        healthy = backend.get_error() == ErrorType.SUCCESS
    except (RuntimeError, AttributeError):
        return None
    can = hasattr(backend, "shrink") and bool(getattr(backend, "supports_shrinking", False))
    if not healthy or not can:
        return None
    return nccl_shrinking


def offering(store: CountingStore) -> None:
    """This member could shrink: counted before it checks in at the roll call, so that the
    count is complete once the roll call's verdict is to build."""
    store.add(OFFER_KEY, 1)


def agreed(store: CountingStore, world_size: int) -> bool:
    """After the roll call's BUILD: whether every member offered to shrink (the same answer
    for all of them: nobody offers after checking in)."""
    return int(store.add(OFFER_KEY, 0)) >= world_size


def confirming(store: CountingStore, shrunk: bool, world_size: int, deadline: float) -> bool:
    """Report this member's shrink and return the attempt's one verdict: True when all of
    them shrank. The verdict is the first proposed (`rollcall.proposing`): KEPT once every
    member reported a shrink, DROPPED once one reported a failure or at `deadline` (a
    `time.monotonic()` time; a member stuck in its shrink), so a member that reads it late
    still takes the path the others took."""
    store.add(SHRUNK_KEY if shrunk else FAILED_KEY, 1)
    while (verdict := verdict_in(store, VERDICT_PREFIX)) == 0:
        done, failed = int(store.add(SHRUNK_KEY, 0)), int(store.add(FAILED_KEY, 0))
        if failed or time.monotonic() > deadline:
            verdict = proposing(store, VERDICT_PREFIX, DROPPED)
            break
        if done >= world_size:
            verdict = proposing(store, VERDICT_PREFIX, KEPT)
            break
        time.sleep(ROLL_POLL_S)
    return verdict == KEPT


def shrinking(
    store: CountingStore,
    shrinker: Shrinker,
    live: Group,
    excluded: Sequence[int],
    world_size: int,
    deadline: float,
) -> Group | None:
    """Shrink `live` with every member of the attempt (they agreed to): the survivors'
    group when all of them shrank (the caller then lets the live one go), None when one
    failed or never reported (then all build a new group instead, and a group this member
    shrank to is let go)."""
    try:
        shrunk: Group | None = shrinker(live, list(excluded))
    except (RuntimeError, TypeError, ValueError) as error:
        LOG.info("shrinking the group failed (%s): building a new one", error)
        shrunk = None
    if confirming(store, shrunk is not None, world_size, deadline):
        return shrunk
    if shrunk is not None:
        aborting(shrunk)
    return None
