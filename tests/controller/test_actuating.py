"""Statuses and Events written in the background (``reporting.StatusWriter``), without an API
server.

Aspects:
- a cycle's ``Actuator.run`` returns once its pods are written, while its status writes are
  still in flight; the next cycle already sees the queued status (``overlay_job``);
- one write at a time per job, and the latest status wins: one queued while another is in
  flight replaces any older one not yet sent, so the last write is the last decided;
- a failed write drops its expectation (the next cycle decides from the API and writes
  again), unless a newer status was queued meanwhile; a written one keeps the version the
  API answered until the watch shows it;
- a coordinator's saved state is read beside its Secret, and its pod created only when the
  read succeeded;
- each write waits only for what it depends on: the pods created with a coordinator for
  its Secret and Service (none when one failed), a drain for its mark; a victim's drain
  does not wait for another job's slow Secret;
- Events are posted in the background too; neither starts while a cycle acts (``hold``);
- ``flush`` (a leader's graceful stop) writes what a held cycle queued at once and returns
  once nothing is left, or False at its timeout while a write hangs.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, cast

from edl_scheduler.api import load_training_job
from edl_scheduler.controller.actuating import Actuator
from edl_scheduler.controller.config import ControllerConfig
from edl_scheduler.controller.expecting import QUEUED, Expectations
from edl_scheduler.controller.intents import (
    CreateCoordinator,
    CreatePod,
    Drain,
    Emit,
    EnsureObjects,
    EventReason,
    EventType,
    MarkDraining,
    PatchStatus,
)
from edl_scheduler.controller.kubeapi import Kube, KubeError
from edl_scheduler.controller.naming import STATE_KEY
from edl_scheduler.controller.reporting import StatusWriter


def eventually(check: Callable[[], bool], within_s: float = 5.0) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.01)
    return check()


class GatedKube:
    """Answers every request; status PATCHes wait until ``gate`` is set."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.calls: list[tuple[str, str, Any]] = []
        self.lock = threading.Lock()
        self.version = 100

    def request(
        self, method: str, path: str, body: Any = None, content_type: str | None = None
    ) -> Any:
        if path.endswith("/status"):
            assert self.gate.wait(10), "the test never opened the gate"
        with self.lock:
            self.calls.append((method, path, body))
            self.version += 1
            return {"metadata": {"resourceVersion": str(self.version)}}


def job(status: dict[str, Any] | None = None, version: str = "1") -> dict[str, Any]:
    meta = {"namespace": "ns", "name": "j", "resourceVersion": version}
    return {"metadata": meta, "status": status or {}}


def pod(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"namespace": "ns", "name": name}}


def test_a_cycle_does_not_wait_for_its_status_writes() -> None:
    kube = GatedKube()
    actuator = Actuator(cast(Kube, kube), ControllerConfig(token_key=b"k" * 32), lambda _j: None)
    try:
        status = {"phase": "Running", "replicas": 2}
        event = Emit("ns", "j", "uid", EventType.NORMAL, EventReason.ADMITTED, "admitted")
        started = time.monotonic()
        actuator.run([PatchStatus("ns", "j", status), CreatePod(pod("j-worker-1")), event])
        assert time.monotonic() - started < 5.0
        assert not actuator.writer.idle(), "the status write is still in flight"

        def methods() -> list[tuple[str, str]]:
            with kube.lock:
                return [(m, p.rsplit("/", 1)[-1]) for m, p, _ in kube.calls]

        assert ("POST", "pods") in methods()
        # The Event is posted in the background too, a moment after run returns: waited
        # for while the status write still hangs on the gate.
        assert eventually(lambda: ("POST", "events") in methods()), (
            "an Event does not wait for a status"
        )
        # The next cycle plans on the queued status, whatever version the watch shows.
        assert actuator.expectations.overlay_job(job(version="999"))["status"] == status
        assert actuator.expectations.status_unseen("ns/j")
        kube.gate.set()
        assert eventually(actuator.writer.idle)
        patches = [b for m, p, b in kube.calls if p.endswith("/status")]
        assert patches == [[{"op": "add", "path": "/status", "value": status}]]
        written = actuator.expectations.statuses["ns/j"]
        assert written[1] != QUEUED
        # Shown by the watch (its version or a later one): the expectation ends.
        assert actuator.expectations.overlay_job(job(version=written[1]))["status"] == {}
        assert "ns/j" not in actuator.expectations.statuses
        assert not actuator.expectations.status_unseen("ns/j")
    finally:
        kube.gate.set()
        actuator.close()


def test_the_latest_status_wins_and_writes_of_a_job_never_overlap() -> None:
    expectations = Expectations()
    gate = threading.Event()
    in_flight: list[str] = []
    written: list[str] = []
    overlapped: list[bool] = []
    lock = threading.Lock()

    def patch(intent: PatchStatus) -> str:
        with lock:
            overlapped.append(bool(in_flight))
            in_flight.append(intent.status["message"])
        assert gate.wait(10)
        with lock:
            in_flight.pop()
            written.append(intent.status["message"])
            return str(len(written) + 10)

    writer = StatusWriter(expectations, patch, lambda call: call())
    try:
        writer.status(PatchStatus("ns", "j", {"message": "first"}))
        assert eventually(lambda: in_flight == ["first"])
        for message in ("second", "third", "fourth"):
            writer.status(PatchStatus("ns", "j", {"message": message}))
        assert expectations.overlay_job(job())["status"] == {"message": "fourth"}
        gate.set()
        assert eventually(writer.idle)
        assert written == ["first", "fourth"], "statuses queued behind a write: the latest"
        assert overlapped == [False, False]
        status, version, _ = expectations.statuses["ns/j"]
        assert status == {"message": "fourth"} and version == "12"
    finally:
        gate.set()
        writer.close()


def test_a_failed_write_leaves_the_status_to_the_next_cycle() -> None:
    expectations = Expectations()
    failures: list[BaseException] = []
    gate = threading.Event()

    tried: list[str] = []

    def patch(intent: PatchStatus) -> str:
        tried.append(intent.status["message"])
        if intent.status["message"] == "slow":
            assert gate.wait(10)
            assert expectations.statuses["ns/k"][0] == {"message": "newer"}
        raise KubeError(503, "unavailable")

    def guarded(call: Callable[[], None]) -> None:
        try:
            call()
        except KubeError as error:
            failures.append(error)

    writer = StatusWriter(expectations, patch, guarded)
    try:
        writer.status(PatchStatus("ns", "j", {"message": "lost"}))
        assert eventually(writer.idle)
        assert len(failures) == 1
        assert "ns/j" not in expectations.statuses, "the next cycle decides from the API"
        assert expectations.overlay_job(job({"message": "api"}))["status"] == {"message": "api"}
        # A newer status queued while the older write fails keeps its expectation.
        writer.status(PatchStatus("ns", "k", {"message": "slow"}))
        assert eventually(lambda: "slow" in tried)
        writer.status(PatchStatus("ns", "k", {"message": "newer"}))
        gate.set()
        assert eventually(writer.idle)
        assert tried == ["lost", "slow", "newer"]
        assert len(failures) == 3, "the slow write's check of the newer expectation held"
        assert "ns/k" not in expectations.statuses
    finally:
        gate.set()
        writer.close()


def test_background_writes_wait_while_a_cycle_acts() -> None:
    expectations = Expectations()
    written: list[str] = []
    writer = StatusWriter(expectations, lambda i: written.append(i.status["message"]) or "5",
                          lambda call: call())  # fmt: skip
    try:
        writer.hold()
        writer.status(PatchStatus("ns", "j", {"message": "later"}))
        writer.event(lambda: written.append("event"))
        time.sleep(0.3)
        assert written == [], "nothing is written while the cycle's own writes go"
        writer.release()
        assert eventually(lambda: sorted(written) == ["event", "later"])
    finally:
        writer.release()
        writer.close()


class StateKube:
    """Answers the state ConfigMap's GET with ``state`` (or ``fail``), records the rest."""

    def __init__(self, state: str | None, fail: int = 0) -> None:
        self.state = state
        self.fail = fail
        self.calls: list[tuple[str, str, Any]] = []
        self.lock = threading.Lock()

    def request(
        self, method: str, path: str, body: Any = None, content_type: str | None = None
    ) -> Any:
        with self.lock:
            self.calls.append((method, path, body))
        if method == "GET" and "/configmaps/" in path:
            if self.fail:
                raise KubeError(self.fail, "unavailable")
            if self.state is None:
                raise KubeError(404, "not found")
            return {"data": {STATE_KEY: self.state}}
        return {"metadata": {"resourceVersion": "7"}}


def coordinator_of(kube: StateKube) -> list[dict[str, Any]]:
    return [b for m, p, b in kube.calls if m == "POST" and p.endswith("/pods")]


def test_a_coordinator_starts_from_the_state_read_beside_its_secret() -> None:
    from tests.controller.test_deciding import job_body

    tj = load_training_job(job_body())
    token = EnsureObjects(tj.key, ({"kind": "Secret", "metadata": {"namespace": "default"}},))
    for saved, fail, created in (('{"s": 1}', 0, True), (None, 0, True), (None, 503, False)):
        kube = StateKube(saved, fail)
        config = ControllerConfig(token_key=b"k" * 32)
        actuator = Actuator(cast(Kube, kube), config, lambda _j: None)
        try:
            actuator.run([token, CreateCoordinator(tj, "n0", 21000)])
        finally:
            actuator.close()
        order = [(m, p.rsplit("/", 1)[-1]) for m, p, _ in kube.calls]
        assert order.index(("POST", "secrets")) < 2 and ("GET", "j-coordinator-state") in order
        pods = coordinator_of(kube)
        assert bool(pods) == created, "no coordinator without the state it must start from"
        if saved is not None:
            env = {e["name"]: e.get("value") for e in pods[0]["spec"]["containers"][0]["env"]}
            assert saved in env.values()
        elif created:
            assert "sh" not in pods[0]["spec"]["containers"][0]["command"][:1]


class FailingObjectsKube(StateKube):
    """Like ``StateKube`` (no saved state), and every POST of a Service fails with ``fail``."""

    def __init__(self, fail: int) -> None:
        super().__init__(None)
        self.service_fail = fail

    def request(
        self, method: str, path: str, body: Any = None, content_type: str | None = None
    ) -> Any:
        if method == "POST" and path.endswith("/services") and self.service_fail:
            with self.lock:
                self.calls.append((method, path, body))
            raise KubeError(self.service_fail, "refused")
        return super().request(method, path, body, content_type)


def test_pods_created_with_their_coordinator_wait_for_its_secret_and_service() -> None:
    from tests.controller.test_deciding import job_body

    tj = load_training_job(job_body())
    objects = EnsureObjects(
        tj.key,
        (
            {"kind": "Secret", "metadata": {"namespace": "ns", "name": "j-token"}},
            {"kind": "Service", "metadata": {"namespace": "ns", "name": "j-coordinator"}},
        ),
    )
    # 409: the Service is there already (success); 503: it is not, nothing runs yet.
    for fail, created in ((0, True), (409, True), (503, False)):
        kube = FailingObjectsKube(fail)
        actuator = Actuator(
            cast(Kube, kube), ControllerConfig(token_key=b"k" * 32), lambda _j: None
        )
        try:
            actuator.run(
                [
                    objects,
                    CreateCoordinator(tj, "n0", 21000),
                    CreatePod(pod("j-worker-1"), job=tj.key),
                    CreatePod(pod("other-worker-1")),  # another job's: not held
                ]
            )
            names = [b["metadata"]["name"] for b in coordinator_of(kube)]
            first_pod = next(i for i, (m, p, _) in enumerate(kube.calls) if p.endswith("/pods"))
            objects_at = [
                i for i, (_, p, _) in enumerate(kube.calls) if p.endswith(("secrets", "services"))
            ]
            assert max(objects_at) < first_pod, "a pod before its Secret and Service"
            expected = {"j-coordinator", "j-worker-1"} if created else set()
            assert set(names) == expected | {"other-worker-1"}
            # A pod held back is not expected either: the next cycle decides it again.
            shown = actuator.expectations.overlay_pods([], time.monotonic())
            assert ("j-worker-1" in {p["metadata"]["name"] for p in shown}) is created
        finally:
            actuator.close()


class SlowSecretKube(StateKube):
    """Like ``StateKube`` (no saved state); a Secret's POST waits until ``gate`` is set."""

    def __init__(self) -> None:
        super().__init__(None)
        self.gate = threading.Event()

    def request(
        self, method: str, path: str, body: Any = None, content_type: str | None = None
    ) -> Any:
        if method == "POST" and path.endswith("/secrets"):
            assert self.gate.wait(10), "the test never opened the gate"
        return super().request(method, path, body, content_type)


class RecordingCoordinator:
    def __init__(self) -> None:
        self.drained: list[str] = []

    def drain(self, worker_id: str) -> None:
        self.drained.append(worker_id)

    def set_target(self, workers: int) -> None:
        pass


def test_a_write_waits_only_for_what_it_depends_on() -> None:
    from tests.controller.test_deciding import job_body

    tj = load_training_job(job_body())
    kube = SlowSecretKube()
    victims = RecordingCoordinator()
    actuator = Actuator(
        cast(Kube, kube), ControllerConfig(token_key=b"k" * 32), lambda _j: cast(Any, victims)
    )
    secret = {"kind": "Secret", "metadata": {"namespace": "ns", "name": "j-token"}}
    intents = [
        EnsureObjects(tj.key, (secret,)),
        CreateCoordinator(tj, "n0", 21000),
        CreatePod(pod("j-worker-1"), job=tj.key),
        MarkDraining("ns", "low-worker-1", 1.0),
        Drain("ns/low", "low-worker-1"),
    ]
    acting = threading.Thread(target=actuator.run, args=(intents,))
    acting.start()
    try:
        # The victim is marked and drained while the new job's Secret is still being written;
        # nothing of the new job is created before it.
        assert eventually(lambda: victims.drained == ["low-worker-1"])
        assert coordinator_of(kube) == []
        kube.gate.set()
        acting.join(10)
        assert not acting.is_alive()
        assert {b["metadata"]["name"] for b in coordinator_of(kube)} == {
            "j-coordinator",
            "j-worker-1",
        }
    finally:
        kube.gate.set()
        actuator.close()


def test_flush_writes_what_is_queued_then_says_whether_anything_is_left() -> None:
    expectations = Expectations()
    written: list[str] = []
    gate = threading.Event()

    def patch(intent: PatchStatus) -> str:
        if intent.status["message"] == "hangs":
            assert gate.wait(10)
        written.append(intent.status["message"])
        return "7"

    writer = StatusWriter(expectations, patch, lambda call: call())
    try:
        writer.hold()  # the last cycle was acting when the stop came
        writer.status(PatchStatus("ns", "j", {"message": "last"}))
        writer.event(lambda: written.append("event"))
        assert writer.flush(5.0)
        assert sorted(written) == ["event", "last"], "nothing of the last cycle is lost"
        writer.status(PatchStatus("ns", "k", {"message": "hangs"}))
        started = time.monotonic()
        assert not writer.flush(0.3), "a write in flight is reported, not forgotten"
        assert time.monotonic() - started < 5
        gate.set()
        assert writer.flush(5.0) and written[-1] == "hangs"
    finally:
        gate.set()
        writer.close()


class JobsKube(StateKube):
    """Answers a TrainingJob's GET from ``jobs`` (404 for any other), records the rest."""

    def __init__(self, jobs: set[str]) -> None:
        super().__init__(None)
        self.jobs = jobs

    def request(
        self, method: str, path: str, body: Any = None, content_type: str | None = None
    ) -> Any:
        if method == "GET" and "/trainingjobs/" in path:
            with self.lock:
                self.calls.append((method, path, body))
            if path.rsplit("/", 1)[-1] not in self.jobs:
                raise KubeError(404, "not found")
            return {"metadata": {"name": path.rsplit("/", 1)[-1]}}
        return super().request(method, path, body, content_type)


def test_a_deleted_jobs_pods_go_once_a_live_read_says_it_is_gone() -> None:
    """The garbage collector removes them too, later, while they hold their node's room; a
    cache that lags behind a job just created must not cost it its pods."""
    from edl_scheduler.controller.leaving import orphans
    from tests.controller.test_deciding import pod

    pods = [pod("a", job="gone"), pod("b", job="late"), pod("c", job="listed"), pod("x")]
    pods.append(pod("d", job="gone", meta={"namespace": "elsewhere"}))  # not served
    pods.append(pod("e", job="gone", meta={"deletionTimestamp": "2027-01-01T00:00:02Z"}))
    pods.append({"metadata": {"name": "other", "namespace": "ns"}})  # not one of ours
    gone = orphans(pods, {"ns/listed", "ns/j"}, lambda ns: ns == "ns")
    assert [(o.name, o.job) for o in gone] == [("a", "gone"), ("b", "late")]
    kube = JobsKube({"late"})  # listed by the API server, not yet by our watch
    actuator = Actuator(cast(Kube, kube), ControllerConfig(token_key=b"k" * 32), lambda _j: None)
    try:
        actuator.run(gone)
    finally:
        actuator.close()
    deleted = [p.rsplit("/", 1)[-1] for m, p, _ in kube.calls if m == "DELETE"]
    assert deleted == ["a"]
    assert ("ns", "a") in actuator.expectations.deleted
