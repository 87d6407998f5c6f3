"""Steps 2-4 of a cycle over an open session: obey the specs, retreat, admit, grow, and
admit and grow again while that starts jobs. ``plan()`` and the incremental planner both
decide through ``decide``; what they differ in is how the session is opened and what is
written.

What must stay true: ``decide`` reads only the session (its jobs in rank order, the
cluster, the policy, ``now``) and changes only it, so a session opened from kept states
decides as one opened afresh.
"""

from __future__ import annotations

from typing import Final

from edl_scheduler.core.admitting import Admitter
from edl_scheduler.core.complying import comply
from edl_scheduler.core.growing import WAITING, Grower
from edl_scheduler.core.retreating import retreat
from edl_scheduler.core.session import Session

#: Admission-growth rounds after the first; each must start a job to go on.
EXTRA_ROUNDS: Final = 3


def decide(session: Session, rounds: int = EXTRA_ROUNDS) -> None:
    """Every job's moves and reasons for this cycle, in the session. ``rounds``: the
    admission-growth rounds after the first, at most (``EXTRA_ROUNDS``; a caller that
    returns only the decisions that change may ask for none where no later round can start
    a job: ``admitting.rounds_start_nothing``)."""
    policy = session.policy
    comply(session)  # 2
    retreat(session)  # 2: before admission, which counts what it frees
    admitter, grower = Admitter(session), Grower(session)
    started = admitter.run()  # 3
    grower.run()  # 4
    # 3-4 again, while admission or growth changed something that could open a way for a
    # waiting job. After a round that started and grew nothing, another would see the same
    # state (a failed admission leaves no trace) and fail the same way: it is left out.
    if not (started or grower.statements):
        return
    grows = policy.grows
    for _ in range(rounds):
        waiting = [js for js in session.jobs if js.reason in WAITING]
        if not waiting:
            break
        grower.settle()
        if grows:  # else nothing changed a size since admission kept its pools up to date
            admitter.refresh_pools()
        if admitter.run(waiting) == 0:
            break
        grower.run()
