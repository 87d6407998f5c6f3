"""``plan(snapshot, policy, now) -> Plan``: the one planner that every driver calls.

The cycle, in order:

1. Validate the snapshot (``validating``): inconsistent nodes raise a typed error naming
   the node, and nothing is planned; a job whose state the planner cannot accept is set
   aside (its replicas stay and take their capacity; its decision names the problem and
   the fix) and the others are planned as if it were not there.
2. Open a session: capacity left on every node after other pods and every live replica;
   reservations from the last plan that still hold; jobs ranked by the policy. What a
   job's spec asks now is obeyed first (``complying``): a running job whose spec says
   ``suspend`` gives up every replica, one above its maximum the surplus. Where the policy
   grows by marginal gain, a running job that its own measurements say runs faster at a
   smaller size goes back to it (``retreating``), so that what it frees is for the others.
3. Admit (``admitting``): in rank order, every waiting job starts as a whole gang, taking
   workers (or whole jobs) from lower-ranked ones where the policy allows; or it says why
   it waits.
4. Grow (``growing``): idle GPUs go to running jobs below their maximum, unless a
   stability rule holds a job back. Growth can give a worker to a job ranked below one
   that waits; since a job's workers are interchangeable, another of its workers may then
   be the one that lets the waiting gang start. So 3 and 4 repeat (a bounded number of
   times) while they still start jobs.
5. Write the plan: per job and role the target, the node of each new replica, the named
   replicas to remove, the reason; and the reservations that keep freed GPUs for the job
   they were freed for.
6. Guard: no node that receives a replica may end over-committed (a bug if it happens).

Pure: no clock (``now`` is an argument), no randomness, no I/O, and no other parameter or
side effect: the same snapshot, policy and ``now`` give the same plan in any process, at
any time. It is the reference every driver trusts. A driver that plans again and again
over mostly the same jobs (the simulator) may hold an ``incremental.IncrementalPlanner``
instead, whose plans are proven equal to this function's (``tests/core/test_incremental``).
The steps live in ``deciding`` (2-4) and ``writing`` (5-6), shared by both.
"""

from __future__ import annotations

from edl_scheduler.core.deciding import decide
from edl_scheduler.core.plan import Plan
from edl_scheduler.core.policy import Policy
from edl_scheduler.core.session import open_session
from edl_scheduler.core.snapshot import Job, Snapshot
from edl_scheduler.core.validating import set_aside, validate
from edl_scheduler.core.writing import write_plan


def plan(snapshot: Snapshot, policy: Policy, now: float) -> Plan:
    """Decide every job's size and placement for this cycle. Deterministic and pure."""
    problems = validate(snapshot)  # 1
    aside: list[Job] = []
    if problems:
        snapshot, aside = set_aside(snapshot, problems)
    session = open_session(snapshot, policy, now)  # 2
    decide(session)  # 2-4
    return write_plan(session, aside, problems)  # 5-6
