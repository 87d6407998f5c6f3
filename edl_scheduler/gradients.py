"""The one rule for a job's gradient statistics (Pollux's ``init_batch``, ``grad_sqr``,
``grad_var``): when the planner can use them.

Three places hold these numbers: the coordinator that receives them from rank 0
(``trainer_runtime.coordinator.state``), the TrainingJob status that stores them
(``edl_scheduler.api.status``) and the planner's snapshot that weighs throughput by them
(``edl_scheduler.core.snapshot.Efficiency``). A record the coordinator keeps must be one the
planner accepts, so all three ask this module.

Why here, at the root of the package, in the lowest layer of the import-linter contract: the
api is the lowest layer of ``edl_scheduler`` (the core imports it, never the reverse), so
the rule cannot live in the core; and the coordinator cannot import the api cheaply
(importing ``edl_scheduler.api`` builds every pydantic model, about a second more on a
coordinator's start, which is on every admission's path). This module imports only
``math``. What must stay true: it imports nothing of the project and no I/O, and each
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
