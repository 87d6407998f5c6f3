"""The planner: ``plan(snapshot, policy, now) -> Plan``, pure and deterministic.

The controller and the local backend call this one function; the simulator calls it too,
through ``incremental.IncrementalPlanner``, whose plans are proven equal to it. Nothing in
this package imports Kubernetes, a clock, randomness, sockets or file I/O (import-linter
checks it); the clock and any seed are arguments.
"""

from edl_scheduler.core.applying import apply_plan
from edl_scheduler.core.errors import PlanningError
from edl_scheduler.core.plan import HOLD_REASONS, Action, JobDecision, Plan, Reason, RoleChange
from edl_scheduler.core.planning import plan
from edl_scheduler.core.policy import (
    PRESETS,
    Admission,
    EqualShrinking,
    Growth,
    Invariant,
    Ordering,
    Policy,
    Preemption,
    preset,
)
from edl_scheduler.core.resources import Resources
from edl_scheduler.core.snapshot import (
    Constraints,
    Job,
    Node,
    NodeSelectorTerm,
    Replica,
    Requirement,
    Reservation,
    Role,
    RoleSpec,
    SelectorOp,
    Snapshot,
    Taint,
    TaintEffect,
    ThroughputSample,
    Toleration,
    TolerationOp,
)
from edl_scheduler.core.validating import ClusterError, JobError, SnapshotError

__all__ = [
    "HOLD_REASONS",
    "PRESETS",
    "Action",
    "Admission",
    "ClusterError",
    "Constraints",
    "EqualShrinking",
    "Growth",
    "Invariant",
    "Job",
    "JobDecision",
    "JobError",
    "Node",
    "NodeSelectorTerm",
    "Ordering",
    "Plan",
    "PlanningError",
    "Policy",
    "Preemption",
    "Reason",
    "Replica",
    "Requirement",
    "Reservation",
    "Resources",
    "Role",
    "RoleChange",
    "RoleSpec",
    "SelectorOp",
    "Snapshot",
    "SnapshotError",
    "Taint",
    "TaintEffect",
    "ThroughputSample",
    "Toleration",
    "TolerationOp",
    "apply_plan",
    "plan",
    "preset",
]
