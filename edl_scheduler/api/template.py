"""The worker pod template: what the planner must honour when it places a worker.

Why this exists: a job may only run on nodes its template admits (DESIGN.md invariant 1):
`nodeSelector`, required node affinity, and the tolerations of the node's taints. Those parts
are modelled and checked here with the rules Kubernetes applies, and they answer the two
questions the planner asks (`PodSpec.selects_node`, `PodSpec.tolerates`) the way the
Kubernetes scheduler would. Everything else in the template (containers, volumes, security
settings, preferred affinity, pod affinity, ...) is the controller's business and is kept
exactly as written.

What must stay true:
- Unknown pod-spec fields survive a load and dump unchanged (`OpenModel`).
- An empty or absent node-selector term matches no node, as in Kubernetes; terms are ORed,
  requirements within a term ANDed.
- Every container names an image; the first container is the worker.
- No container asks for GPUs itself: a worker's GPUs are the job's ``spec.resources``,
  which the planner counts; one asked on a container would be used uncounted.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import Any, Self

from pydantic import Field, model_validator

from edl_scheduler.api.meta import ApiModel, OpenModel, field_problem

#: The extended resource a worker's GPUs are asked as.
_GPU = "nvidia.com/gpu"

__all__ = [
    "Affinity",
    "NodeAffinity",
    "NodeSelector",
    "NodeSelectorOperator",
    "NodeSelectorRequirement",
    "NodeSelectorTerm",
    "PodSpec",
    "PodTemplate",
    "TaintEffect",
    "Toleration",
    "TolerationOperator",
]


class NodeSelectorOperator(StrEnum):
    """How a node-affinity requirement compares a node label with its values."""

    IN = "In"
    NOT_IN = "NotIn"
    EXISTS = "Exists"
    DOES_NOT_EXIST = "DoesNotExist"
    GT = "Gt"
    LT = "Lt"


class TolerationOperator(StrEnum):
    """`Equal` matches the taint's value; `Exists` any value."""

    EQUAL = "Equal"
    EXISTS = "Exists"


class TaintEffect(StrEnum):
    """A taint's effect. `ALL` (the empty string) in a toleration matches every effect."""

    NO_SCHEDULE = "NoSchedule"
    PREFER_NO_SCHEDULE = "PreferNoSchedule"
    NO_EXECUTE = "NoExecute"
    ALL = ""


class NodeSelectorRequirement(ApiModel):
    """One `{key, operator, values}` requirement on a node's labels (or fields)."""

    key: str = Field(min_length=1)
    """The label (or, in matchFields, the node field) to test."""
    operator: NodeSelectorOperator
    """In, NotIn, Exists, DoesNotExist, Gt or Lt."""
    values: list[str] = Field(default_factory=list)
    """Values for In and NotIn; one integer for Gt and Lt; none otherwise."""

    @model_validator(mode="after")
    def _values_fit_operator(self) -> Self:
        op = self.operator
        takes_list = op in (NodeSelectorOperator.IN, NodeSelectorOperator.NOT_IN)
        takes_none = op in (NodeSelectorOperator.EXISTS, NodeSelectorOperator.DOES_NOT_EXIST)
        if takes_list and not self.values:
            raise field_problem(
                "values", "operator {op} needs at least one value: list the label values", op=op
            )
        if takes_none and self.values:
            raise field_problem("values", "operator {op} takes no values: remove values", op=op)
        if not (takes_list or takes_none) and (
            len(self.values) != 1 or not _is_int(self.values[0])
        ):
            raise field_problem(
                "values", "operator {op} needs exactly one integer value, such as ['4']", op=op
            )
        return self

    def matches(self, labels: Mapping[str, str]) -> bool:
        """Whether a node with these labels meets this requirement."""
        value = labels.get(self.key)
        match self.operator:
            case NodeSelectorOperator.IN:
                return value is not None and value in self.values
            case NodeSelectorOperator.NOT_IN:
                return value is None or value not in self.values
            case NodeSelectorOperator.EXISTS:
                return value is not None
            case NodeSelectorOperator.DOES_NOT_EXIST:
                return value is None
            case NodeSelectorOperator.GT | NodeSelectorOperator.LT:
                if value is None or not _is_int(value):
                    return False
                bound = int(self.values[0])
                if self.operator is NodeSelectorOperator.GT:
                    return int(value) > bound
                return int(value) < bound


def _is_int(text: str) -> bool:
    try:
        int(text)
    except ValueError:
        return False
    return True


class NodeSelectorTerm(OpenModel):
    """Requirements that must all hold. `matchFields` may only test `metadata.name`."""

    match_expressions: list[NodeSelectorRequirement] = Field(default_factory=list)
    """Requirements on node labels."""
    match_fields: list[NodeSelectorRequirement] = Field(default_factory=list)
    """Requirements on node fields (metadata.name)."""

    @model_validator(mode="after")
    def _fields_are_known(self) -> Self:
        for index, requirement in enumerate(self.match_fields):
            if requirement.key != "metadata.name":
                raise field_problem(
                    f"matchFields[{index}].key",
                    "{key} is not a node field Kubernetes can select on: use metadata.name",
                    key=repr(requirement.key),
                )
        return self

    def matches(self, labels: Mapping[str, str], node_name: str) -> bool:
        """Whether a node matches; an empty term matches no node, as in Kubernetes."""
        if not self.match_expressions and not self.match_fields:
            return False
        fields = {"metadata.name": node_name}
        return all(r.matches(labels) for r in self.match_expressions) and all(
            r.matches(fields) for r in self.match_fields
        )


class NodeSelector(OpenModel):
    """Terms of which at least one must match."""

    node_selector_terms: list[NodeSelectorTerm] = Field(min_length=1)
    """Alternatives: a node qualifies if it matches any of them."""

    def matches(self, labels: Mapping[str, str], node_name: str) -> bool:
        """Whether any term matches the node."""
        return any(term.matches(labels, node_name) for term in self.node_selector_terms)


class NodeAffinity(OpenModel):
    """Node affinity; only the required part binds placement, the preferred part is kept."""

    required_during_scheduling_ignored_during_execution: NodeSelector | None = None
    """Nodes outside this selector never get the job's workers."""


class Affinity(OpenModel):
    """Pod affinity settings; pod (anti-)affinity is kept as written for the controller."""

    node_affinity: NodeAffinity | None = None
    """Which nodes the workers may (required) or should (preferred) run on."""


class Toleration(ApiModel):
    """A toleration, checked with the rules the Kubernetes API server applies to pods."""

    key: str | None = None
    """The taint key tolerated; empty with operator Exists tolerates every taint."""
    operator: TolerationOperator = TolerationOperator.EQUAL
    """Equal (the value must match) or Exists (any value)."""
    value: str | None = None
    """The taint value tolerated with operator Equal."""
    effect: TaintEffect | None = None
    """NoSchedule, PreferNoSchedule or NoExecute; empty tolerates every effect."""
    toleration_seconds: int | None = None
    """With NoExecute: how long the pod stays after the taint appears."""

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        if not self.key and self.operator is not TolerationOperator.EXISTS:
            raise field_problem(
                "operator",
                "a toleration without a key must use operator Exists: add a key or set "
                "operator: Exists",
            )
        if self.operator is TolerationOperator.EXISTS and self.value:
            raise field_problem(
                "value", "must be empty when operator is Exists: remove value or use Equal"
            )
        if self.toleration_seconds is not None and self.effect is not TaintEffect.NO_EXECUTE:
            raise field_problem(
                "tolerationSeconds",
                "only applies to effect NoExecute: set effect: NoExecute or remove it",
            )
        return self

    def tolerates(self, key: str, value: str, effect: TaintEffect) -> bool:
        """Whether this toleration tolerates the taint `key=value:effect`."""
        if self.effect and self.effect is not effect:
            return False
        if self.key and self.key != key:
            return False
        if self.operator is TolerationOperator.EXISTS:
            return True
        return (self.value or "") == value


class PodSpec(OpenModel):
    """The worker pod's spec. Containers are kept as written; each must name an image."""

    node_selector: dict[str, str] = Field(default_factory=dict)
    """Labels a node must carry to get a worker."""
    affinity: Affinity | None = None
    """Node and pod affinity; the required node affinity binds placement."""
    tolerations: list[Toleration] = Field(default_factory=list)
    """Taints the workers tolerate."""
    containers: list[dict[str, Any]] = Field(min_length=1)
    """The worker's containers, as in a pod; the first runs the training script."""

    @model_validator(mode="after")
    def _containers_have_images(self) -> Self:
        for index, container in enumerate(self.containers):
            image = container.get("image")
            if not isinstance(image, str) or not image.strip():
                raise field_problem(
                    f"containers[{index}].image",
                    "is required: give the container image to run, e.g. "
                    "registry.example.com/team/train:1.0",
                )
            resources = container.get("resources")
            for kind in ("limits", "requests"):
                asked = resources.get(kind) if isinstance(resources, dict) else None
                if isinstance(asked, dict) and _GPU in asked:
                    raise field_problem(
                        f"containers[{index}].resources.{kind}.{_GPU}",
                        "GPUs go in the job's spec.resources (nvidia.com/gpu), per worker: "
                        "the planner counts them there and sets each worker's limit from "
                        "them; move the request there and remove it from the container",
                    )
        return self

    def selects_node(self, labels: Mapping[str, str], node_name: str = "") -> bool:
        """Whether `nodeSelector` and required node affinity both admit the node."""
        if any(labels.get(key) != value for key, value in self.node_selector.items()):
            return False
        node_affinity = self.affinity.node_affinity if self.affinity else None
        required = (
            node_affinity.required_during_scheduling_ignored_during_execution
            if node_affinity
            else None
        )
        return required is None or required.matches(labels, node_name)

    def tolerates(self, key: str, value: str, effect: TaintEffect) -> bool:
        """Whether some toleration tolerates the taint. The planner asks this only for
        NoSchedule and NoExecute taints; PreferNoSchedule does not forbid placement."""
        return any(t.tolerates(key, value, effect) for t in self.tolerations)


class PodTemplate(OpenModel):
    """The worker pod template: metadata (kept as written) and the pod spec."""

    metadata: dict[str, Any] = Field(default_factory=dict)
    """Labels and annotations for the worker pods."""
    spec: PodSpec
    """The worker pod's spec."""

    @property
    def worker_image(self) -> str:
        """The image of the first container, which runs the training script."""
        image = self.spec.containers[0]["image"]
        assert isinstance(image, str)  # checked by PodSpec
        return image
