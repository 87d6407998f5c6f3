"""The worker pod template and the placement questions the planner asks of it.

Aspects tested:
- `selects_node`: nodeSelector, and required node affinity with every operator, terms ORed
  and requirements ANDed, an empty term matching nothing, matchFields on the node's name;
- `tolerates`: Equal and Exists, empty key, empty effect, value matching;
- pod-spec fields we do not model (volumes, hostNetwork, preferred affinity, pod affinity,
  container details) survive a load and a dump unchanged.
"""

from __future__ import annotations

from typing import Any

import pytest

from edl_scheduler.api import PodSpec, PodTemplate, TaintEffect, Toleration

GPU_NODE = {"zone": "a", "gpu": "a100", "cores": "64"}


def _spec(**fields: Any) -> PodSpec:
    return PodSpec.model_validate({"containers": [{"image": "x"}], **fields})


def _required(*terms: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": term} for term in terms]
            }
        }
    }


def test_no_constraints_admit_every_node() -> None:
    assert _spec().selects_node({})
    assert _spec().selects_node(GPU_NODE, "n1")


@pytest.mark.parametrize(
    ("selector", "admitted"),
    [
        ({"zone": "a"}, True),
        ({"zone": "a", "gpu": "a100"}, True),
        ({"zone": "b"}, False),
        ({"rack": "1"}, False),
    ],
)
def test_node_selector_needs_every_label(selector: dict[str, str], admitted: bool) -> None:
    assert _spec(nodeSelector=selector).selects_node(GPU_NODE) is admitted


@pytest.mark.parametrize(
    ("requirement", "admitted"),
    [
        ({"key": "zone", "operator": "In", "values": ["a", "b"]}, True),
        ({"key": "zone", "operator": "In", "values": ["b"]}, False),
        ({"key": "rack", "operator": "In", "values": ["1"]}, False),
        ({"key": "zone", "operator": "NotIn", "values": ["b"]}, True),
        ({"key": "zone", "operator": "NotIn", "values": ["a"]}, False),
        ({"key": "rack", "operator": "NotIn", "values": ["1"]}, True),
        ({"key": "gpu", "operator": "Exists"}, True),
        ({"key": "rack", "operator": "Exists"}, False),
        ({"key": "rack", "operator": "DoesNotExist"}, True),
        ({"key": "gpu", "operator": "DoesNotExist"}, False),
        ({"key": "cores", "operator": "Gt", "values": ["32"]}, True),
        ({"key": "cores", "operator": "Gt", "values": ["64"]}, False),
        ({"key": "cores", "operator": "Lt", "values": ["65"]}, True),
        ({"key": "cores", "operator": "Lt", "values": ["64"]}, False),
        ({"key": "zone", "operator": "Gt", "values": ["1"]}, False),  # label not a number
        ({"key": "rack", "operator": "Lt", "values": ["1"]}, False),  # label absent
    ],
)
def test_required_affinity_operators(requirement: dict[str, Any], admitted: bool) -> None:
    spec = _spec(affinity=_required([requirement]))
    assert spec.selects_node(GPU_NODE, "n1") is admitted


def test_terms_are_ored_and_requirements_anded() -> None:
    zone_b = {"key": "zone", "operator": "In", "values": ["b"]}
    a100 = {"key": "gpu", "operator": "In", "values": ["a100"]}
    no_rack = {"key": "rack", "operator": "Exists"}
    assert _spec(affinity=_required([zone_b], [a100])).selects_node(GPU_NODE)
    assert not _spec(affinity=_required([a100, no_rack])).selects_node(GPU_NODE)


def test_empty_term_matches_no_node() -> None:
    assert not _spec(affinity=_required([])).selects_node(GPU_NODE, "n1")


def test_node_selector_and_affinity_must_both_admit() -> None:
    spec = _spec(
        nodeSelector={"zone": "b"}, affinity=_required([{"key": "gpu", "operator": "Exists"}])
    )
    assert not spec.selects_node(GPU_NODE)


def test_match_fields_select_by_node_name() -> None:
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}
                ]
            }
        }
    }
    spec = _spec(affinity=affinity)
    assert spec.selects_node({}, "n1")
    assert not spec.selects_node({}, "n2")


def test_preferred_affinity_does_not_bind_placement() -> None:
    affinity = {
        "nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 1}]},
        "podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": []},
    }
    assert _spec(affinity=affinity).selects_node(GPU_NODE)


@pytest.mark.parametrize(
    ("toleration", "taint", "tolerated"),
    [
        (
            {"key": "gpu", "value": "yes", "effect": "NoSchedule"},
            ("gpu", "yes", "NoSchedule"),
            True,
        ),
        (
            {"key": "gpu", "value": "yes", "effect": "NoSchedule"},
            ("gpu", "no", "NoSchedule"),
            False,
        ),
        (
            {"key": "gpu", "value": "yes", "effect": "NoSchedule"},
            ("gpu", "yes", "NoExecute"),
            False,
        ),
        ({"key": "gpu", "value": "yes"}, ("gpu", "yes", "NoExecute"), True),  # no effect: all
        ({"key": "gpu", "value": "yes", "effect": ""}, ("gpu", "yes", "NoExecute"), True),
        ({"key": "gpu", "operator": "Exists"}, ("gpu", "anything", "NoSchedule"), True),
        ({"key": "gpu", "operator": "Exists"}, ("other", "", "NoSchedule"), False),
        ({"operator": "Exists"}, ("any", "thing", "NoExecute"), True),
        ({"operator": "Exists", "effect": "NoSchedule"}, ("any", "x", "NoExecute"), False),
        ({"key": "gpu", "operator": "Equal"}, ("gpu", "", "NoSchedule"), True),
    ],
)
def test_tolerations(
    toleration: dict[str, Any], taint: tuple[str, str, str], tolerated: bool
) -> None:
    key, value, effect = taint
    model = Toleration.model_validate(toleration)
    assert model.tolerates(key, value, TaintEffect(effect)) is tolerated
    assert _spec(tolerations=[toleration]).tolerates(key, value, TaintEffect(effect)) is tolerated


def test_no_tolerations_tolerate_nothing() -> None:
    assert not _spec().tolerates("gpu", "", TaintEffect.NO_SCHEDULE)


def test_unknown_pod_fields_are_kept_as_written() -> None:
    template = {
        "metadata": {"labels": {"app": "x"}, "annotations": {"a": "b"}},
        "spec": {
            "hostNetwork": True,
            "priorityClassName": "ignored-here",
            "volumes": [{"name": "data", "emptyDir": {"medium": "Memory"}}],
            "affinity": {
                "podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []},
                "nodeAffinity": {
                    "preferredDuringSchedulingIgnoredDuringExecution": [
                        {"weight": 5, "preference": {"matchExpressions": []}}
                    ],
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {"matchExpressions": [{"key": "a", "operator": "Exists"}]}
                        ]
                    },
                },
            },
            "containers": [
                {
                    "name": "worker",
                    "image": "train:1",
                    "env": [{"name": "A", "value": "1"}],
                    "resources": {"limits": {"memory": "1Gi"}},
                }
            ],
        },
    }
    model = PodTemplate.model_validate(template)
    assert model.model_dump(mode="json", by_alias=True, exclude_unset=True) == template
    assert model.worker_image == "train:1"
