"""The TrainingJob API: spec and status as pydantic models, and the CRD generated from them.

This is the boundary where user YAML is validated; nothing here performs I/O (beyond writing
the CRD file when `python -m edl_scheduler.api.crd` is run) or imports the planner.
Everything a caller needs is importable from this package; the modules are:

- `quantity`: exact Kubernetes quantities;
- `meta`: the API's identity, base models, object metadata;
- `template`: the worker pod template and the placement rules it carries;
- `spec` and `status`: what the user asks for, and where the job stands;
- `job`: the whole object, its loaders and its writers; `errors`: readable problems;
- `schema` and `crd`: the structural OpenAPI schema and the CustomResourceDefinition.
"""

from edl_scheduler.api.errors import Problem, TrainingJobError
from edl_scheduler.api.job import TrainingJob, load_training_job, load_training_jobs_yaml
from edl_scheduler.api.meta import (
    API_VERSION,
    GROUP,
    KIND,
    PLURAL,
    SHORT_NAMES,
    SINGULAR,
    VERSION,
    ObjectMeta,
)
from edl_scheduler.api.quantity import Quantity, QuantityError, parse_quantity
from edl_scheduler.api.spec import (
    BatchMode,
    BatchPolicy,
    CoordinatorSpec,
    CoordinatorState,
    FailurePolicy,
    Framework,
    LrRule,
    PServerSpec,
    ReplicaResources,
    StateKind,
    Strategy,
    Timeouts,
    TrainingJobSpec,
)
from edl_scheduler.api.status import (
    BatchInUse,
    Condition,
    ConditionStatus,
    GradientStatistics,
    JobPhase,
    LastResize,
    ThroughputSample,
    TrainingJobStatus,
)
from edl_scheduler.api.template import (
    Affinity,
    NodeAffinity,
    NodeSelector,
    NodeSelectorOperator,
    NodeSelectorRequirement,
    NodeSelectorTerm,
    PodSpec,
    PodTemplate,
    TaintEffect,
    Toleration,
    TolerationOperator,
)

__all__ = [
    "API_VERSION",
    "GROUP",
    "KIND",
    "PLURAL",
    "SHORT_NAMES",
    "SINGULAR",
    "VERSION",
    "Affinity",
    "BatchInUse",
    "BatchMode",
    "BatchPolicy",
    "Condition",
    "ConditionStatus",
    "CoordinatorSpec",
    "CoordinatorState",
    "FailurePolicy",
    "Framework",
    "GradientStatistics",
    "JobPhase",
    "LastResize",
    "LrRule",
    "NodeAffinity",
    "NodeSelector",
    "NodeSelectorOperator",
    "NodeSelectorRequirement",
    "NodeSelectorTerm",
    "ObjectMeta",
    "PServerSpec",
    "PodSpec",
    "PodTemplate",
    "Problem",
    "Quantity",
    "QuantityError",
    "ReplicaResources",
    "StateKind",
    "Strategy",
    "TaintEffect",
    "ThroughputSample",
    "Timeouts",
    "Toleration",
    "TolerationOperator",
    "TrainingJob",
    "TrainingJobError",
    "TrainingJobSpec",
    "TrainingJobStatus",
    "load_training_job",
    "load_training_jobs_yaml",
    "parse_quantity",
]
