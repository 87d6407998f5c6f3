"""The one rule for a job's gradient statistics (Pollux's ``init_batch``, ``grad_sqr``,
``grad_var``): when the planner can use them.

Three places hold these numbers: the coordinator that receives them from rank 0
(``trainer_runtime.coordinator.state``), the TrainingJob status that stores them
(``edl_scheduler.api.status``) and the planner's snapshot that weighs throughput by them
(``edl_scheduler.core.snapshot.Efficiency``). A record the coordinator keeps must be one the
planner accepts, so all three ask this package.

Why a package of its own, beside ``edl_scheduler`` and ``trainer_runtime``: the runtime and
the scheduler both need the rule, and neither may pay for the other. The api is the lowest
layer of ``edl_scheduler`` (the core imports it, never the reverse), so the rule cannot live
in the core; a coordinator must not import ``edl_scheduler`` (its api builds every pydantic
model on import, about a second more on a coordinator's start, which is on every
admission's path), and the scheduler must not import the runtime. What must stay true: this
package imports nothing of the project and no I/O (``lint-imports`` checks it), and each
caller names the fields as its own users see them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class FieldNames:
    """How one boundary names the three fields in its messages."""

    init_batch: str = "init_batch"
    grad_sqr: str = "grad_sqr"
    grad_var: str = "grad_var"


def statistics_problem(
    init_batch: int, grad_sqr: float, grad_var: float, names: FieldNames = FieldNames()
) -> str | None:
    """Why these statistics are unusable, naming the field, or None: ``init_batch`` must be
    >= 1; ``grad_sqr`` and ``grad_var`` finite, >= 0 and not both 0 (the efficiency
    ``(var + sqr) / (var / scale + sqr)`` is then defined and finite at every batch)."""
    if init_batch < 1:
        return f"{names.init_batch} is {init_batch}: it must be >= 1"
    values = (grad_sqr, grad_var)
    if not all(math.isfinite(v) and v >= 0 for v in values) or sum(values) <= 0:
        return (
            f"{names.grad_sqr} ({grad_sqr}) and {names.grad_var} ({grad_var}) must be "
            "finite, >= 0 and not both 0"
        )
    return None
