"""Leader election on a Lease, against an in-memory Lease store (what a restart costs).

Aspects:
- a process restarted with the leader's identity takes its Lease at once, however recently
  it was renewed (a container restarted in its pod after a crash);
- another identity waits until the dead holder's Lease has lapsed (renewTime +
  leaseDurationSeconds), then takes it and counts the transition;
- two replicas racing for a free Lease cannot both win (the write carries the
  resourceVersion it read: the loser gets 409 and does not lead);
- a leader believes it leads only until 80% of the duration after its last renewal;
- a leader that stops gracefully gives the Lease up: another identity takes it at once; a
  Lease another replica took meanwhile is left alone.
"""

from __future__ import annotations

import copy
from typing import Any, cast

import pytest

from edl_scheduler.controller import leading
from edl_scheduler.controller.kubeapi import Kube, KubeError
from edl_scheduler.controller.leading import LeaderElector

DURATION = 10.0


class LeaseStore:
    """One Lease, as the API server keeps it: GET, POST (409 if it exists), PUT (409 unless
    the body carries the stored resourceVersion)."""

    def __init__(self) -> None:
        self.lease: dict[str, Any] | None = None
        self.version = 0
        #: Called before a PUT is applied: lets a test slip another write in between.
        self.before_put: list[Any] = []

    def request(self, method: str, path: str, body: Any = None, **_: Any) -> Any:
        if method == "GET":
            if self.lease is None:
                raise KubeError(404, "not found")
            return copy.deepcopy(self.lease)
        if method == "POST":
            if self.lease is not None:
                raise KubeError(409, "already exists")
            return self._store(body)
        if method == "PUT":
            hooks, self.before_put = self.before_put, []
            for hook in hooks:
                hook()
            assert self.lease is not None
            if body["metadata"].get("resourceVersion") != self.lease["metadata"]["resourceVersion"]:
                raise KubeError(409, "the object has been modified")
            return self._store(body)
        raise AssertionError(f"unexpected {method} {path}")

    def _store(self, body: dict[str, Any]) -> dict[str, Any]:
        self.version += 1
        self.lease = copy.deepcopy(body)
        self.lease["metadata"]["resourceVersion"] = str(self.version)
        return copy.deepcopy(self.lease)

    @property
    def holder(self) -> str | None:
        assert self.lease is not None
        held = self.lease["spec"]["holderIdentity"]
        return None if held is None else str(held)


class Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    found = Clock()
    monkeypatch.setattr(leading.time, "time", found)
    return found


def elector(store: LeaseStore, identity: str) -> LeaderElector:
    return LeaderElector(cast(Kube, store), "edl-controller", "edl", identity, DURATION)


def test_a_restart_with_the_same_identity_takes_its_lease_at_once(clock: Clock) -> None:
    store = LeaseStore()
    assert elector(store, "pod-a").try_lead()
    clock.now += 1.0  # SIGKILLed just after a renewal; the Lease holds for 9 s more
    restarted = elector(store, "pod-a")
    assert restarted.try_lead() and restarted.is_leader()
    assert store.holder == "pod-a"
    assert store.lease is not None and store.lease["spec"]["leaseTransitions"] == 0


def test_another_identity_waits_for_the_lease_to_lapse(clock: Clock) -> None:
    store = LeaseStore()
    assert elector(store, "pod-a").try_lead()  # then SIGKILLed
    successor = elector(store, "pod-b")
    clock.now += DURATION - 0.5
    assert not successor.try_lead() and not successor.is_leader()
    clock.now += 1.0  # renewTime + leaseDurationSeconds has passed
    assert successor.try_lead()
    assert store.holder == "pod-b"
    assert store.lease is not None and store.lease["spec"]["leaseTransitions"] == 1


def test_two_replicas_racing_for_a_lapsed_lease_cannot_both_win(clock: Clock) -> None:
    store = LeaseStore()
    assert elector(store, "pod-a").try_lead()
    clock.now += DURATION + 1.0
    b, c = elector(store, "pod-b"), elector(store, "pod-c")
    store.before_put.append(lambda: c.try_lead())  # c writes between b's read and b's write
    assert not b.try_lead()
    assert store.holder == "pod-c" and c.is_leader() and not b.is_leader()


def test_a_leader_stops_believing_before_the_lease_lapses(clock: Clock) -> None:
    store = LeaseStore()
    a = elector(store, "pod-a")
    assert a.try_lead()
    clock.now += DURATION * 0.79
    assert a.is_leader()
    clock.now += DURATION * 0.02
    assert not a.is_leader()


def test_a_leader_stopping_gracefully_gives_its_lease_up(clock: Clock) -> None:
    store = LeaseStore()
    a = elector(store, "pod-a")
    assert a.try_lead()
    clock.now += 1.0
    assert a.release()
    assert store.holder is None and not a.is_leader()
    successor = elector(store, "pod-b")
    assert successor.try_lead()  # at once: no wait for the 10 s to lapse
    assert store.holder == "pod-b"


def test_release_leaves_a_lease_another_replica_holds(clock: Clock) -> None:
    store = LeaseStore()
    a = elector(store, "pod-a")
    assert a.try_lead()
    clock.now += DURATION + 1.0  # a stalled; b took the lapsed Lease
    assert elector(store, "pod-b").try_lead()
    assert not a.release()
    assert store.holder == "pod-b"
    # b took it between a's read and a's write: the write is refused, b keeps it.
    b = elector(store, "pod-b")
    c = elector(store, "pod-c")
    clock.now += DURATION + 1.0
    store.before_put.append(lambda: c.try_lead())
    assert not b.release()
    assert store.holder == "pod-c"
