"""What a job's own spec asks of it now, before any policy decides: the user's word.

Two requests are obeyed at the opening of every cycle, before admission, so that what
they free is for others in the same cycle:

- ``spec.suspend``: every replica of a running job leaves;
- a maximum lowered below what runs (``maxReplicas`` of the workers or of the parameter
  servers, as ``kubectl scale`` or ``edlctl scale`` set it): the surplus drains, newest
  replica first so that rank 0 stays.

Neither is a preemption: they obey no policy's preemption setting and no stability rule
(cool-down, minimum run time), as the user asked for them. What must stay true: after the
cycle no job holds more live replicas of a role than that role's maximum, and a job that
was within its bounds is not touched here.
"""

from __future__ import annotations

from typing import Final

from edl_scheduler.core.plan import Reason
from edl_scheduler.core.session import JobState, Session
from edl_scheduler.core.snapshot import Role

_ROLES: Final = (Role.WORKER, Role.PSERVER)
_P: Final = Role.PSERVER


def comply(session: Session) -> None:
    """Obey every job's spec, in one pass over the jobs (every cycle makes it, so the jobs
    that ask nothing cost a few attribute reads each)."""
    for js in session.jobs:
        job = js.job
        if job.suspended:
            if js.running:
                _suspend(session, js)
            continue
        pserver = job.pserver
        if len(js.live_w) > job.worker.max_replicas or (
            pserver is not None and len(js.live[_P]) > pserver.max_replicas
        ):
            _drain_surplus(session, js)


def _suspend(session: Session, js: JobState) -> None:
    """Every replica of a running job whose spec says ``suspend`` leaves."""
    stmt = session.statement()
    for role in _ROLES:
        for replica in js.live[role]:
            stmt.remove(js, replica)
    stmt.commit()
    js.suspended = True
    js.reason, js.message = Reason.USER_SUSPENDED, "suspended by its spec: every replica leaves"


def _drain_surplus(session: Session, js: JobState) -> None:
    """A job running more replicas of a role than the role's ``maxReplicas`` gives up the
    newest ones, down to the maximum."""
    said: list[str] = []
    for role in _ROLES:
        spec = js.job.role_spec(role)
        live = js.live[role]
        if spec is None or len(live) <= spec.max_replicas:
            continue
        surplus = live[spec.max_replicas :]
        stmt = session.statement()
        for replica in reversed(surplus):  # newest first: rank 0 stays longest
            stmt.remove(js, replica)
        stmt.commit()
        said.append(
            f"{role.value} maxReplicas is {spec.max_replicas}: "
            f"{len(surplus)} of {len(live)} {role.value}s leave"
        )
    js.reason = Reason.SHRUNK_TO_MAXIMUM
    js.message = f"shrunk to its maximum ({'; '.join(said)})"
