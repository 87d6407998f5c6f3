"""The roll call before a generation's group is built, the same for every framework: each
member checks in, and one verdict per attempt, BUILD or ABANDON, says whether the group is
built.

Why a roll call at all: a framework's group constructor waits for every member, and not
always within a bound (NCCL's blocking communicator set-up; Paddle's constructor, measured
blocked far past its store's timeout). So the members first meet with counters only, in a
store every one of them reaches (the store of rank 0, under a prefix of the attempt's own),
and build the group only once all of them came.

Why one verdict, the first proposed: rank 0 proposes BUILD once everybody arrived; any
member proposes ABANDON when it stops waiting (its deadline passed, or a newer generation
opened). A member that arrived and then gave up can therefore never be counted in a group
that is built (its "arrived" stays counted, but its ABANDON came first), and a member that
comes to an attempt its peers gave up on learns it at once and moves on to the next.

The store needs one operation, an atomic `add` that returns the new sum (torch's and
Paddle's TCPStore both have it); the first proposal is the one whose proposer took ticket 1.

What must stay true: every member of an attempt gets the same verdict; a member that
proposed ABANDON never takes part in a BUILD of that attempt; every wait is bounded (the
deadline, and `VERDICT_GRACE_S` for a proposer that died between its ticket and its
verdict).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol

#: The verdict on one attempt, as the store's counter holds it (0: none yet).
BUILD, ABANDON = 1, 2
ROLL_POLL_S = 0.005
#: How long a member whose proposal lost waits for the winner to write its verdict (the
#: winner writes it right after taking the ticket; only a crash in between leaves it unset).
VERDICT_GRACE_S = 10.0


class CountingStore(Protocol):
    """The one store operation the roll call uses."""

    def add(self, key: str, amount: int, /) -> int: ...


class Abandoned(RuntimeError):
    """The attempt was given up: not every member came in time, or a newer generation
    opened. The member forms its next attempt (or the newer generation)."""


def verdict_in(store: CountingStore, prefix: str) -> int:
    """The verdict on this attempt, or 0 while there is none."""
    return int(store.add(prefix + "verdict", 0))


def proposing(store: CountingStore, prefix: str, verdict: int) -> int:
    """Propose `verdict` for this attempt; returns the verdict that stands: the first one
    proposed (whoever takes ticket 1 writes it), ABANDON if its proposer never wrote it."""
    if int(store.add(prefix + "ticket", 1)) == 1:
        store.add(prefix + "verdict", verdict)
        return verdict
    deadline = time.monotonic() + VERDICT_GRACE_S
    while (standing := verdict_in(store, prefix)) == 0 and time.monotonic() < deadline:
        time.sleep(ROLL_POLL_S)
    return standing or ABANDON


def calling_roll(
    store: CountingStore,
    prefix: str,
    rank: int,
    world_size: int,
    given_up: Callable[[], bool],
    deadline: float,
) -> None:
    """Check in under `prefix`, and return once the verdict on this attempt is BUILD; raise
    `Abandoned` once it is ABANDON (proposed by this member at `deadline`, a
    `time.monotonic()` time, or on `given_up()`, or by another)."""
    store.add(prefix + "arrived", 1)
    while (verdict := verdict_in(store, prefix)) == 0:
        if rank == 0 and int(store.add(prefix + "arrived", 0)) >= world_size:
            verdict = proposing(store, prefix, BUILD)
            break
        if given_up() or time.monotonic() > deadline:
            verdict = proposing(store, prefix, ABANDON)
            break
        time.sleep(ROLL_POLL_S)
    if verdict != BUILD:
        raise Abandoned(
            f"attempt {prefix} given up: not every member came in time, the attempt is "
            f"abandoned (rank {rank})"
        )
