"""The controller's pure decisions: Plan + pods + progress -> intents, without an API server.

Aspects:
- a started job gets its Secret, Service and NetworkPolicy (none with
  ``--no-network-policies``), a coordinator and, in the same act when their
  room is free, one pod per planned node (held behind the Secret and Service) with the
  environment contract, owner reference, labels and GPU limits; an Admitted Event; the size
  is told to the coordinator once it answers, once even when it did not change;
- a shrink drains running victims (annotation + coordinator drain) and deletes ones that never
  started; a draining pod past its deadline is deleted; victims are named in the Event;
- a failed worker is charged, one refused at admission or failed before its coordinator
  answered is not; a failed coordinator is charged (unless refused at admission) with a
  CoordinatorFailed Event, and replaced; past maxRestarts the job Fails and keeps no pods;
- the coordinator's "finished" makes the job Succeeded; its pods go as they exit, the rest
  at the drain deadline, the coordinator last;
- an invalid job gets Valid=False and one Warning Event, and no second write when nothing
  changed; the pods of one still running keep their room;
- a maximum lowered below what runs drains the newest replicas; a job the planner set aside
  is left as it is, with SetAside=True and one Warning Event, and SetAside=False once
  planned again;
- phases follow JobPhase's diagram (Suspended -> Pending -> Running);
- status is written only when it changed; per-job coordinator ports are unique, also against
  the coordinator pods of deleted jobs (``held_ports``);
- a job whose inputs did not change since a cycle in which it produced nothing is not decided
  again (``QuietJobs``), and skipping it never changes what a cycle produces: a changed
  object, progress, node or plan decision, a draining replica or a due attained-time write
  decides it again.
"""

from __future__ import annotations

import itertools
from dataclasses import replace
from typing import Any

import pytest

from edl_scheduler.api import JobPhase, load_training_job
from edl_scheduler.controller.config import ControllerConfig, PortRange
from edl_scheduler.controller.coordinating import Progress
from edl_scheduler.controller.deciding import NodeStates, QuietJobs, decide
from edl_scheduler.controller.intents import (
    CreateCoordinator,
    CreatePod,
    DeletePod,
    Drain,
    Emit,
    EnsureObjects,
    JobView,
    MarkDraining,
    PatchStatus,
    SetTarget,
)
from edl_scheduler.controller.observing import observe
from edl_scheduler.controller.podstate import group_pods, iso_time, step_toward
from edl_scheduler.core import (
    Action,
    JobDecision,
    Plan,
    Reason,
    Resources,
    Role,
    RoleChange,
    plan,
    preset,
)
from trainer_runtime.protocol.credentials import CallerRole, Claims

CONFIG = ControllerConfig(
    token_key=b"k" * 32, coordinator_host="127.0.0.1", coordinator_ports=PortRange(21000, 21010)
)
NOW = 1_800_000_000.0


def job_body(name: str = "j", min_r: int = 1, max_r: int = 2, **status: Any) -> dict[str, Any]:
    return {
        "apiVersion": "edl.dev/v1alpha1",
        "kind": "TrainingJob",
        "metadata": {
            "name": name,
            "namespace": "ns",
            "uid": f"uid-{name}",
            "creationTimestamp": "2027-01-01T00:00:00Z",
            "annotations": {"edl.dev/coordinator-args": "--samples 100"},
        },
        "spec": {
            "minReplicas": min_r,
            "maxReplicas": max_r,
            "framework": "none",
            "resources": {"nvidia.com/gpu": 1},
            "failurePolicy": {"maxRestarts": 1},
            "timeouts": {"drainSeconds": 5},
            "template": {"spec": {"containers": [{"name": "w", "image": "img"}]}},
        },
        "status": status,
    }


def pod(
    name: str, job: str = "j", role: str = "worker", node: str = "n0", phase: str = "Running",
    **extra: Any,
) -> dict[str, Any]:  # fmt: skip
    meta: dict[str, Any] = {
        "name": name,
        "namespace": "ns",
        "labels": {"edl.dev/job": job, "edl.dev/role": role},
        "creationTimestamp": "2027-01-01T00:00:01Z",
    }
    meta |= extra.pop("meta", {})
    return {
        "metadata": meta,
        "spec": {"nodeName": node, "containers": [{"name": "w"}]},
        "status": {"phase": phase, **extra},
    }


def coordinator(job: str = "j", port: int = 21000, phase: str = "Running") -> dict[str, Any]:
    return pod(
        f"{job}-coordinator", job, "coordinator", phase=phase,
        meta={"annotations": {"edl.dev/coordinator-port": str(port)}},
    )  # fmt: skip


def young_coordinator(phase: str = "Running") -> dict[str, Any]:
    """A coordinator whose pod was created 5 s before ``NOW``."""
    found = coordinator(phase=phase)
    found["metadata"]["creationTimestamp"] = iso_time(NOW - 5)
    return found


def names() -> Any:
    counter = itertools.count()
    return lambda job, role: f"{job}-{role}-{next(counter)}"


def view(body: dict[str, Any], pods: list[dict[str, Any]] = (), **kw: Any) -> JobView:  # type: ignore[assignment]
    replicas, coord = group_pods(pods).get("ns/" + body["metadata"]["name"], ([], None))
    return JobView(body, load_training_job(body), None, tuple(replicas), coord, **kw)


def decision(action: Action, cur: int, tgt: int, add=(), remove=(), for_job=None) -> JobDecision:  # type: ignore[no-untyped-def]
    return JobDecision(
        "ns/j", action, Reason.STARTED, "msg", RoleChange(Role.WORKER, cur, tgt, add, remove),
        for_job=for_job,
    )  # fmt: skip


def of(kind: type, intents: list[Any]) -> list[Any]:
    return [i for i in intents if isinstance(i, kind)]


def test_start_creates_objects_coordinator_and_placed_workers() -> None:
    body = job_body()
    nodes = [
        {"metadata": {"name": "n0"}, "spec": {},
         "status": {"allocatable": {"nvidia.com/gpu": "1"},
                    "conditions": [{"type": "Ready", "status": "True"}]}},
        {"metadata": {"name": "n1"}, "spec": {},
         "status": {"allocatable": {"nvidia.com/gpu": "1"},
                    "conditions": [{"type": "Ready", "status": "True"}]}},
    ]  # fmt: skip
    obs = observe(nodes, [], [body], {})
    p = plan(obs.snapshot, preset("edl"), NOW)
    first = decide({"ns/j": view(body)}, p, CONFIG, NOW, names())
    assert [type(i) for i in first.intents[:2]] == [EnsureObjects, CreateCoordinator]
    kinds = [m["kind"] for m in of(EnsureObjects, first.intents)[0].manifests]
    assert kinds == ["Service", "NetworkPolicy"]
    # Where no CNI enforces them (``--no-network-policies``), no NetworkPolicy is created.
    off = replace(CONFIG, network_policies=False)
    bare = decide({"ns/j": view(body)}, p, off, NOW, names())
    assert [m["kind"] for m in of(EnsureObjects, bare.intents)[0].manifests] == ["Service"]
    # The workers are created in the same act as their coordinator (their room is free),
    # held by the actuator until the Service exists (``job``), each after the Secret with
    # its own credential; the size is told to the coordinator once it answers.
    created = of(CreatePod, first.intents)
    assert [c.job for c in created] == ["ns/j", "ns/j"]
    keys = CONFIG.credentials_for("ns", "j", "uid-j")
    for c in created:  # each its own credential, for its own worker id, in its own Secret
        assert c.credential is not None
        assert c.credential["metadata"]["name"] == f"{c.manifest['metadata']['name']}-credential"
        claims = keys.verifier().claims(c.credential["stringData"]["token"])
        assert claims == Claims("ns/j/uid-j", CallerRole.WORKER, c.manifest["metadata"]["name"])
    pods = [c.manifest for c in created]
    assert sorted(p["spec"]["nodeName"] for p in pods) == ["n0", "n1"]
    for manifest in pods:
        env = {e["name"]: e for e in manifest["spec"]["containers"][0]["env"]}
        assert env["EDL_COORDINATOR"]["value"] == "127.0.0.1:21000"
        assert env["EDL_WORKER_ID"]["value"] == manifest["metadata"]["name"]
        name = manifest["metadata"]["name"]
        secret = env["EDL_JOB_TOKEN"]["valueFrom"]["secretKeyRef"]
        assert secret == {"name": f"{name}-credential", "key": "token"}
        assert manifest["metadata"]["ownerReferences"][0]["uid"] == "uid-j"
        assert manifest["spec"]["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": "1"}
    assert of(SetTarget, first.intents) == []
    assert [e.reason.value for e in of(Emit, first.intents)] == ["Admitted"]
    status = of(PatchStatus, first.intents)[0].status
    assert status["replicas"] == 2
    # Its pod Running and answering for the first time: it is told the size once, although
    # the plan's size did not change; then no more.
    workers = [pod(str(m["metadata"]["name"]), node=m["spec"]["nodeName"]) for m in pods]
    steady = decision(Action.KEEP, 2, 2)
    answered = view(body, [coordinator(), *workers], coordinator_ready=True, target_due=True)
    out = decide({"ns/j": answered}, Plan(NOW, (steady,)), CONFIG, NOW, names())
    assert of(SetTarget, out.intents) == [SetTarget("ns/j", 2)]
    assert of(CreatePod, out.intents) == [] and of(CreateCoordinator, out.intents) == []
    told = view(body, [coordinator(), *workers], coordinator_ready=True)
    out = decide({"ns/j": told}, Plan(NOW, (steady,)), CONFIG, NOW, names())
    assert of(SetTarget, out.intents) == []


def test_workers_start_with_their_coordinator_and_wait_only_for_room() -> None:
    body = job_body()
    start = Plan(NOW, (decision(Action.START, 0, 2, add=("n0", "n1")),))
    cases = [
        ([young_coordinator(phase="Pending")], False),  # not running yet
        ([young_coordinator()], False),  # running, not answering yet
        ([coordinator(phase="Failed")], True),  # ended: replaced, its answer is void
        ([], True),  # none yet
    ]
    for pods, replaced in cases:
        out = decide({"ns/j": view(body, pods)}, start, CONFIG, NOW, names())
        assert bool(of(CreateCoordinator, out.intents)) is replaced
        # Behind the Secret and Service only when this cycle ensures them.
        assert [c.job for c in of(CreatePod, out.intents)] == ["ns/j" if replaced else ""] * 2
        assert of(SetTarget, out.intents) == []  # not asked before it answers
    # A coordinator that has not answered long after its pod was created: new workers wait
    # for its answer (else each batch would fail, uncharged, and be replaced, forever).
    old = decide({"ns/j": view(body, [coordinator()])}, start, CONFIG, NOW, names())
    assert of(CreatePod, old.intents) == [] and of(CreateCoordinator, old.intents) == []
    message = of(PatchStatus, old.intents)[0].status["message"]
    assert message.endswith("waiting for its coordinator to answer")
    answered = view(body, [coordinator()], coordinator_ready=True)
    assert len(of(CreatePod, decide({"ns/j": answered}, start, CONFIG, NOW, names()).intents)) == 2
    # The room still held by leaving replicas: the coordinator, no workers yet.
    full = NodeStates(
        frozenset({"n0", "n1"}), frozenset(), {"n0": Resources(), "n1": Resources(gpu=1)}
    )
    out = decide({"ns/j": view(body)}, start, CONFIG, NOW, names(), nodes=full)
    assert of(CreatePod, out.intents) == [] and len(of(CreateCoordinator, out.intents)) == 1
    message = of(PatchStatus, out.intents)[0].status["message"]
    assert message.endswith("waiting for leaving replicas to go")


def test_shrink_drains_running_victims_and_deletes_unstarted_ones() -> None:
    body = job_body(max_r=3, phase="Running", startTime="2027-01-01T00:00:02Z")
    pods = [pod("a"), pod("b"), pod("c", phase="Pending"), coordinator()]
    d = decision(Action.SHRINK, 3, 1, remove=("b", "c"), for_job="ns/high")
    out = decide({"ns/j": view(body, pods)}, Plan(NOW, (d,)), CONFIG, NOW, names())
    assert of(MarkDraining, out.intents) == [MarkDraining("ns", "b", NOW)]
    assert of(Drain, out.intents) == [Drain("ns/j", "b")]
    assert of(DeletePod, out.intents) == [DeletePod("ns", "c")]
    preempted = next(e for e in of(Emit, out.intents) if e.reason.value == "Preempted")
    assert "b, c" in preempted.message and "ns/high" in preempted.message
    assert out.counts.preemptions == 1
    assert out.counts.resizes == {("down", "Started"): 1}
    status = of(PatchStatus, out.intents)[0].status
    assert status["phase"] == "Resizing" and status["replicas"] == 1


def test_draining_pod_is_deleted_at_its_deadline_only() -> None:
    body = job_body(phase="Running")
    draining = pod("a", meta={"annotations": {"edl.dev/draining": "true",
                                              "edl.dev/drain-since": str(NOW - 4)}})  # fmt: skip
    before = decide({"ns/j": view(body, [draining, coordinator()])}, None, CONFIG, NOW, names())
    assert not of(DeletePod, before.intents)
    after = decide({"ns/j": view(body, [draining, coordinator()])}, None, CONFIG, NOW + 2, names())
    assert of(DeletePod, after.intents) == [DeletePod("ns", "a")]


def test_failures_are_charged_refusals_are_not_and_the_budget_ends_the_job() -> None:
    body = job_body(phase="Running")
    refused = pod("a", phase="Failed", reason="OutOfnvidia.com/gpu")
    out = decide({"ns/j": view(body, [refused, coordinator()])}, None, CONFIG, NOW, names())
    assert of(DeletePod, out.intents) == [DeletePod("ns", "a")]
    assert of(PatchStatus, out.intents)[0].status["restarts"] == 0
    failed = pod("b", phase="Failed")
    # Before its coordinator answered, a worker that gave up waiting for it is not charged.
    out = decide({"ns/j": view(body, [failed, coordinator()])}, None, CONFIG, NOW, names())
    assert of(DeletePod, out.intents) == [DeletePod("ns", "b")]
    assert of(PatchStatus, out.intents)[0].status["restarts"] == 0
    assert "ReplicaFailed" not in [e.reason.value for e in of(Emit, out.intents)]
    out = decide(
        {"ns/j": view(body, [failed, coordinator()], coordinator_ready=True)},
        None, CONFIG, NOW, names(),
    )  # fmt: skip
    assert of(PatchStatus, out.intents)[0].status["restarts"] == 1
    body = job_body(phase="Running", restarts=1)
    out = decide(
        {"ns/j": view(body, [failed, pod("c"), coordinator()], coordinator_ready=True)},
        None, CONFIG, NOW, names(),
    )  # fmt: skip
    status = of(PatchStatus, out.intents)[0].status
    assert status["phase"] == "Failed" and status["restarts"] == 2
    # Its coordinator goes once the Failed phase is read back (``leaving.finish``).
    assert {i.name for i in of(DeletePod, out.intents)} == {"b", "c"}
    assert "Failed" in [e.reason.value for e in of(Emit, out.intents)]


def test_a_failed_coordinator_is_charged_and_replaced_and_the_budget_ends_the_job() -> None:
    """A coordinator that keeps failing (a crash at start, a state it cannot load) costs a
    restart each time, as a replica does, so the job ends instead of replacing it forever;
    one refused at admission is replaced uncharged."""
    body = job_body(phase="Running")
    crashed = coordinator(phase="Failed")
    crashed["status"]["containerStatuses"] = [
        {"name": "coordinator", "state": {"terminated": {"exitCode": 2, "reason": "Error"}}}
    ]
    start = Plan(NOW, (decision(Action.START, 0, 1, add=("n0",)),))
    out = decide({"ns/j": view(body, [crashed])}, start, CONFIG, NOW, names())
    assert of(DeletePod, out.intents) == [DeletePod("ns", "j-coordinator")]
    assert len(of(CreateCoordinator, out.intents)) == 1  # replaced from its saved state
    assert of(PatchStatus, out.intents)[0].status["restarts"] == 1
    events = [e for e in of(Emit, out.intents) if e.reason.value == "CoordinatorFailed"]
    assert len(events) == 1 and "exit code 2: Error" in events[0].message
    assert "1 of 1 restarts used" in events[0].message
    refused = coordinator(phase="Failed")
    refused["status"]["reason"] = "OutOfcpu"
    out = decide({"ns/j": view(body, [refused])}, start, CONFIG, NOW, names())
    assert of(PatchStatus, out.intents)[0].status["restarts"] == 0
    assert len(of(CreateCoordinator, out.intents)) == 1
    assert "CoordinatorFailed" not in [e.reason.value for e in of(Emit, out.intents)]
    # It exited 0 (not failed): replaced, not charged.
    ended = decide(
        {"ns/j": view(body, [coordinator(phase="Succeeded")])}, start, CONFIG, NOW, names()
    )
    assert of(PatchStatus, ended.intents)[0].status["restarts"] == 0
    # The budget (maxRestarts 1) spent: the next failure ends the job, with no new coordinator.
    body = job_body(phase="Running", restarts=1)
    out = decide({"ns/j": view(body, [crashed, pod("a")])}, start, CONFIG, NOW, names())
    status = of(PatchStatus, out.intents)[0].status
    assert status["phase"] == "Failed" and status["restarts"] == 2
    assert of(CreateCoordinator, out.intents) == []
    assert {i.name for i in of(DeletePod, out.intents)} == {"a", "j-coordinator"}


def test_finished_coordinator_makes_the_job_succeed() -> None:
    body = job_body(phase="Running")
    progress = Progress(3, 1, 1, 10, 100, 100, True, ("a",), (), ())
    pods = [pod("a"), pod("c", phase="Succeeded"), coordinator()]
    out = decide(
        {"ns/j": view(body, pods, progress=progress)},
        None, CONFIG, NOW, names(),
    )  # fmt: skip
    status = of(PatchStatus, out.intents)[0].status
    assert status["phase"] == "Succeeded" and status["completionTime"]
    assert {i.name for i in of(DeletePod, out.intents)} == {"c"}  # "c" had already exited
    assert out.counts.completed_s
    # The last answer is the one kept: the status does not stop at the poll before it.
    assert status["progress"]["finished"] is True
    assert status["progress"]["samplesDone"] == 100


def test_a_finished_jobs_coordinator_stays_until_its_phase_is_read_back() -> None:
    """Removed in the cycle that writes Succeeded, a coordinator whose job's write is lost
    (the controller killed) would be replaced from its last saved snapshot when the job,
    seen unfinished, starts again: what was committed since would be trained twice."""
    progress = Progress(3, 1, 1, 10, 100, 100, True, (), (), ())
    pods = [pod("c", phase="Succeeded"), coordinator()]
    body = job_body(phase="Running")
    out = decide({"ns/j": view(body, pods, progress=progress)}, None, CONFIG, NOW, names())
    assert of(PatchStatus, out.intents)[0].status["phase"] == "Succeeded"
    assert {i.name for i in of(DeletePod, out.intents)} == {"c"}
    # Read back (the write landed): the coordinator goes, no worker running.
    done = job_body(phase="Succeeded", completionTime="2027-01-15T08:00:00Z")
    later = decide({"ns/j": view(done, [coordinator()])}, None, CONFIG, NOW + 1, names())
    assert {i.name for i in of(DeletePod, later.intents)} == {"j-coordinator"}


def test_a_final_phase_not_yet_seen_through_the_watch_keeps_the_coordinator() -> None:
    """The next cycle plans on the status it queued (``Expectations.overlay_job``): a job
    that looks Succeeded there may still be Running on the API server if the controller dies
    before the write. Its coordinator, removed then, would be replaced from an older snapshot
    by the next controller, which sees an unfinished job without replicas and starts it."""
    done = job_body(phase="Succeeded", completionTime="2027-01-15T08:00:00Z")
    queued = decide(
        {"ns/j": view(done, [coordinator()], status_unseen=True)}, None, CONFIG, NOW, names()
    )
    assert of(DeletePod, queued.intents) == []
    seen = decide({"ns/j": view(done, [coordinator()])}, None, CONFIG, NOW, names())
    assert {i.name for i in of(DeletePod, seen.intents)} == {"j-coordinator"}


def test_a_worker_that_exited_0_stays_until_its_coordinator_answers() -> None:
    """A restarted controller does not know yet whether the job finished: the worker that
    exited 0 unasked is neither removed nor replaced until the coordinator has answered
    (then, not finished: removed, and the plan replaces it)."""
    body = job_body(phase="Running")
    pods = [pod("a"), pod("c", phase="Succeeded"), coordinator()]
    plan = Plan(NOW, (decision(Action.GROW, 1, 2, add=("n0",)),))  # it replaces "c"
    unknown = decide({"ns/j": view(body, pods)}, plan, CONFIG, NOW, names())
    assert not of(DeletePod, unknown.intents) and not of(CreatePod, unknown.intents)
    heard = decide({"ns/j": view(body, pods, coordinator_ready=True)}, None, CONFIG, NOW, names())
    assert {i.name for i in of(DeletePod, heard.intents)} == {"c"}


def test_succeeded_jobs_pods_go_as_they_exit_then_at_the_drain_deadline() -> None:
    """A worker told that the job finished may still be writing its output: it is not cut
    off with SIGTERM; the coordinator goes when no worker runs; a hung one goes at the
    deadline. A job that stays in this state is never skipped as quiet."""
    body = job_body(phase="Succeeded", completionTime="2027-01-15T08:00:00Z")
    ended = 1_800_000_000.0  # 2027-01-15T08:00:00Z
    body["spec"]["timeouts"] = {"drainSeconds": 30}
    quiet = QuietJobs()

    def deleted(pods: list[dict[str, Any]], now: float) -> set[str]:
        out = decide({"ns/j": view(body, pods)}, None, CONFIG, now, names(), quiet=quiet)
        return {i.name for i in of(DeletePod, out.intents)}

    assert deleted([pod("a", phase="Succeeded"), pod("b"), coordinator()], ended + 1) == {"a"}
    assert deleted([pod("b", phase="Succeeded"), coordinator()], ended + 2) == {
        "b", "j-coordinator",
    }  # fmt: skip
    running = [pod("a"), pod("b"), coordinator()]
    assert deleted(running, ended + 3) == set()
    # the same objects at the deadline: decided again, not skipped as quiet
    assert deleted(running, ended + 30) == {"a", "b", "j-coordinator"}


def test_invalid_job_is_reported_once() -> None:
    body = job_body(min_r=3, max_r=2)
    bad = JobView(body, None, "spec.maxReplicas: 2 is below minReplicas (3)")
    out = decide({"ns/j": bad}, None, CONFIG, NOW, names())
    status = of(PatchStatus, out.intents)[0].status
    assert status["conditions"][0]["status"] == "False"
    assert [e.type.value for e in of(Emit, out.intents)] == ["Warning"]
    again = JobView(body | {"status": status}, None, bad.rejected)
    assert decide({"ns/j": again}, None, CONFIG, NOW, names()).intents == []


def _node(name: str, gpus: int) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "spec": {},
        "status": {
            "allocatable": {"nvidia.com/gpu": str(gpus)},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


def test_a_maximum_lowered_below_what_runs_drains_the_newest() -> None:
    """``kubectl scale`` or ``edit`` to 1 while 3 run: the newest two drain through the
    coordinator, with a ScaledDown Event; another job is planned in the same cycle."""
    body = job_body(max_r=1, phase="Running", startTime="2027-01-01T00:00:02Z")
    workers = [pod(f"j-worker-{i}") for i in range(3)]
    for i, w in enumerate(workers):
        w["metadata"]["creationTimestamp"] = f"2027-01-01T00:00:0{i + 1}Z"
    other = job_body("k", max_r=1)
    pods = [*workers, coordinator()]
    obs = observe([_node("n0", 4)], pods, [body, other], {})
    p = plan(obs.snapshot, preset("edl"), NOW)
    d = p.decision("ns/j")
    assert d.reason is Reason.SHRUNK_TO_MAXIMUM and d.workers.remove == ("j-worker-2", "j-worker-1")
    assert p.decision("ns/k").action is Action.START
    views = {"ns/j": view(body, pods, coordinator_ready=True), "ns/k": view(other)}
    out = decide(views, p, CONFIG, NOW, names())
    assert of(Drain, out.intents) == [Drain("ns/j", "j-worker-2"), Drain("ns/j", "j-worker-1")]
    assert SetTarget("ns/j", 1) in of(SetTarget, out.intents)
    assert [
        c.manifest["metadata"]["labels"]["edl.dev/job"] for c in of(CreatePod, out.intents)
    ] == ["k"]
    down = [e for e in of(Emit, out.intents) if e.reason.value == "ScaledDown"]
    assert len(down) == 1 and "maxReplicas is 1" in down[0].message


def test_a_job_set_aside_is_left_as_it_is_and_said_once() -> None:
    body = job_body(phase="Running", startTime="2027-01-01T00:00:02Z")
    pods = [pod("a"), coordinator()]
    message = "set aside: job ns/j: replica a is on unknown node 'gone': delete the replica"
    aside = JobDecision(
        "ns/j", Action.KEEP, Reason.SET_ASIDE, message, RoleChange(Role.WORKER, 1, 1)
    )
    out = decide({"ns/j": view(body, pods)}, Plan(NOW, (aside,)), CONFIG, NOW, names())
    assert not of(CreatePod, out.intents) and not of(Drain, out.intents)
    assert not of(DeletePod, out.intents) and not of(SetTarget, out.intents)
    warned = [e for e in of(Emit, out.intents) if e.reason.value == "SetAside"]
    assert len(warned) == 1 and warned[0].type.value == "Warning" and warned[0].message == message
    status = of(PatchStatus, out.intents)[0].status
    cond = next(c for c in status["conditions"] if c["type"] == "SetAside")
    assert cond["status"] == "True" and cond["message"] == message
    # Still set aside the next cycle: no second Event.
    again = decide(
        {"ns/j": view(body | {"status": status}, pods)}, Plan(NOW, (aside,)), CONFIG, NOW + 1,
        names(),
    )  # fmt: skip
    assert not [e for e in of(Emit, again.intents) if e.reason.value == "SetAside"]
    # Planned again: the condition turns False.
    steady = decision(Action.KEEP, 1, 1)
    out = decide(
        {"ns/j": view(body | {"status": status}, pods)}, Plan(NOW, (steady,)), CONFIG, NOW + 2,
        names(),
    )  # fmt: skip
    status = of(PatchStatus, out.intents)[0].status
    cond = next(c for c in status["conditions"] if c["type"] == "SetAside")
    assert cond["status"] == "False" and cond["reason"] == "Planned"


def test_the_pods_of_a_rejected_job_keep_their_room() -> None:
    """A job left out of the snapshot (its spec is refused) still runs its pods: what they
    take is not handed to another job."""
    bad = job_body(min_r=3, max_r=2)  # min above max: refused
    bad["metadata"]["name"] = "j"
    other = job_body("k", max_r=4)
    pods = [pod("j-worker-0"), pod("j-worker-1")]
    for p in pods:
        p["spec"]["containers"][0]["resources"] = {"requests": {"nvidia.com/gpu": "1"}}
    obs = observe([_node("n0", 4)], pods, [bad, other], {})
    assert "ns/j" in obs.rejected
    assert obs.snapshot.nodes[0].used_by_others.gpu == 2
    assert plan(obs.snapshot, preset("edl"), NOW).decision("ns/k").workers.target == 2


def test_parameter_servers_left_without_a_spec_keep_their_room() -> None:
    """A job whose spec no longer has parameter servers while some still run is set aside;
    what they take comes from their pods, so nothing else is placed on it."""
    body = job_body(phase="Running", startTime="2027-01-01T00:00:02Z")
    pods = [pod("j-worker-0"), pod("j-pserver-0", role="pserver"), coordinator()]
    for p in pods[:2]:
        p["spec"]["containers"][0]["resources"] = {"requests": {"nvidia.com/gpu": "1"}}
    other = job_body("k", max_r=4)
    obs = observe([_node("n0", 4)], pods, [body, other], {})
    p = plan(obs.snapshot, preset("edl"), NOW)
    assert p.decision("ns/j").reason is Reason.SET_ASIDE
    assert "pserver replicas but no pserver spec" in p.decision("ns/j").message
    assert p.decision("ns/k").workers.target == 2


def test_unchanged_status_is_not_written_again() -> None:
    body = job_body(phase="Running")
    pods = [pod("a"), coordinator()]
    first = of(PatchStatus, decide({"ns/j": view(body, pods)}, None, CONFIG, NOW, names()).intents)
    body["status"] = first[0].status
    second = decide({"ns/j": view(body, pods)}, None, CONFIG, NOW + 1, names())
    assert not of(PatchStatus, second.intents)


@pytest.mark.parametrize(
    ("current", "desired", "expected"),
    [
        (JobPhase.SUSPENDED, JobPhase.RUNNING, JobPhase.PENDING),
        (JobPhase.PENDING, JobPhase.RESIZING, JobPhase.RUNNING),
        (JobPhase.RESIZING, JobPhase.PENDING, JobPhase.RUNNING),
        (JobPhase.RUNNING, JobPhase.SUCCEEDED, JobPhase.SUCCEEDED),
        (JobPhase.SUCCEEDED, JobPhase.RUNNING, JobPhase.SUCCEEDED),
    ],
)
def test_phases_follow_the_diagram(
    current: JobPhase, desired: JobPhase, expected: JobPhase
) -> None:
    assert step_toward(current, desired) is expected


def test_each_new_coordinator_takes_a_free_port() -> None:
    bodies = {f"ns/{n}": job_body(n) for n in ("a", "b")}
    taken = [coordinator("c", port=21000)]
    views = {k: view(b, taken) for k, b in bodies.items()}
    decisions = tuple(
        JobDecision(k, Action.START, Reason.STARTED, "m", RoleChange(Role.WORKER, 0, 1, ("n0",)))
        for k in bodies
    )
    views["ns/c"] = view(job_body("c", phase="Running"), [*taken, pod("x", job="c")])
    out = decide(views, Plan(NOW, decisions), CONFIG, NOW, names())
    ports = sorted(i.port for i in of(CreateCoordinator, out.intents))
    assert ports == [21001, 21002]
    # A deleted job's coordinator, its pod not yet collected, keeps its port too.
    out = decide(views, Plan(NOW, decisions), CONFIG, NOW, names(), held_ports=[21001])
    assert sorted(i.port for i in of(CreateCoordinator, out.intents)) == [21002, 21003]


def test_written_status_stays_until_the_watch_shows_that_write() -> None:
    from edl_scheduler.controller.expecting import Expectations

    expectations = Expectations()
    expectations.statuses["ns/j"] = ({"phase": "Failed"}, "120", 0.0)
    older = job_body(phase="Running")
    older["metadata"]["resourceVersion"] = "110"
    assert expectations.overlay_job(older)["status"] == {"phase": "Failed"}
    newer = job_body(phase="Failed")
    newer["metadata"]["resourceVersion"] = "121"
    assert expectations.overlay_job(newer) is newer
    assert expectations.overlay_job(older) is older  # forgotten once seen


def _quiet_setup() -> tuple[dict[str, Any], list[dict[str, Any]], Progress]:
    body = job_body(phase="Running")
    pods = [pod("a"), coordinator()]
    progress = Progress(1, 0, 3, 0, 0, 100, False, ("a",), (), ())
    first = decide({"ns/j": view(body, pods, progress=progress)}, None, CONFIG, NOW, names())
    body["status"] = of(PatchStatus, first.intents)[0].status
    return body, pods, progress


def test_a_quiet_job_is_skipped_until_its_inputs_change() -> None:
    body, pods, progress = _quiet_setup()
    quiet = QuietJobs()
    nodes = NodeStates(frozenset({"n0"}))
    views = {"ns/j": view(body, pods, progress=progress)}
    assert decide(views, None, CONFIG, NOW, names(), nodes=nodes, quiet=quiet).intents == []
    assert quiet.skipped == 0  # a new instance (a restarted controller) decides every job
    assert decide(views, None, CONFIG, NOW + 1, names(), nodes=nodes, quiet=quiet).intents == []
    assert quiet.skipped == 1
    finished = Progress(1, 3, 3, 9, 300, 100, True, ("a",), (), ())
    lost = NodeStates(frozenset({"n1"}))
    failed = [pod("a", phase="Failed"), coordinator()]
    changes = [
        ({"ns/j": view(body, pods, progress=finished)}, None, nodes),
        ({"ns/j": view(body, failed, progress=progress)}, None, nodes),
        ({"ns/j": view(body, pods, progress=progress)}, None, lost),
        (views, Plan(NOW, (decision(Action.SHRINK, 1, 0, remove=("a",)),)), nodes),
    ]
    for changed, planned, states in changes:
        direct = decide(changed, planned, CONFIG, NOW + 2, names(), nodes=states)
        assert direct.intents  # each change matters
        skipped = quiet.skipped
        kept = decide(changed, planned, CONFIG, NOW + 2, names(), nodes=states, quiet=quiet)
        assert quiet.skipped == skipped
        assert kept.intents == direct.intents
        # The same quiet inputs as before are skipped again.
        assert decide(views, None, CONFIG, NOW + 3, names(), nodes=nodes, quiet=quiet).intents == []


def test_a_draining_replica_or_a_due_attained_write_is_always_decided() -> None:
    body, _, progress = _quiet_setup()
    draining = pod("a", meta={"annotations": {"edl.dev/draining": "true",
                                              "edl.dev/drain-since": str(NOW - 4)}})  # fmt: skip
    quiet = QuietJobs()
    views = {"ns/j": view(body, [draining, coordinator()], progress=progress)}
    assert not of(DeletePod, decide(views, None, CONFIG, NOW, names(), quiet=quiet).intents)
    after = decide(views, None, CONFIG, NOW + 2, names(), quiet=quiet)
    assert of(DeletePod, after.intents) == [DeletePod("ns", "a")] and quiet.skipped == 0
    due = QuietJobs(due=lambda key: key == "ns/j")
    views = {"ns/j": view(body, [pod("a"), coordinator()], progress=progress)}
    for t in (NOW, NOW + 1):
        decide(views, None, CONFIG, t, names(), quiet=due)
    assert due.skipped == 0
