"""The scheduling policy as a config file: a preset by name, with optional overrides.

    base: edl
    cooldownSeconds: 120
    preemption: shrink-then-suspend

Validated here, at the boundary; ``edl_scheduler.core.building.policy_from_config`` turns it
into the planner's frozen ``Policy``. Names mirror the core's enums; the core checks the
preset name against its table, so this module need not import the planner.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import ConfigDict, Field, ValidationError

from edl_scheduler.api.errors import Problem, TrainingJobError, problems_from
from edl_scheduler.api.meta import ApiModel
from edl_scheduler.api.reading import read_yaml

PresetName = Literal[
    "edl", "edl-fulfillment", "fifo-gang", "fifo-backfill", "tiresias", "tiresias-pollux"
]


class PolicyConfig(ApiModel):
    """A preset and the fields that override it; unset fields keep the preset's value.
    Every number is finite: an infinite cool-down or horizon is a typo, not a policy."""

    model_config = ConfigDict(**ApiModel.model_config, allow_inf_nan=False)

    base: PresetName = "edl"
    """The preset to start from."""
    elastic: bool | None = None
    """False runs every job at its requested size (rigid)."""
    use_priority: bool | None = None
    """False ranks all jobs as one level."""
    ordering: Literal["fifo", "least-attained", "las-queues"] | None = None
    """Order within a priority level: submit time, least attained GPU-time, or LAS queues."""
    admission: Literal["head-of-line", "backfill"] | None = None
    """Whether a waiting job blocks the jobs ranked below it."""
    preemption: Literal["none", "shrink", "shrink-then-suspend", "suspend"] | None = None
    """What may be taken from running jobs to admit a waiting one."""
    reclaim_equal_priority: bool | None = None
    """Whether a waiting job may take borrowed workers from jobs of its own priority ranked
    above it, once they are past their minimum run and cool-down."""
    shrink_equal_priority: Literal["any", "after-minimum-run", "never"] | None = None
    """Which running jobs of its own priority ranked below it a waiting job may shrink:
    any, those that have run the minimum after which they could be suspended, or none."""
    suspend_equal_priority: bool | None = None
    """Whether a waiting job may suspend a whole job of its own priority ranked below it
    (past its minimum run), where the policy suspends."""
    growth: Literal["none", "fulfillment", "marginal-gain"] | None = None
    """How idle GPUs are shared."""
    cooldown_seconds: float | None = Field(default=None, ge=0)
    """Least time between two resizes of a job."""
    min_run_seconds: float | None = Field(default=None, ge=0)
    """Least run time before a voluntary shrink."""
    ramp_seconds: float | None = Field(default=None, ge=0)
    """Growth on evidence: no job grows past its requested size (spec.replicas) or twice
    the largest size it measured, whichever is larger, and one on its way up (its last step
    up measured worth the pause) may grow again this long after its last resize, within its
    cool-down. Unset: the base's (60 in edl); null: growth trusts the model at any size."""
    suspend_cost_seconds: float | None = Field(default=None, ge=0)
    """What one suspension and resume costs a job (checkpoint save, restart, restore): a job
    of the waiting job's own level is suspended only after ten times that of run."""
    reservation_timeout_seconds: float | None = Field(default=None, gt=0)
    """How long GPUs freed for a job stay held for it."""
    resize_pause_seconds: float | None = Field(default=None, ge=0)
    """What one resize costs a job."""
    gain_horizon_seconds: float | None = Field(default=None, gt=0)
    """The horizon over which a resize's gain must exceed its pause."""
    max_load: float | None = Field(default=None, gt=0, le=1)
    """Growth stops at this fraction of the cluster's GPUs."""
    queue_thresholds_gpu_seconds: list[float] | None = None
    """LAS queue boundaries in attained GPU-seconds, ascending."""
    starvation_limit_seconds: float | None = Field(default=None, gt=0)
    """A LAS job waiting this long returns to the first queue."""
    las_running_first: bool | None = None
    """Within one LAS queue, running jobs rank above waiting ones."""

    def overrides(self) -> dict[str, Any]:
        """The fields set in the file, by the planner's field names."""
        names = {
            "cooldown_seconds": "cooldown_s",
            "ramp_seconds": "ramp_s",
            "min_run_seconds": "min_run_s",
            "suspend_cost_seconds": "suspend_cost_s",
            "reservation_timeout_seconds": "reservation_timeout_s",
            "resize_pause_seconds": "resize_pause_s",
            "gain_horizon_seconds": "gain_horizon_s",
            "queue_thresholds_gpu_seconds": "queue_thresholds_gpu_s",
            "starvation_limit_seconds": "starvation_limit_s",
        }
        return {
            names.get(k, k): v
            for k, v in self.model_dump(exclude_unset=True, exclude={"base"}).items()
        }


def load_policy_config(text: str) -> PolicyConfig:
    """Parse a policy file; problems raise ``TrainingJobError`` (the API's one error type
    for bad input) naming each field."""
    documents = [d for d in read_yaml(text) if d is not None]
    if len(documents) > 1:
        problem = Problem("(document)", "holds several YAML documents: give one policy")
        raise TrainingJobError([problem], subject="policy")
    data = documents[0] if documents else {}
    try:
        return PolicyConfig.model_validate(data)
    except ValidationError as err:
        raise TrainingJobError(problems_from(err, PolicyConfig), subject="policy") from None
