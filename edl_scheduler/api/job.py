"""The TrainingJob object as a whole, and the one way to read it in and write it out.

Why this exists: the controller reads and writes whole objects, the local backend and the
simulator build them in Python, and users write them in YAML. This is the one root model all
of them share; `load_training_job` and `load_training_jobs_yaml` are the only entry points
for untrusted input, and `to_dict` / `to_yaml` the way back out.

What must stay true:
- `apiVersion` and `kind` are checked, so that a manifest for another kind is not read as a
  TrainingJob by accident.
- Loaders raise `TrainingJobError` (listing every problem) and nothing else.
- YAML times stay text until pydantic reads them, so that a time without a zone is rejected
  the same way from YAML and from JSON.
- `to_dict` writes camelCase, leaves out unset optional fields, and keeps what the user wrote
  in open blocks (pod template, metadata) and in quantities; loading its result gives an
  equal job.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import yaml
from pydantic import Field, ValidationError, field_validator

from edl_scheduler.api.errors import Problem, TrainingJobError, problems_from
from edl_scheduler.api.meta import API_VERSION, KIND, ApiModel, ObjectMeta
from edl_scheduler.api.reading import read_yaml, shape_problem
from edl_scheduler.api.spec import TrainingJobSpec
from edl_scheduler.api.status import TrainingJobStatus

__all__ = ["TrainingJob", "load_training_job", "load_training_jobs_yaml"]


class TrainingJob(ApiModel):
    """An elastic training job: `minReplicas` to `maxReplicas` workers at a priority."""

    api_version: str = API_VERSION
    """Always edl.dev/v1alpha1."""
    kind: str = KIND
    """Always TrainingJob."""
    metadata: ObjectMeta
    """Name, namespace, labels and the rest of the Kubernetes metadata."""
    spec: TrainingJobSpec
    """What the user asks for."""
    status: TrainingJobStatus = Field(default_factory=TrainingJobStatus)
    """Where the job stands."""

    @field_validator("api_version")
    @classmethod
    def _known_version(cls, value: str) -> str:
        if value != API_VERSION:
            raise ValueError(
                f"is {value!r}, which this version of EDL does not read: "
                f"set apiVersion: {API_VERSION}"
            )
        return value

    @field_validator("kind")
    @classmethod
    def _known_kind(cls, value: str) -> str:
        if value != KIND:
            raise ValueError(f"is {value!r}, not a TrainingJob: set kind: {KIND}")
        return value

    @property
    def key(self) -> str:
        """`namespace/name`."""
        return self.metadata.key

    def to_dict(self, *, as_written: bool = False) -> dict[str, Any]:
        """The job in camelCase with JSON types and no null fields.

        With `as_written`, only the fields that were given (in the document loaded, or to
        the constructor) are written, so a loaded manifest comes back as it was written.
        """
        return self.model_dump(
            mode="json", by_alias=True, exclude_none=True, exclude_unset=as_written
        )

    def to_yaml(self, *, as_written: bool = False) -> str:
        """The job as a YAML document, fields in model order (see `to_dict`)."""
        return yaml.safe_dump(
            self.to_dict(as_written=as_written), sort_keys=False, allow_unicode=True
        )


def _subject(data: object) -> str:
    if isinstance(data, Mapping):
        metadata = data.get("metadata")
        if isinstance(metadata, Mapping) and isinstance(metadata.get("name"), str):
            return f"TrainingJob {metadata['name']!r}"
    return "TrainingJob"


def _validate(data: object, document: int | None) -> TrainingJob:
    shape = shape_problem(data)
    if shape is not None:
        raise TrainingJobError([Problem(shape.path, shape.message, document)])
    if not isinstance(data, Mapping):
        problem = Problem(
            "(document)",
            "must be a mapping with apiVersion, kind, metadata and spec "
            f"(got {type(data).__name__})",
            document,
        )
        raise TrainingJobError([problem])
    try:
        return TrainingJob.model_validate(data)
    except ValidationError as error:
        problems = problems_from(error, TrainingJob, document)
        raise TrainingJobError(problems, _subject(data)) from None


def load_training_job(data: Mapping[str, Any] | str) -> TrainingJob:
    """Read one job from a mapping (parsed YAML or JSON) or from YAML text.

    Raises `TrainingJobError` listing every problem as `<path>: <problem and fix>`.
    """
    if isinstance(data, str):
        documents = [doc for doc in read_yaml(data) if doc is not None]
        if len(documents) != 1:
            found = (
                "holds no YAML document (it is empty): give one TrainingJob"
                if not documents
                else f"holds {len(documents)} YAML documents where one job was expected: give "
                "one job per file (from Python, load_training_jobs_yaml reads several)"
            )
            raise TrainingJobError([Problem("(document)", found)], "YAML")
        return _validate(documents[0], None)
    return _validate(data, None)


def load_training_jobs_yaml(text: str) -> list[TrainingJob]:
    """Read every job in a multi-document YAML stream; empty documents are skipped.

    All documents are checked before anything is returned; problems from every document are
    raised together in one `TrainingJobError`, each tagged with its document's position.
    """
    jobs: list[TrainingJob] = []
    problems: list[Problem] = []
    for position, data in enumerate(read_yaml(text), start=1):
        if data is None:
            continue
        try:
            jobs.append(_validate(data, position))
        except TrainingJobError as error:
            problems.extend(error.problems)
    if problems:
        raise TrainingJobError(problems, "TrainingJob documents")
    return jobs
