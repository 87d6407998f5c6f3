"""Forming one generation's Paddle group: the roll call's single verdict and the bounded
group constructor (in-process, no coordinator).

Aspects:
- a member that arrived at the roll call and then gave up is never counted in a group that
  is built: rank 0, arriving later and seeing everybody "arrived", still gets ABANDON (the
  stale arrival once made rank 0 build a group its peer had left, and wait in Paddle's
  constructor forever);
- when everybody arrives, every member gets BUILD; a newer generation makes rank 0 give up,
  and its peers follow its verdict; when two members propose at once, one verdict stands;
- a failed formation (or step) while the coordinator saw nobody leave forms the same
  generation again at its next attempt, instead of waiting for a newer generation that
  never opens (which once ended the job: "no generation formed within 20 s"); news of a
  newer generation moves it on;
- the group constructor is bounded: a member that answered the roll call and never built
  the group (it died since) makes the others fail within the timeout, with a real Paddle
  constructor (it once blocked in its store wait without a bound);
- so are the store connections: a member whose rank 0 died (nothing listens at its
  registered store any more) fails its formation within the timeout, or at once when a
  newer generation opened (Paddle's client retries its connection without a bound).
"""

from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np
import paddle
import pytest
from paddle import nn

from trainer_runtime.agent import Assignment, Outcome, Peer
from trainer_runtime.environment import WorkerContract
from trainer_runtime.paddle import KeepGlobalBatch, session
from trainer_runtime.paddle import stores as stores_module
from trainer_runtime.paddle.grouping import building, forming
from trainer_runtime.paddle.stores import StoreHost, connecting, free_port
from trainer_runtime.rollcall import ABANDON, BUILD, calling_roll, proposing

from .harness import TOKEN

PREFIX = "edl/g3a0/"


class CountingStore:
    """The one store operation the roll call uses: an atomic add that returns the sum."""

    def __init__(self) -> None:
        self.values: dict[str, int] = {}
        self.lock = threading.Lock()

    def add(self, key: str, amount: int) -> int:
        with self.lock:
            self.values[key] = self.values.get(key, 0) + amount
            return self.values[key]


def assignment(rank: int, world_size: int = 2, generation: int = 3) -> Assignment:
    peers = tuple(Peer(f"w{r}", r, f"127.0.0.1:{1000 + r}") for r in range(world_size))
    return Assignment(Outcome.MEMBER, generation, rank, peers)


def never() -> bool:
    return False


def test_a_member_that_gave_up_is_never_counted_in_a_built_group() -> None:
    store = CountingStore()
    with pytest.raises(RuntimeError, match="given up"):  # its deadline passed: it leaves
        calling_roll(store, PREFIX, 1, 2, never, deadline=time.monotonic())
    assert store.values[PREFIX + "arrived"] == 1
    started = time.monotonic()
    with pytest.raises(RuntimeError, match="given up"):  # "arrived" reads 2 once rank 0 adds
        calling_roll(store, PREFIX, 0, 2, never, deadline=time.monotonic() + 30)
    assert time.monotonic() - started < 5


def test_everybody_arrives_and_everybody_builds() -> None:
    store = CountingStore()
    errors: list[BaseException] = []

    def member(rank: int) -> None:
        try:
            calling_roll(store, PREFIX, rank, 3, never, time.monotonic() + 30)
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=member, args=(rank,)) for rank in (2, 1, 0)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert not errors
    assert store.values[PREFIX + "verdict"] == BUILD


def test_a_newer_generation_makes_rank_0_give_up_and_its_peers_follow() -> None:
    store = CountingStore()
    with pytest.raises(RuntimeError, match="given up"):
        calling_roll(store, PREFIX, 0, 2, lambda: True, time.monotonic() + 30)
    with pytest.raises(RuntimeError, match="given up"):
        calling_roll(store, PREFIX, 1, 2, never, time.monotonic() + 30)


def test_the_first_proposal_stands() -> None:
    store = CountingStore()
    assert proposing(store, PREFIX, ABANDON) == ABANDON
    assert proposing(store, PREFIX, BUILD) == ABANDON
    other = CountingStore()
    assert proposing(other, PREFIX, BUILD) == BUILD
    assert proposing(other, PREFIX, ABANDON) == BUILD


def test_building_returns_the_group_or_raises_within_its_bound() -> None:
    assert building(lambda: "group", never, time.monotonic() + 5, "g1") == "group"

    def failing() -> Any:
        raise ValueError("refused")

    with pytest.raises(ValueError, match="refused"):
        building(failing, never, time.monotonic() + 5, "g1")
    release = threading.Event()
    try:
        started = time.monotonic()
        with pytest.raises(RuntimeError, match="never joined"):
            building(release.wait, never, time.monotonic() + 0.5, "g1")
        with pytest.raises(RuntimeError, match="never joined"):
            building(release.wait, lambda: True, time.monotonic() + 60, "g1")
        assert time.monotonic() - started < 10
    finally:
        release.set()


def test_a_member_that_died_after_the_roll_call_fails_the_constructor_in_time() -> None:
    """Rank 0 of a real two-member Paddle group whose peer arrived at the roll call (its
    arrival is written here) and then never built the group."""
    stores = StoreHost("127.0.0.1", timeout_s=5)
    me = Assignment(
        Outcome.MEMBER, 7, 0, (Peer("w0", 0, stores.address), Peer("w1", 1, "127.0.0.1:1"))
    )
    stores.server.add("edl/g7a0/arrived", 1)
    started = time.monotonic()
    with pytest.raises(RuntimeError, match="never joined"):
        forming(me, 0, stores, never, timeout_s=2.0)
    assert time.monotonic() - started < 30


def finishing_within(work: Any, bound_s: float) -> BaseException | None:
    """Run `work` in a daemon thread; what it raised, failing the test if it is still
    running after `bound_s` (an unbounded wait stays behind, harmless, in its thread)."""
    raised: list[BaseException] = []

    def running() -> None:
        try:
            work()
        except BaseException as error:
            raised.append(error)

    thread = threading.Thread(target=running, daemon=True)
    thread.start()
    thread.join(bound_s)
    assert not thread.is_alive(), f"still waiting after {bound_s} s"
    return raised[0] if raised else None


def test_a_member_whose_rank_0_died_fails_its_formation_in_time() -> None:
    """In time, by its bound and by news of a newer generation, and with no helper thread
    left retrying the dead port (Paddle's client never stops; one still inside Paddle's
    code when the process finalizes can abort it)."""
    stores = StoreHost("127.0.0.1", timeout_s=5)
    dead = f"127.0.0.1:{free_port('127.0.0.1')}"  # nothing listens there
    me = Assignment(Outcome.MEMBER, 7, 1, (Peer("w0", 0, dead), Peer("w1", 1, stores.address)))
    before = set(stores_module._abandoned)
    error = finishing_within(lambda: forming(me, 0, stores, never, timeout_s=1.0), 20)
    assert isinstance(error, RuntimeError) and "did not answer" in str(error), error
    news = threading.Event()
    started = time.monotonic()
    threading.Timer(0.3, news.set).start()
    error = finishing_within(lambda: forming(me, 0, stores, news.is_set, timeout_s=60), 20)
    assert isinstance(error, RuntimeError) and "did not answer" in str(error), error
    assert time.monotonic() - started < 10  # the newer generation, not the timeout
    left = [t for t in stores_module._abandoned if t.is_alive() and t not in before]
    assert not left, f"{len(left)} helper threads still retry {dead}"


def test_a_store_connection_returns_the_client_when_the_store_answers() -> None:
    stores = StoreHost("127.0.0.1", timeout_s=5)
    host, port = stores.address.rsplit(":", 1)
    client = connecting(host, int(port), 5, never, time.monotonic() + 10)
    assert int(client.add("k", 2)) == 2 and int(stores.server.add("k", 0)) == 2


def idle_session(monkeypatch: pytest.MonkeyPatch, news: list[bool]) -> tuple[Any, list[Any]]:
    """A session whose coordinator always assigns generation 3 (then 4, ...) and whose
    formations fail twice before one succeeds; `news` is what `changed()` answers, in turn."""
    contract = WorkerContract("127.0.0.1:1", TOKEN, "job", "w0", "node", timeout_s=1.0)
    model = nn.Linear(2, 1)
    optimizer = paddle.optimizer.SGD(learning_rate=0.1, parameters=model.parameters())
    s = session(model, optimizer, [np.zeros(2, dtype="float32")], KeepGlobalBatch(1), contract)
    asked: list[Any] = []
    tries: list[Any] = []

    def awaiting() -> Assignment:
        asked.append(3 + len(asked))
        return assignment(0, generation=asked[-1])

    def forming_generation(given: Assignment, attempt: int) -> None:
        tries.append((given.generation, attempt))
        if len(tries) < 3:
            raise RuntimeError("a peer went silent")

    monkeypatch.setattr(s.agent, "awaiting_assignment", awaiting)
    monkeypatch.setattr(s.agent, "changed", lambda: news.pop(0) if news else False)
    monkeypatch.setattr(s, "forming_generation", forming_generation)
    return s, tries


def test_a_failed_formation_retries_the_same_generation_while_nobody_left(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    s, tries = idle_session(monkeypatch, news=[])
    s.leaving_generation = True  # it left its last generation for generation 3
    assert s.reforming()
    assert tries == [(3, 0), (3, 1), (3, 2)]  # never waits for a generation 4 that won't come


def test_a_failed_formation_moves_on_when_a_newer_generation_opened(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    s, tries = idle_session(monkeypatch, news=[True])  # heard after the first failure
    s.leaving_generation = True
    assert s.reforming()
    assert tries == [(3, 0), (4, 0), (4, 1)]
