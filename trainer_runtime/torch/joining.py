"""Joins off the critical path: the next generation's group, built beside the running one.

A generation that only adds members (newcomers registered, nobody left) need not stop its
running members for the group's set-up, which on NCCL is most of a join's pause (building
the communicator: about 1.1 s of the 1.7 s an H200 paused). So:
1. A running member that reads, at a step's start, that a newer generation opened and
   nothing else changed (`WorkerAgent.only_newer_generation`) starts a `Preparation`: a
   thread asks the coordinator for the member's place in that generation without taking
   it, and when the generation keeps every running member at its rank and adds members
   after them (`growing`), checks in at the attempt's roll call (counted as prepared
   first, `grouping.preparing`) and builds the group (`groups.building`), while the
   training thread steps on in the old group.
2. Every step each rank votes (`Joiner.news`; at the step where its preparation starts it
   gives it `PROMPT_S` first): nothing while its preparation runs, "ready" once its group
   is built, "leave now" when it cannot prepare (any other change, a
   preparation declined or failed, or one that ran `PREPARING_WINDOWS` steps). The group
   leaves its generation at the boundary after a step where a rank asked to leave, or all
   of them were ready.
3. At that boundary each running member takes its prepared group (`Joiner.taking`), lets
   the old one go and meets the others at the switch (`grouping.switching`: the newcomers,
   which built the group plainly, wait there), and the state broadcast is the new group's
   first collective.

Training on in the old generation after the new one opened keeps the ledger exact: rank
0's commits of the closed generation are fenced and dropped, and the windows it applied are
reconciled when the new generation forms, as they always are for the step during which a
change is noticed; `PREPARING_WINDOWS` stays well inside the windows every worker keeps.

What must stay true: a member checks in at most once per attempt (a preparation claims
its generation before it checks in, and the session forms that generation's first attempt
from the preparation's outcome, a failure included, never plainly; a preparation that was
given up before it claimed never checks in); no collective runs on a prepared group before
the switch's roll call said BUILD; a prepared group that is not used is let go, and the
others learn it at the switch; a preparation ends within its bounds (the roll call's and
the group's timeouts), and its ranks then leave the plain way.
"""

from __future__ import annotations

import enum
import logging
import threading

import torch

from trainer_runtime.agent import Assignment, WorkerAgent
from trainer_runtime.committing import WINDOWS_KEPT
from trainer_runtime.torch.grouping import (
    StoreHost,
    attempt_store,
    attempt_tag,
    dissolving,
    giving_up_switch,
    meeting,
    nccl_environment,
    preparing,
)
from trainer_runtime.torch.groups import Group, building

LOG = logging.getLogger(__name__)
#: Steps a group trains on in its generation while it prepares the next one, at most: a
#: quarter of the windows every worker keeps for the reconcile (`committing.WINDOWS_KEPT`).
PREPARING_WINDOWS = WINDOWS_KEPT // 4
#: How long the preparation asks the coordinator for the new generation (it opened
#: already: the answer is immediate unless the coordinator is unreachable).
PEEK_S = 2.0
#: How long the training thread waits for a preparation it just started before it votes: a
#: group built in milliseconds (gloo's) is voted ready in that same step, so the group
#: leaves at the boundary where it would have without preparing (else a step later:
#: measured 0.8 s later with 0.4 s steps); a slower one (NCCL's communicator) is waited
#: for by nobody.
PROMPT_S = 0.05


class Readiness(enum.Enum):
    """Where one preparation stands.

    ```
    BUILDING --not a growth, or no answer--> DECLINED   (never checked in: form plainly)
        |-----checked in, group built------> READY      (switch at the boundary)
        +-----checked in, then failed------> FAILED     (that attempt fails: form the next)
    ```
    """

    BUILDING = "building"
    READY = "ready"
    FAILED = "failed"
    DECLINED = "declined"


def growing(live: Assignment, upcoming: Assignment) -> bool:
    """Whether `upcoming` keeps every member of `live` at its rank and adds members after
    them: the generations a running group can prepare (members are ranked oldest first,
    so newcomers come last)."""
    before = [peer.worker_id for peer in sorted(live.peers, key=lambda p: p.rank)]
    after = [peer.worker_id for peer in sorted(upcoming.peers, key=lambda p: p.rank)]
    return (
        upcoming.generation > live.generation
        and len(after) > len(before)
        and after[: len(before)] == before
    )


class Preparation:
    """The next generation's group, built by one thread beside the running group."""

    def __init__(
        self,
        live: Assignment,
        step: int,
        agent: WorkerAgent,
        stores: StoreHost,
        job_id: str,
        device: torch.device,
    ) -> None:
        self.live, self.started_step = live, step
        self.agent, self.stores, self.job_id, self.device = agent, stores, job_id, device
        self.state = Readiness.BUILDING
        #: The generation this member checked in for (None: it never did).
        self.claimed: Assignment | None = None
        self.group: Group | None = None
        self.cancelled = threading.Event()
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self.running, name="edl-prepare", daemon=True)
        self.thread.start()

    def running(self) -> None:
        try:
            upcoming = self.agent.peeking_assignment(PEEK_S)
        except Exception as error:  # any failure to ask: the plain path asks again
            LOG.info("could not ask for the next generation (%s): joining plainly", error)
            upcoming = None
        with self.lock:  # claimed, or given up first: never both (`taking`)
            if upcoming is None or not growing(self.live, upcoming) or self.cancelled.is_set():
                self.state = Readiness.DECLINED
                return
            self.claimed = upcoming
        timeout_s = self.stores.timeout.total_seconds()
        try:
            store = attempt_store(upcoming, 0, self.job_id, self.stores, own=True)
            preparing(store)
            meeting(store, upcoming.rank, upcoming.world_size, timeout_s, self.given_up)
            if self.device.type == "cuda":
                nccl_environment(timeout_s)
            name = f"{self.job_id}/{attempt_tag(upcoming, 0)}"
            group = building(
                store, upcoming.rank, upcoming.world_size, self.device, self.stores.timeout, name
            )
        except RuntimeError as error:  # abandoned, or a peer never built its part
            LOG.info("preparing generation %d failed: %s", upcoming.generation, error)
            self.state = Readiness.FAILED
            return
        with self.lock:
            if self.cancelled.is_set():
                dissolving(group)
                self.state = Readiness.FAILED
                return
            self.group, self.state = group, Readiness.READY

    def given_up(self) -> bool:
        """Whether the preparation stops waiting: cancelled, or anything changed since the
        generation it prepares (a newer one opened, a drain, the end)."""
        assert self.claimed is not None
        return self.cancelled.is_set() or self.agent.changed_since(self.claimed.generation)

    def taking(self, assignment: Assignment, attempt: int) -> Group | None:
        """The prepared group, when the session forms the generation it was prepared for
        (at attempt 0); None when the preparation never checked in (or checked in for
        another generation: it is then given up) and the session forms plainly. Raises
        when it checked in for this attempt and failed, or did not end in time: the
        attempt is over for this member."""
        with self.lock:  # a preparation that has not claimed yet never will
            claimed = self.claimed
            if claimed is None:
                self.cancelled.set()
        if claimed is None or attempt != 0 or claimed.generation != assignment.generation:
            self.cancelling()
            return None
        self.thread.join(timeout=3 * self.stores.timeout.total_seconds())
        with self.lock:
            group, self.group = self.group, None
        if group is None or claimed != assignment:
            self.cancelling()
            dissolving(group)
            raise RuntimeError(
                f"the group prepared for generation {assignment.generation} is not there "
                f"({self.state.value}): forming the next attempt"
            )
        return group

    def cancelling(self) -> None:
        """Give the preparation up: a group it built is let go, and a member that checked in
        tells the others at the switch, so that none of them waits for it there."""
        with self.lock:
            self.cancelled.set()
            group, self.group, claimed = self.group, None, self.claimed
        dissolving(group)
        if claimed is not None:
            store = attempt_store(claimed, 0, self.job_id, self.stores)
            try:
                giving_up_switch(store)
            except RuntimeError as error:  # the store's host is gone: nobody waits there
                LOG.debug("could not give up the switch: %s", error)


class Joiner:
    """A session's preparations of its next generation: at most one, for the live one."""

    def __init__(
        self, agent: WorkerAgent, stores: StoreHost, job_id: str, device: torch.device
    ) -> None:
        self.agent, self.stores, self.job_id, self.device = agent, stores, job_id, device
        self.preparation: Preparation | None = None
        self.enabled = True

    def news(self, live: Assignment | None, step: int) -> tuple[bool, bool]:
        """This rank's vote at a step's start, from memory: whether the group must leave
        its generation now, and whether this rank's prepared group is ready. `live`: the
        generation the running group formed as (None: none, or a broken one). Starts a
        preparation at the first news of a newer generation that may be one."""
        if not self.agent.changed():
            return False, False
        preparation = self.preparation
        if preparation is None or preparation.live is not live:
            if preparation is not None:
                self.cancelling()
            if live is None or not self.enabled or not self.agent.only_newer_generation():
                return True, False
            preparation = Preparation(live, step, self.agent, self.stores, self.job_id, self.device)
            self.preparation = preparation
            preparation.thread.join(PROMPT_S)
        overdue = step - preparation.started_step > PREPARING_WINDOWS
        if overdue or not self.agent.only_newer_generation():
            return True, False
        state = preparation.state
        return state in (Readiness.FAILED, Readiness.DECLINED), state is Readiness.READY

    def taking(self, assignment: Assignment, attempt: int) -> Group | None:
        """The group prepared for `assignment`, if any (`Preparation.taking`); a preparation
        for anything else is given up."""
        preparation, self.preparation = self.preparation, None
        if preparation is None:
            return None
        return preparation.taking(assignment, attempt)

    def cancelling(self) -> None:
        preparation, self.preparation = self.preparation, None
        if preparation is not None:
            preparation.cancelling()
