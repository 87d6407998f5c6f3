"""From the API's pydantic objects to the planner's frozen ones, at one seam.

Drivers (the controller, the local backend) hold TrainingJob objects; the planner holds
``Job`` and ``Policy`` values. This module converts spec, template and status once, so the
rules that read the template (node selector, required affinity, tolerations) are mapped in
exactly one place. Pure: times come in as the status's datetimes and leave as seconds.
"""

from __future__ import annotations

from edl_scheduler.api import TrainingJob, TrainingJobStatus
from edl_scheduler.api import template as api_template
from edl_scheduler.api.policy import PolicyConfig
from edl_scheduler.api.spec import ReplicaResources, Strategy
from edl_scheduler.core.policy import (
    Admission,
    EqualShrinking,
    Growth,
    Ordering,
    Policy,
    Preemption,
    preset,
    with_overrides,
)
from edl_scheduler.core.resources import Resources
from edl_scheduler.core.snapshot import (
    Constraints,
    Efficiency,
    Job,
    NodeSelectorTerm,
    Replica,
    Requirement,
    RoleSpec,
    SelectorOp,
    TaintEffect,
    ThroughputSample,
    Toleration,
    TolerationOp,
)

_ENUMS: dict[
    str,
    type[Ordering] | type[Admission] | type[Preemption] | type[Growth] | type[EqualShrinking],
] = {
    "ordering": Ordering,
    "admission": Admission,
    "preemption": Preemption,
    "growth": Growth,
    "shrink_equal_priority": EqualShrinking,
}


def policy_from_config(config: PolicyConfig) -> Policy:
    """The preset named by ``config.base`` with the file's overrides applied."""
    base = preset(config.base)
    values: dict[str, object] = {}
    for field, value in config.overrides().items():
        if field in _ENUMS:
            values[field] = _ENUMS[field](value)
        elif field == "queue_thresholds_gpu_s":
            values[field] = tuple(sorted(value))
        else:
            values[field] = value
    return with_overrides(base, **values)


def _resources(res: ReplicaResources) -> Resources:
    return Resources(res.gpu, res.cpu_milli, res.memory_bytes)


def _constraints(spec: api_template.PodSpec) -> Constraints:
    terms: list[NodeSelectorTerm] = []
    affinity = spec.affinity.node_affinity if spec.affinity else None
    required = affinity.required_during_scheduling_ignored_during_execution if affinity else None
    for term in required.node_selector_terms if required else ():
        terms.append(
            NodeSelectorTerm(
                tuple(
                    Requirement(r.key, SelectorOp(r.operator.value), tuple(r.values or ()))
                    for r in term.match_expressions or ()
                )
            )
        )
    tolerations = tuple(
        Toleration(
            key=t.key or "",
            operator=TolerationOp(t.operator.value),
            value=t.value or "",
            effect=TaintEffect(t.effect.value) if t.effect else None,
        )
        for t in spec.tolerations or ()
    )
    selector = tuple(sorted((spec.node_selector or {}).items()))
    return Constraints(selector, tuple(terms), tolerations)


def job_from_training_job(
    tj: TrainingJob,
    priority: int,
    replicas: tuple[Replica, ...] = (),
    last_resize_time: float | None = None,
) -> Job:
    """The planner's view of ``tj``. ``priority`` is resolved by the driver (the value of
    ``spec.priorityClassName`` on Kubernetes, a local table, or ``spec.priority``);
    ``replicas`` are the job's placed pods or processes."""
    spec, status = tj.spec, tj.status
    pserver = None
    if spec.strategy is Strategy.PS and spec.pserver is not None:
        pserver = RoleSpec(
            spec.pserver.min_replicas,
            spec.pserver.max_replicas,
            _resources(spec.pserver.resources),
        )
    submitted = status.submit_time or tj.metadata.creation_timestamp
    return Job(
        name=tj.key,
        worker=RoleSpec(spec.min_replicas, spec.max_replicas, _resources(spec.resources)),
        submit_time=submitted.timestamp() if submitted else 0.0,
        priority=priority,
        preemptible=spec.preemptible,
        pserver=pserver,
        requested=spec.requested_replicas,
        constraints=_constraints(spec.template.spec),
        replicas=replicas,
        suspended=spec.suspend,
        start_time=status.start_time.timestamp() if status.start_time else None,
        last_resize_time=last_resize_time,
        attained_gpu_seconds=status.attained_gpu_seconds,
        throughput=tuple(
            ThroughputSample(t.nodes, t.workers, t.samples_per_second, t.batch)
            for t in status.throughput
        ),
        remaining_samples=remaining_from_status(status),
    )


def remaining_from_status(status: TrainingJobStatus) -> float | None:
    """The samples the job has left until its declared last epoch, from its runtime's
    progress report (``status.progress``: epochs x samples per epoch - samples done, as the
    coordinator's ledger counts them); None where the report lacks one of them or holds no
    whole number there (rebalancing then gives the job the median rank, ``remaining``)."""
    report = status.progress
    values: list[int] = []
    for key in ("epochs", "samplesPerEpoch", "samplesDone"):
        value = report.get(key)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            return None
        values.append(value)
    epochs, per_epoch, done = values
    return float(max(0, epochs * per_epoch - done))


def efficiency_from_status(status: TrainingJobStatus) -> tuple[Efficiency | None, str | None]:
    """The statistical efficiency the planner weighs the job's throughput by, from the
    gradient statistics in its status (the runtime's last report), with the bounds its
    batch adapts within where ``status.batch`` reports them; and what was left out, for the
    driver to warn of. Statistics the planner cannot use: no efficiency (the job is planned
    on raw throughput). Bounds that cannot be right: the efficiency without them (the job's
    sizes are predicted at the batches it measured them at)."""
    stats = status.efficiency
    if stats is None:
        return None, None
    problem = stats.problem()
    if problem is not None:
        return None, f"status {problem}; planning on raw throughput"
    measured = (stats.init_batch, stats.grad_sqr, stats.grad_var)
    batch = status.batch
    if batch is not None and batch.max_batch is not None:
        bounds = (batch.max_batch, batch.max_local or 0, batch.min_local or 1)
        try:
            return Efficiency(*measured, *bounds), None
        except ValueError as e:
            left = f"status.batch's bounds left out ({e}); planning at the measured batches"
            return Efficiency(*measured), left
    return Efficiency(*measured), None
