"""The planner's output: for each job and role, a target, where new replicas go, which named
replicas leave (in order), and one line a person can read.

A Plan describes moves from the snapshot it was computed on; ``applying.apply_plan`` turns
snapshot + plan into the next snapshot (the simulator's and the tests' model of a driver).
A plan is *empty* when it moves nothing: idempotence (invariant 6) says that planning again
at the same instant on the applied state yields an empty plan.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Final

from edl_scheduler.core.snapshot import Reservation, Role


class Action(Enum):
    """What happens to a job in this plan.

    ::

        WAIT ──START──> KEEP ──GROW/SHRINK──> KEEP
          ^               │
          └───SUSPEND─────┘   (whole-job preemption; only where the policy allows it)
    """

    WAIT = "wait"
    START = "start"
    KEEP = "keep"
    GROW = "grow"
    SHRINK = "shrink"
    SUSPEND = "suspend"


class Reason(Enum):
    """Why a job is where the plan puts it; each decision carries one, with a message."""

    STARTED = "Started"
    GREW = "Grew"
    SHRUNK_TO_ADMIT = "ShrunkToAdmit"
    #: Its spec's maximum fell below what it runs: the surplus drains (``complying``).
    SHRUNK_TO_MAXIMUM = "ShrunkToMaximum"
    #: Gave workers to a running job that makes more progress with them (``rebalancing``).
    REBALANCED = "Rebalanced"
    #: Gave back workers its own measurements say slow it down (``retreating``).
    RETREATED = "Retreated"
    SUSPENDED_TO_ADMIT = "SuspendedToAdmit"
    MOVED_TO_ADMIT = "MovedToAdmit"
    AT_MAXIMUM = "AtMaximum"
    STEADY = "Steady"
    NO_ROOM = "NoRoom"
    COOLING_DOWN = "CoolingDown"
    GAIN_BELOW_PAUSE = "GainBelowPause"
    #: At its requested size or twice the largest size it measured, where the policy grows
    #: on evidence (``Policy.ramp_s``): it grows further once its runtime measures the size
    #: it runs at.
    AWAITING_MEASUREMENT = "AwaitingMeasurement"
    HELD_FOR_WAITING = "HeldForWaitingJob"
    LOAD_THRESHOLD = "LoadThreshold"
    RIGID = "Rigid"
    WAITING_FOR_CAPACITY = "WaitingForCapacity"
    WAITING_IN_LINE = "WaitingInLine"
    TOO_LARGE = "TooLarge"
    USER_SUSPENDED = "UserSuspended"
    BELOW_MINIMUM = "BelowMinimum"
    #: Its state is one the planner cannot accept (``validating.JobError``): kept as it is
    #: for the cycle, the message naming the problem and the fix; the others are planned.
    SET_ASIDE = "SetAside"

    # Identity hashing, C-level, as ``snapshot.Role``'s: growth asks whether every job's
    # reason is in a set at every plan. No set of reasons is iterated for an output.
    __hash__ = object.__hash__


#: Reasons that explain why a running job below its maximum was not grown although some GPU
#: it could use is idle: the exceptions invariant 5 allows, each said in the plan.
HOLD_REASONS: Final = frozenset(
    {
        Reason.COOLING_DOWN,
        Reason.GAIN_BELOW_PAUSE,
        Reason.AWAITING_MEASUREMENT,
        Reason.HELD_FOR_WAITING,
        Reason.LOAD_THRESHOLD,
        Reason.RIGID,
        Reason.BELOW_MINIMUM,
        Reason.RETREATED,
    }
)


def counted(count: int, noun: str) -> str:
    """``count`` and ``noun`` for a person: "1 worker", "2 workers"."""
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


@dataclass(slots=True, init=False)
class RoleChange:
    """One role of one job: ``current`` live replicas become ``target``.

    ``add_nodes`` names the node of each new replica (a node may repeat); ``remove`` names
    the replicas to drain, in the order they should leave. ``target == current +
    len(add_nodes) - len(remove)`` always holds.

    Nothing changes a RoleChange, a JobDecision or a Plan once made: the fields are
    ``Final`` (compiled, assigning one raises). Dataclasses for ``replace``, ``fields``,
    their repr and their equality, with ``__init__`` and ``__hash__`` written out:
    compiled, those are C, where the ones a dataclass generates are Python code (every plan
    makes one of each per job). The hash is the frozen dataclass's: that of the compared
    fields' tuple.
    """

    role: Final[Role]
    current: Final[int]
    target: Final[int]
    add_nodes: Final[tuple[str, ...]]
    remove: Final[tuple[str, ...]]

    def __init__(
        self,
        role: Role,
        current: int,
        target: int,
        add_nodes: tuple[str, ...] = (),
        remove: tuple[str, ...] = (),
    ) -> None:
        self.role = role
        self.current = current
        self.target = target
        self.add_nodes = add_nodes
        self.remove = remove

    def __hash__(self) -> int:
        return hash((self.role, self.current, self.target, self.add_nodes, self.remove))

    @property
    def changed(self) -> bool:
        return bool(self.add_nodes or self.remove)


@dataclass(slots=True, init=False)
class JobDecision:
    """What the plan does with one job. Fixed once made (see ``RoleChange``)."""

    job: Final[str]
    action: Final[Action]
    reason: Final[Reason]
    message: Final[str]
    workers: Final[RoleChange]
    pservers: Final[RoleChange | None]
    #: For SHRINK and SUSPEND decisions made to admit another job: that job's name.
    for_job: Final[str | None]

    def __init__(
        self,
        job: str,
        action: Action,
        reason: Reason,
        message: str,
        workers: RoleChange,
        pservers: RoleChange | None = None,
        for_job: str | None = None,
    ) -> None:
        self.job = job
        self.action = action
        self.reason = reason
        self.message = message
        self.workers = workers
        self.pservers = pservers
        self.for_job = for_job

    def __hash__(self) -> int:
        return hash(
            (
                self.job,
                self.action,
                self.reason,
                self.message,
                self.workers,
                self.pservers,
                self.for_job,
            )
        )

    @property
    def changed(self) -> bool:
        return self.workers.changed or (self.pservers is not None and self.pservers.changed)

    def role(self, role: Role) -> RoleChange | None:
        return self.workers if role is Role.WORKER else self.pservers

    def __str__(self) -> str:
        size = f"{self.workers.current}->{self.workers.target}"
        return f"{self.job}: {self.action.value} {size} [{self.reason.value}] {self.message}"


@dataclass(slots=True, init=False, eq=False, repr=False)
class Plan:
    """Fixed once made (see ``RoleChange``). Equality, hash and repr are written out too:
    they leave out ``known_changes`` (a ``field(compare=False)`` cannot be ``Final``)."""

    now: Final[float]
    decisions: Final[tuple[JobDecision, ...]]
    reservations: Final[tuple[Reservation, ...]]
    #: ``changes`` where the planner collected them as it decided (it knows which few
    #: decisions can change anything); not part of the plan's value (equality, repr).
    known_changes: Final[tuple[JobDecision, ...] | None]

    def __init__(
        self,
        now: float,
        decisions: tuple[JobDecision, ...],
        reservations: tuple[Reservation, ...] = (),
        known_changes: tuple[JobDecision, ...] | None = None,
    ) -> None:
        self.now = now
        self.decisions = decisions
        self.reservations = reservations
        self.known_changes = known_changes

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Plan):  # no class derives from it
            return NotImplemented
        # As Python tuples (typed ``object``, so that compiled code does not compare field
        # by field), as the dataclass compared: an element is equal to itself, NaN too.
        mine: object = (self.now, self.decisions, self.reservations)
        theirs: object = (other.now, other.decisions, other.reservations)
        return mine == theirs

    def __hash__(self) -> int:
        return hash((self.now, self.decisions, self.reservations))

    def __repr__(self) -> str:
        return (
            f"Plan(now={self.now!r}, decisions={self.decisions!r}, "
            f"reservations={self.reservations!r})"
        )

    @property
    def changes(self) -> tuple[JobDecision, ...]:
        if self.known_changes is not None:
            return self.known_changes
        return tuple(d for d in self.decisions if d.changed)

    @property
    def is_empty(self) -> bool:
        return not any(d.changed for d in self.decisions)

    def decision(self, job: str) -> JobDecision:
        for d in self.decisions:
            if d.job == job:
                return d
        raise KeyError(job)

    def describe(self) -> str:
        """A readable table: one line per job, changes first."""
        ordered = sorted(self.decisions, key=lambda d: (not d.changed, d.job))
        return "\n".join(str(d) for d in ordered)
