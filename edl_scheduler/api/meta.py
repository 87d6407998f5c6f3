"""What every TrainingJob model shares: the API's identity, the base models, object metadata.

Why this exists: the spec, the status and the root object must agree on naming (snake_case in
Python, camelCase on the wire), on strictness (our own blocks reject unknown fields, blocks
owned by Kubernetes keep them) and on how a cross-field problem is reported. Keeping those
rules here keeps them in one place.

What must stay true:
- `ApiModel` forbids unknown fields, `OpenModel` keeps them; nothing else decides that.
- A cross-field problem is raised through `field_problem`, whose error carries the field it
  is about and a message template; `loading.py` turns it into "<full path>: <problem and
  fix>". Templates write `{at}` before a sibling's name, so that the loader can spell out
  its full path ("spec.minReplicas") while plain pydantic errors read "minReplicas".
- This module imports nothing above `edl_scheduler.api`.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Final

from pydantic import AfterValidator, AwareDatetime, BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel
from pydantic_core import PydanticCustomError

__all__ = [
    "API_VERSION",
    "FIELD_PROBLEM",
    "GROUP",
    "KIND",
    "PLURAL",
    "SHORT_NAMES",
    "SINGULAR",
    "VERSION",
    "ApiModel",
    "ObjectMeta",
    "OpenModel",
    "field_problem",
]

GROUP: Final = "edl.dev"
VERSION: Final = "v1alpha1"
API_VERSION: Final = f"{GROUP}/{VERSION}"
KIND: Final = "TrainingJob"
PLURAL: Final = "trainingjobs"
SINGULAR: Final = "trainingjob"
SHORT_NAMES: Final = ("tj",)

#: The pydantic error type of every problem raised through `field_problem`.
FIELD_PROBLEM: Final = "edl_field_problem"

# A job's name becomes part of Service and pod names ("<name>-coordinator",
# "<name>-worker-12"), so it must be a DNS-1035 label with room left for those suffixes.
NAME_MAX: Final = 48
_DNS1035: Final = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
_DNS1123: Final = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")


class ApiModel(BaseModel):
    """A block we own: camelCase on the wire, snake_case in Python, unknown fields rejected."""

    model_config = ConfigDict(
        populate_by_name=True,
        alias_generator=to_camel,
        extra="forbid",
        use_attribute_docstrings=True,
    )


class OpenModel(BaseModel):
    """A block Kubernetes owns (pod template, affinity, metadata): we model the fields the
    planner reads and keep every other field as it was written."""

    model_config = ConfigDict(
        populate_by_name=True,
        alias_generator=to_camel,
        extra="allow",
        use_attribute_docstrings=True,
    )


def field_problem(field: str, template: str, **values: object) -> PydanticCustomError:
    """An error about `field` (a camelCase name relative to the model being validated).

    `template` says what is wrong and how to fix it; it may use `{at}` before a sibling
    field's name and `{name}` for any of `values`. Raise the result from a validator.
    """
    context: dict[str, Any] = {**values, "field": field, "template": template, "at": ""}
    return PydanticCustomError(FIELD_PROBLEM, "{field}: " + template, context)


def _check_name(name: str) -> str:
    if len(name) > NAME_MAX or not _DNS1035.fullmatch(name):
        raise ValueError(
            f"{name!r} is not a valid job name: use at most {NAME_MAX} lowercase letters, "
            "digits and '-', starting with a letter and ending with a letter or digit "
            "(it becomes part of Service and pod names)"
        )
    return name


def _check_namespace(namespace: str) -> str:
    if len(namespace) > 63 or not _DNS1123.fullmatch(namespace):
        raise ValueError(
            f"{namespace!r} is not a valid namespace: use at most 63 lowercase letters, "
            "digits and '-', starting and ending with a letter or digit"
        )
    return namespace


JobName = Annotated[str, AfterValidator(_check_name)]
Namespace = Annotated[str, AfterValidator(_check_namespace)]


class ObjectMeta(OpenModel):
    """The Kubernetes metadata of a job. The fields the planner and controller read are
    modelled; the rest (resourceVersion, ownerReferences, managedFields, ...) is kept."""

    name: JobName
    """The job's name, unique in its namespace."""
    namespace: Namespace = "default"
    """The job's namespace."""
    uid: str | None = None
    """The identity Kubernetes gave the object."""
    labels: dict[str, str] = Field(default_factory=dict)
    """Labels of the job."""
    annotations: dict[str, str] = Field(default_factory=dict)
    """Annotations of the job."""
    creation_timestamp: AwareDatetime | None = None
    """When the object was created."""
    generation: int | None = Field(default=None, ge=0)
    """Kubernetes' count of spec changes."""

    @property
    def key(self) -> str:
        """`namespace/name`, the job's identity across the controller and the planner."""
        return f"{self.namespace}/{self.name}"
