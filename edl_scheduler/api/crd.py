"""The TrainingJob CustomResourceDefinition, generated from the models.

Run `python -m edl_scheduler.api.crd` to write `manifests/crd/trainingjobs.edl.dev.yaml`, and
`python -m edl_scheduler.api.crd --check` to fail (printing a diff) when the committed file
differs from what the models generate. The test suite runs the same comparison.

Choices that a cluster admin sees:
- apiextensions.k8s.io/v1, one served and stored version (v1alpha1), namespaced, short name
  `tj`. The schema is structural (see `schema.py`) and uses nothing newer than Kubernetes
  1.20 understands: no CEL rules. Cross-field rules (maxReplicas >= minReplicas, pserver
  iff strategy ps, ...) are enforced by the controller, which reports a violating job as
  Failed with the problem in `status.message`.
- The status subresource: users cannot write status, the controller cannot write spec.
- The scale subresource maps `kubectl scale tj/NAME --replicas=N` to `spec.maxReplicas`:
  for an elastic job the planner chooses the actual size between minReplicas and
  maxReplicas, so what a person (or an autoscaler) can set is the ceiling. The current
  size is read back from `status.replicas`, and `status.selector` selects the workers.
- Printer columns: Priority (the effective value, `status.priority`, which the controller
  fills from `spec.priority` or the PriorityClass), Min, Max, Replicas, Phase, Age; and,
  with `-o wide`, the one-line Message.

What must stay true: the output is deterministic (keys sorted, fixed width), so that the
committed file changes only when the models do.
"""

from __future__ import annotations

import argparse
import difflib
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

import yaml

from edl_scheduler.api.job import TrainingJob
from edl_scheduler.api.meta import GROUP, KIND, PLURAL, SHORT_NAMES, SINGULAR, VERSION
from edl_scheduler.api.schema import structural_schema
from edl_scheduler.api.spec import TrainingJobSpec
from edl_scheduler.api.status import TrainingJobStatus

__all__ = ["CRD_PATH", "crd_manifest", "main", "render_crd"]

#: Where the generated CRD is committed, relative to the repository root.
CRD_PATH: Final = Path("manifests") / "crd" / f"{PLURAL}.{GROUP}.yaml"
_REPO_ROOT: Final = Path(__file__).resolve().parents[2]
_HEADER: Final = (
    "# Generated from edl_scheduler/api by `python -m edl_scheduler.api.crd`; do not edit.\n"
    "# `python -m edl_scheduler.api.crd --check` (and tests/api) fail when this file is stale.\n"
)


def _printer_columns() -> list[dict[str, Any]]:
    def column(name: str, type_: str, path: str, description: str) -> dict[str, Any]:
        return {"name": name, "type": type_, "jsonPath": path, "description": description}

    message = column("Message", "string", ".status.message", "Why the job is where it is")
    message["priority"] = 1
    return [
        column("Priority", "integer", ".status.priority", "Effective priority"),
        column("Min", "integer", ".spec.minReplicas", "Fewest workers"),
        column("Max", "integer", ".spec.maxReplicas", "Most workers"),
        column("Replicas", "integer", ".status.replicas", "Workers now"),
        column("Phase", "string", ".status.phase", "Lifecycle phase"),
        column("Age", "date", ".metadata.creationTimestamp", "Time since creation"),
        message,
    ]


def _root_schema() -> dict[str, Any]:
    description = (TrainingJob.__doc__ or KIND).strip()
    return {
        "type": "object",
        "description": description,
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": structural_schema(TrainingJobSpec),
            "status": structural_schema(TrainingJobStatus),
        },
    }


def crd_manifest() -> dict[str, Any]:
    """The CustomResourceDefinition for TrainingJob, as a mapping."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{PLURAL}.{GROUP}"},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": KIND,
                "listKind": f"{KIND}List",
                "plural": PLURAL,
                "singular": SINGULAR,
                "shortNames": list(SHORT_NAMES),
                "categories": ["edl"],
            },
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": _root_schema()},
                    "subresources": {
                        "status": {},
                        "scale": {
                            "specReplicasPath": ".spec.maxReplicas",
                            "statusReplicasPath": ".status.replicas",
                            "labelSelectorPath": ".status.selector",
                        },
                    },
                    "additionalPrinterColumns": _printer_columns(),
                }
            ],
        },
    }


def render_crd() -> str:
    """The CRD as the YAML text that is committed."""
    body = yaml.safe_dump(crd_manifest(), sort_keys=True, width=100, allow_unicode=True)
    return _HEADER + body


def main(argv: Sequence[str] | None = None) -> int:
    """Write the CRD, or with `--check` compare it with the file; return the exit status."""
    parser = argparse.ArgumentParser(
        prog="python -m edl_scheduler.api.crd",
        description="Generate the TrainingJob CRD from the API models.",
    )
    parser.add_argument(
        "--output",
        type=Path,
        default=_REPO_ROOT / CRD_PATH,
        help=f"where the CRD is written or checked (default: {CRD_PATH})",
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="write nothing; exit 1 with a diff when the file differs from the models",
    )
    args = parser.parse_args(argv)
    output: Path = args.output
    generated = render_crd()
    if args.check:
        current = output.read_text(encoding="utf-8") if output.exists() else ""
        if current == generated:
            return 0
        diff = difflib.unified_diff(
            current.splitlines(keepends=True),
            generated.splitlines(keepends=True),
            fromfile=f"{output} (committed)",
            tofile=f"{output} (generated)",
        )
        sys.stdout.writelines(diff)
        print(f"{output} is stale: run python -m edl_scheduler.api.crd", file=sys.stderr)
        return 1
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(generated, encoding="utf-8")
    print(f"wrote {output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
