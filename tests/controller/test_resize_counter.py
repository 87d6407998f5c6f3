"""The controller counts a job's resizes in ``status.resizes`` and the planner reads it back.

Aspects:
- each decision that changes the size, where ``lastResize`` is written, adds one to the
  count the status held (a status without one starts at 0), as does a suspension by
  ``spec.suspend``; a start from 0 workers is not a resize (as the simulator counts); a
  cycle that changes nothing keeps it;
- observing puts the count on the snapshot's job (``Job.resizes``), 0 where the status has
  none; a negative count is refused by the status schema, naming the field.
"""

from __future__ import annotations

from typing import Any

import pytest

from edl_scheduler.api import load_training_job
from edl_scheduler.api.errors import TrainingJobError
from edl_scheduler.controller.deciding import decide
from edl_scheduler.controller.intents import PatchStatus
from edl_scheduler.controller.observing import observe
from edl_scheduler.core import Action, Plan

from .test_deciding import CONFIG, NOW, coordinator, decision, job_body, names, of, pod, view
from .test_observing import k8s_job, k8s_node


def written(body: dict[str, Any], d: Any, pods: list[dict[str, Any]]) -> dict[str, Any]:
    out = decide({"ns/j": view(body, pods)}, Plan(NOW, (d,)), CONFIG, NOW, names())
    (patch,) = of(PatchStatus, out.intents)
    return patch.status  # type: ignore[no-any-return]


def test_each_resize_adds_one_to_the_status_count() -> None:
    pods = [pod("a"), pod("b"), pod("c"), coordinator()]
    shrink = decision(Action.SHRINK, 3, 1, remove=("b", "c"))
    body = job_body(max_r=3, phase="Running", startTime="2027-01-01T00:00:02Z", resizes=4)
    status = written(body, shrink, pods)
    assert status["resizes"] == 5 and status["lastResize"]["to"] == 1
    fresh = job_body(max_r=3, phase="Running", startTime="2027-01-01T00:00:02Z")
    assert written(fresh, shrink, pods)["resizes"] == 1


def test_a_start_from_zero_is_not_counted_and_a_suspension_is() -> None:
    start = decision(Action.START, 0, 2, add=("n0", "n1"))
    status = written(job_body(resizes=3), start, [])  # its coordinator created with it
    assert status["resizes"] == 3 and status["lastResize"]["from"] == 0
    body = job_body(phase="Running", startTime="2027-01-01T00:00:02Z", resizes=3)
    body["spec"]["suspend"] = True
    suspended = written(body, decision(Action.KEEP, 1, 1), [pod("a"), coordinator()])
    assert suspended["resizes"] == 4 and suspended["lastResize"]["reason"] == "UserSuspended"


def test_a_cycle_that_changes_nothing_keeps_the_count() -> None:
    pods = [pod("a"), coordinator()]
    keep = decision(Action.KEEP, 1, 1)
    body = job_body(phase="Running", startTime="2027-01-01T00:00:02Z", resizes=4, replicas=9)
    status = written(body, keep, pods)  # (replicas=9 makes the cycle write its status)
    assert status["resizes"] == 4 and "lastResize" not in status


def test_observing_puts_the_count_on_the_snapshot_job() -> None:
    counted = k8s_job("counted", 1, 4)
    counted["status"] = {"resizes": 7}
    jobs = observe([k8s_node("n0")], [], [counted, k8s_job("new", 1, 4)], {}).snapshot.jobs
    assert {j.name: j.resizes for j in jobs} == {"ns/counted": 7, "ns/new": 0}


def test_a_negative_count_is_refused_naming_the_field() -> None:
    bad = job_body(resizes=-1)
    with pytest.raises(TrainingJobError, match=r"status\.resizes"):
        load_training_job(bad)
