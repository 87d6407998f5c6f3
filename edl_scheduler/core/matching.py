"""Which nodes a job's pods may land on: the second half of invariant 1, in one place.

Kubernetes semantics: a node must be schedulable (not cordoned); every nodeSelector pair
must equal a node label; if required node-affinity terms exist, at least one term must have
all its expressions hold; every NoSchedule or NoExecute taint must be tolerated
(PreferNoSchedule is a preference and never excludes a node).
"""

from __future__ import annotations

from collections.abc import Mapping

from edl_scheduler.core.snapshot import (
    Constraints,
    Node,
    NodeSelectorTerm,
    Requirement,
    SelectorOp,
    Taint,
    TaintEffect,
    Toleration,
    TolerationOp,
)


def _requirement_holds(req: Requirement, labels: Mapping[str, str]) -> bool:
    present = req.key in labels
    op = req.operator
    if op is SelectorOp.EXISTS:
        return present
    if op is SelectorOp.DOES_NOT_EXIST:
        return not present
    if op is SelectorOp.IN:
        return present and labels[req.key] in req.values
    if op is SelectorOp.NOT_IN:
        return not present or labels[req.key] not in req.values
    # Gt / Lt compare integers; a label that is not an integer never matches.
    if not present or len(req.values) != 1:
        return False
    try:
        label, bound = int(labels[req.key]), int(req.values[0])
    except ValueError:
        return False
    return label > bound if op is SelectorOp.GT else label < bound


def _term_holds(term: NodeSelectorTerm, labels: Mapping[str, str]) -> bool:
    return all(_requirement_holds(r, labels) for r in term.requirements)


def tolerates(tolerations: tuple[Toleration, ...], taint: Taint) -> bool:
    for t in tolerations:
        if t.effect is not None and t.effect is not taint.effect:
            continue
        if t.operator is TolerationOp.EXISTS and (t.key == "" or t.key == taint.key):
            return True
        if t.operator is TolerationOp.EQUAL and t.key == taint.key and t.value == taint.value:
            return True
    return False


def allowed_on(constraints: Constraints, node: Node) -> bool:
    """True when a pod with ``constraints`` may be placed on ``node`` (capacity aside)."""
    if not node.schedulable:
        return False
    labels = dict(node.labels)
    if any(labels.get(k) != v for k, v in constraints.node_selector):
        return False
    if constraints.required_terms and not any(
        _term_holds(t, labels) for t in constraints.required_terms
    ):
        return False
    return all(
        taint.effect is TaintEffect.PREFER_NO_SCHEDULE or tolerates(constraints.tolerations, taint)
        for taint in node.taints
    )


def node_class(node: Node) -> tuple[object, ...]:
    """Nodes with equal class are indistinguishable to ``allowed_on``: the planner matches
    each distinct set of constraints once per class, not once per node."""
    return (node.schedulable, node.labels, node.taints)
