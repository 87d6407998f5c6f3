"""Keeping the live group when a generation only loses members: the shrink-or-re-form seam.

Re-forming a group is destroy, meet, build anew (`grouping.forming`); on NCCL the build is
most of a resize's pause (0.6 s for a graceful shrink on an H200, against 0.33 s for a
process-group shrink in the same setting). A generation whose members are the previous
generation's minus some, in the same order, can instead keep its communicator and drop the
leavers (`torch.distributed.shrink_group`, NCCL's `ncclCommShrink`, NCCL >= 2.27).

When a worker shrinks (`leavers` says which old ranks go):
- its live group is whole, formed as the previous generation, and this is the new
  generation's first attempt (any failure before falls back to building anew);
- every member of the new generation was a member of the previous one, ranked in the same
  order, and at least one member left; the previous rank 0 stays (a shrunk group keeps the
  old group's store, which lives in that worker's process);
- the backend can shrink (`shrinker_for`: NCCL with a PyTorch that has the call).

The members of a generation must all take the same path, since a shrink is a collective of
the survivors. Each one that could shrink says so in the generation's store before it checks
in at the roll call (`offering`); once the roll call's verdict is to build, every member
reads the same count (`agreed`), and all shrink only when all offered. After the shrink
each member reports how it went (`confirming`); if any failed, all of them build a new
group in the same attempt, under keys of their own, so a failed shrink costs one round
trip, not a timeout.

What must stay true: the members of one attempt all shrink or all build; a member that
shrank alone never trains (it waits for the others' reports, bounded); a failed or missing
shrink leaves today's path (`grouping.forming`) whole.
"""

from __future__ import annotations

import enum
import logging
import time
from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist

from trainer_runtime.agent import Assignment
from trainer_runtime.rollcall import ROLL_POLL_S, CountingStore

LOG = logging.getLogger(__name__)
OFFER_KEY = "shrink/offered"
SHRUNK_KEY = "shrink/shrunk"
FAILED_KEY = "shrink/failed"

#: Shrink the live group: the old ranks to drop, and whether pending work is aborted first
#: (the group broke: a peer died inside a collective).
Shrinker = Callable[[list[int], bool], None]


class Reformation(enum.Enum):
    """How a worker's group became the new generation's."""

    SHRUNK = "shrunk"  # the live group kept, without the leavers
    FORMED = "formed"  # a new group built: destroy, meet, initialize


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


def nccl_shrinking(excluded: list[int], aborting: bool) -> None:
    """Shrink the default NCCL group in place: it becomes the survivors' group, ranks
    compacted in their order (`torch.distributed.shrink_group`). The group is bound to
    this process's device first: torch registers the shrunk backend under the bound
    device's type, and a lazily initialized group has none bound."""
    group = dist.distributed_c10d._get_default_group()
    if getattr(group, "bound_device_id", None) is None:
        group.bound_device_id = torch.device("cuda", torch.cuda.current_device())
    c10d = dist.distributed_c10d  # the flags have no public name
    flags = c10d.SHRINK_ABORT if aborting else c10d.SHRINK_DEFAULT
    dist.shrink_group(excluded, shrink_flags=flags)


def shrinker_for(device: torch.device) -> Shrinker | None:
    """The shrink this process's live group can take, or None: only NCCL's, with a PyTorch
    that has the call and a backend that says it can."""
    if device.type != "cuda" or not hasattr(dist, "shrink_group") or not dist.is_initialized():
        return None
    try:
        backend = dist.distributed_c10d._get_default_group()._get_backend(device)
    except RuntimeError:
        return None
    return nccl_shrinking if bool(getattr(backend, "supports_shrinking", False)) else None


def offering(store: CountingStore) -> None:
    """This member could shrink: counted before it checks in at the roll call, so that the
    count is complete once the roll call's verdict is to build."""
    store.add(OFFER_KEY, 1)


def agreed(store: CountingStore, world_size: int) -> bool:
    """After the roll call's BUILD: whether every member offered to shrink (the same answer
    for all of them: nobody offers after checking in)."""
    return int(store.add(OFFER_KEY, 0)) >= world_size


def confirming(store: CountingStore, shrunk: bool, world_size: int, deadline: float) -> bool:
    """Report this member's shrink and wait for everybody's; True when all of them shrank.
    Raises TimeoutError at `deadline` (a `time.monotonic()` time) when some never report."""
    store.add(SHRUNK_KEY if shrunk else FAILED_KEY, 1)
    while True:
        done, failed = int(store.add(SHRUNK_KEY, 0)), int(store.add(FAILED_KEY, 0))
        if failed:
            return False
        if done >= world_size:
            return True
        if time.monotonic() > deadline:
            raise TimeoutError(f"{world_size - done} members never reported their shrink")
        time.sleep(ROLL_POLL_S)


def shrinking(
    store: CountingStore,
    shrinker: Shrinker,
    excluded: Sequence[int],
    aborting: bool,
    world_size: int,
    deadline: float,
) -> bool:
    """Shrink with every member of the attempt (they agreed to); True when all of them
    shrank, False when one failed (then all build a new group instead)."""
    try:
        shrinker(list(excluded), aborting)
        shrunk = True
    except (RuntimeError, TypeError, ValueError) as error:
        LOG.info("shrinking the group failed (%s): building a new one", error)
        shrunk = False
    return confirming(store, shrunk, world_size, deadline)
