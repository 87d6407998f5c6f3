"""The planner's value classes behave as the frozen dataclasses they were.

Aspects:
- ``Resources``, ``Constraints``, ``RoleSpec``, ``Replica``, ``ThroughputSample``,
  ``Reservation``, ``Job``, ``Snapshot``, ``RoleChange``, ``JobDecision`` and ``Plan`` write
  their ``__init__`` and ``__hash__`` out (compiled, those are C); each keeps its
  constructor's signature, its dataclass repr, its equality (same class, equal compared
  fields, NaN equal to itself as in a tuple) and the frozen dataclass's hash, the hash of
  its compared fields' tuple;
- ``dataclasses.replace`` and ``fields`` work on each (the drivers and tests use them);
- a Plan's ``known_changes`` is no part of its value;
- compiled, no field can be assigned (pure Python, only the type checker refuses): that is
  checked on the build, in ``tests/simulations/test_native.py``.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import pickle
from enum import Enum
from typing import Any

import pytest

from edl_scheduler.core.plan import Action, JobDecision, Plan, Reason, RoleChange
from edl_scheduler.core.resources import Resources
from edl_scheduler.core.snapshot import (
    Constraints,
    Efficiency,
    Job,
    Replica,
    Reservation,
    Role,
    RoleSpec,
    Snapshot,
    ThroughputSample,
    Toleration,
)
from simulations import native
from tests.core.builders import node

SPEC = RoleSpec(1, 4, Resources(1, 500, 2**30))
REPLICA = Replica("a-w0", Role.WORKER, "n0")
SAMPLE = ThroughputSample(1, 2, 30.5, 64)
JOB = Job(
    "a",
    SPEC,
    12.5,
    priority=2,
    pserver=RoleSpec(0, 1, Resources(0, 100, 1)),
    replicas=(REPLICA,),
    start_time=20.0,
    resizes=3,
    throughput=(SAMPLE,),
    efficiency=Efficiency(32, 1.0, 2.0),
    remaining_samples=5000.0,
)
RESERVATION = Reservation("a", "n0", Role.WORKER, 1, 9.0)
CHANGE = RoleChange(Role.WORKER, 1, 2, ("n1",))
DECISION = JobDecision("a", Action.GROW, Reason.GREW, "grew", CHANGE, None, "b")
VALUES: list[Any] = [
    Resources(1, 2, 3),
    Constraints((("zone", "a"),), (), (Toleration("gpu"),)),
    SPEC,
    REPLICA,
    SAMPLE,
    JOB,
    RESERVATION,
    Snapshot((node("n0").build(),), (JOB,), (RESERVATION,)),
    CHANGE,
    DECISION,
    Plan(5.0, (DECISION,), (RESERVATION,)),
]
#: Each class's constructor as the frozen dataclass generated it: names, order, defaults.
SIGNATURES = {
    Resources: "(gpu=0, cpu_milli=0, memory_bytes=0)",
    Constraints: "(node_selector=(), required_terms=(), tolerations=())",
    RoleSpec: "(min_replicas, max_replicas, resources)",
    Replica: "(name, role, node, draining=False)",
    ThroughputSample: "(nodes, workers, samples_per_second, batch=0)",
    Job: (
        "(name, worker, submit_time, priority=0, preemptible=True, pserver=None, "
        "requested=None, constraints=Constraints(node_selector=(), required_terms=(), "
        "tolerations=()), replicas=(), suspended=False, start_time=None, "
        "last_resize_time=None, resizes=0, attained_gpu_seconds=0.0, throughput=(), "
        "efficiency=None, remaining_samples=None)"
    ),
    Reservation: "(job, node, role, count, expires_at)",
    Snapshot: "(nodes, jobs, reservations=())",
    RoleChange: "(role, current, target, add_nodes=(), remove=())",
    JobDecision: "(job, action, reason, message, workers, pservers=None, for_job=None)",
    Plan: "(now, decisions, reservations=(), known_changes=None)",
}


def _compared(value: Any) -> tuple[Any, ...]:
    """The fields the frozen dataclass compared and hashed (all but a plan's known changes)."""
    names = [f.name for f in dataclasses.fields(value) if f.name != "known_changes"]
    return tuple(getattr(value, name) for name in names)


def _shown(value: Any) -> str:
    """The repr a dataclass generates."""
    shown = ", ".join(f"{f.name}={getattr(value, f.name)!r}" for f in dataclasses.fields(value))
    return f"{type(value).__qualname__}({shown})".replace(", known_changes=None", "")


#: What only Python shows: compiled, a class's constructor has no signature to inspect,
#: and a float field is boxed anew at each read (a NaN field never equals itself there,
#: as it did not when the frozen dataclasses were compiled).
pure_only = pytest.mark.skipif(
    native.mode() is native.Mode.NATIVE, reason="compiled: see pure_only"
)


@pure_only
@pytest.mark.parametrize("cls", list(SIGNATURES), ids=lambda c: c.__name__)
def test_constructors_keep_their_signatures(cls: type) -> None:
    params = inspect.signature(cls).parameters.values()
    shown = ", ".join(p.name if p.default is p.empty else f"{p.name}={p.default!r}" for p in params)
    assert f"({shown})" == SIGNATURES[cls]


@pytest.mark.parametrize("value", VALUES, ids=lambda v: type(v).__name__)
def test_equality_hash_and_repr_are_the_dataclasses(value: Any) -> None:
    copy = dataclasses.replace(value)
    assert copy is not value
    assert copy == value
    assert not copy != value  # noqa: SIM202 (the generated __ne__)
    assert hash(copy) == hash(value) == hash(_compared(value))
    assert repr(value) == _shown(value)
    assert value != _compared(value)  # another class is never equal
    first = dataclasses.fields(value)[0].name
    other = dataclasses.replace(value, **{first: _other(getattr(value, first))})
    assert other != value
    assert not other == value  # noqa: SIM201 (the written __eq__)


def _other(field_value: Any) -> Any:
    if isinstance(field_value, Enum):
        return next(m for m in type(field_value) if m is not field_value)
    if isinstance(field_value, bool):
        return not field_value
    if isinstance(field_value, (int, float)):
        return field_value + 1
    if isinstance(field_value, str):
        return field_value + "x"
    if isinstance(field_value, tuple):
        return field_value + field_value
    raise AssertionError(f"no other value for {field_value!r}")


def test_replace_changes_one_field_and_checks_the_job() -> None:
    moved = dataclasses.replace(JOB, start_time=30.0, resizes=4)
    assert (moved.start_time, moved.resizes, moved.name, moved.throughput) == (
        30.0,
        4,
        JOB.name,
        JOB.throughput,
    )
    with pytest.raises(ValueError, match="resizes is -1"):
        dataclasses.replace(JOB, resizes=-1)
    assert dataclasses.replace(Resources(1, 2, 3), cpu_milli=7) == Resources(1, 7, 3)


@pure_only
def test_nan_fields_compare_as_in_a_tuple() -> None:
    nan = math.nan
    assert ThroughputSample(1, 1, nan) == ThroughputSample(1, 1, nan)  # one object: equal
    assert ThroughputSample(1, 1, nan) != ThroughputSample(1, 1, float("nan"))
    assert Plan(nan, ()) == Plan(nan, ())
    assert Plan(nan, ()) != Plan(float("nan"), ())


def test_known_changes_are_no_part_of_a_plan() -> None:
    plan = Plan(5.0, (DECISION,), (), known_changes=(DECISION,))
    bare = dataclasses.replace(plan, known_changes=None)
    assert bare.known_changes is None and plan.known_changes == (DECISION,)
    assert bare == plan and hash(bare) == hash(plan) and repr(bare) == repr(plan)
    assert bare.changes == plan.changes == (DECISION,)


def test_values_pickle_pure() -> None:
    # the suite runs the Python modules (tests/__init__.py); compiled classes restore fields
    # by assignment, which they refuse, so the process pool pickles by constructor
    assert native.mode() is not native.Mode.NATIVE
    for value in VALUES:
        assert pickle.loads(pickle.dumps(value)) == value
