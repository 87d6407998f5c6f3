"""Leader election on a Lease, against an in-memory Lease store (what a restart costs).

Aspects:
- a process restarted with the leader's identity takes its Lease at once, however recently
  it was renewed (a container restarted in its pod after a crash);
- another identity waits until it has watched the Lease go unrenewed for its whole
  duration, on its own clock, then takes it and counts the transition;
- clocks that disagree (a standby's wall clock 7 s ahead, monotonic clocks with any
  offset) never make two replicas believe they lead at once, nor a standby take a Lease
  that is renewed;
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
    """One replica's clocks: the true time plus its own offsets."""

    def __init__(self, world: World, offset: float = 0.0, skew: float = 0.0) -> None:
        self.world, self.offset, self.skew = world, offset, skew

    def monotonic(self) -> float:
        return self.world.now + self.offset

    def wall(self) -> float:
        return self.world.now + self.skew


class World:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0


@pytest.fixture
def clock() -> World:
    return World()


def elector(store: LeaseStore, identity: str, world: World, **offsets: float) -> LeaderElector:
    own = Clock(world, **offsets)
    return LeaderElector(
        cast(Kube, store), "edl-controller", "edl", identity, DURATION,
        clock=own.monotonic, wall=own.wall,
    )  # fmt: skip


def test_a_restart_with_the_same_identity_takes_its_lease_at_once(clock: World) -> None:
    store = LeaseStore()
    assert elector(store, "pod-a", clock).try_lead()
    clock.now += 1.0  # SIGKILLed just after a renewal; the Lease holds for 9 s more
    restarted = elector(store, "pod-a", clock, offset=-5_000.0)  # a new process: new clock
    assert restarted.try_lead() and restarted.is_leader()
    assert store.holder == "pod-a"
    assert store.lease is not None and store.lease["spec"]["leaseTransitions"] == 0


def test_another_identity_waits_until_it_has_watched_the_lease_lapse(clock: World) -> None:
    store = LeaseStore()
    assert elector(store, "pod-a", clock).try_lead()  # then SIGKILLed
    successor = elector(store, "pod-b", clock, offset=123.0)
    clock.now += DURATION - 0.5
    assert not successor.try_lead() and not successor.is_leader()  # first seen now
    clock.now += 1.0  # renewTime + leaseDurationSeconds has passed, but b saw it 1 s ago
    assert not successor.try_lead()
    clock.now += DURATION - 1.0  # unchanged for a whole duration since b first saw it
    assert successor.try_lead()
    assert store.holder == "pod-b"
    assert store.lease is not None and store.lease["spec"]["leaseTransitions"] == 1


def test_two_replicas_racing_for_a_lapsed_lease_cannot_both_win(clock: World) -> None:
    store = LeaseStore()
    assert elector(store, "pod-a", clock).try_lead()
    b, c = elector(store, "pod-b", clock), elector(store, "pod-c", clock)
    assert not b.try_lead() and not c.try_lead()  # both watch it from now
    clock.now += DURATION + 1.0
    store.before_put.append(lambda: c.try_lead())  # c writes between b's read and b's write
    assert not b.try_lead()
    assert store.holder == "pod-c" and c.is_leader() and not b.is_leader()


def test_a_leader_stops_believing_before_the_lease_lapses(clock: World) -> None:
    store = LeaseStore()
    a = elector(store, "pod-a", clock)
    assert a.try_lead()
    clock.now += DURATION * 0.79
    assert a.is_leader()
    clock.now += DURATION * 0.02
    assert not a.is_leader()


def test_skewed_clocks_never_give_two_leaders(clock: World) -> None:
    """The leader renews as usual for 30 s, then dies; the standby's wall clock runs 7 s
    ahead and its monotonic clock has another origin. Every half second of true time: at
    most one believes it leads; the standby never leads while the Lease is renewed, and
    leads within a duration (and a retry) of the last renewal."""
    store = LeaseStore()
    a = elector(store, "pod-a", clock)
    b = elector(store, "pod-b", clock, offset=-3.7e5, skew=7.0)
    start, led_at = clock.now, None
    for _ in range(int(60 / 0.5)):
        alive = clock.now - start < 30.0
        if alive:
            a.try_lead()
        if b.try_lead() and led_at is None:
            led_at = clock.now - start
        assert not (a.is_leader() and b.is_leader()), clock.now - start
        clock.now += 0.5
    assert led_at is not None and 30.0 <= led_at <= 30.0 + DURATION + DURATION / 6 + 0.5


def test_a_slow_read_does_not_make_a_lease_lapse_early(clock: World) -> None:
    """The standby's GET takes 4 s (a loaded API server) and returns a Lease renewed while
    it was in flight; its holder then dies. The standby must count the duration from when
    it saw that renewal, not from when it asked, or it would take the Lease while the old
    holder still believes it leads."""
    store = LeaseStore()
    a = elector(store, "pod-a", clock)
    b = elector(store, "pod-b", clock)
    assert a.try_lead() and not b.try_lead()
    real_request = store.request
    armed = [True]

    def slow(method: str, path: str, body: Any = None, **kw: Any) -> Any:
        if method == "GET" and armed[0]:
            armed[0] = False
            clock.now += 4.0
            assert a.try_lead()  # renewed while b's read is in flight
        return real_request(method, path, body, **kw)

    clock.now += DURATION / 3 + 0.1  # a's renewal is due
    store.request = slow  # type: ignore[method-assign]
    assert not b.try_lead()
    for _ in range(int(DURATION / 0.5) + 4):  # a has died; b asks every half second
        clock.now += 0.5
        b.try_lead()
        assert not (a.is_leader() and b.is_leader()), clock.now
    assert b.is_leader()


def test_a_leader_stopping_gracefully_gives_its_lease_up(clock: World) -> None:
    store = LeaseStore()
    a = elector(store, "pod-a", clock)
    assert a.try_lead()
    clock.now += 1.0
    assert a.release()
    assert store.holder is None and not a.is_leader()
    successor = elector(store, "pod-b", clock)
    assert successor.try_lead()  # at once: no wait for the 10 s to lapse
    assert store.holder == "pod-b"


def test_release_leaves_a_lease_another_replica_holds(clock: World) -> None:
    store = LeaseStore()
    a = elector(store, "pod-a", clock)
    assert a.try_lead()
    b = elector(store, "pod-b", clock)
    assert not b.try_lead()
    clock.now += DURATION + 1.0  # a stalled; b took the lapsed Lease
    assert b.try_lead()
    assert not a.release()
    assert store.holder == "pod-b"
    # c took it between b's read and b's write: the write is refused, c keeps it.
    c = elector(store, "pod-c", clock)
    assert not c.try_lead()
    clock.now += DURATION + 1.0
    store.before_put.append(lambda: c.try_lead())
    assert not b.release()
    assert store.holder == "pod-c"
