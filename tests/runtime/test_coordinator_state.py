"""The coordinator's pure state: ledger, membership, fencing and persistence.

Aspects:
- epoch order and step windows: deterministic, every sample once per epoch;
- group commits: only the next samples of todo, only by rank 0 of the current generation
  (a stale generation is fenced), reverting steps rank 0's state lacks;
- shard leases: todo / doing / done, a failed worker's leases back to todo, epoch advance;
  a size's throughput (independent mode) recorded once each of its members has a rate;
- membership: oldest member is rank 0, the join window batches newcomers into one
  generation, the planned count closes it early, departures open a generation at once,
  drains, lease expiry;
- persistence: state round-trips through JSON, the file store writes atomically.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from trainer_runtime.coordinator.ledger import HISTORY_STEPS, Ledger, LedgerError
from trainer_runtime.coordinator.membership import WorkerPhase
from trainer_runtime.coordinator.state import ConsumptionMode, CoordinatorState, FencedError
from trainer_runtime.coordinator.storing import FileStore, MemoryStore
from trainer_runtime.sharding import DatasetPlan, SampleRange, Walk, counting, splitting_among


def plan(samples: int = 10, shard: int = 3, epochs: int = 2) -> DatasetPlan:
    return DatasetPlan(samples=samples, shard_size=shard, epochs=epochs, seed=7)


def group_state(*workers: str, window: float = 0.2) -> CoordinatorState:
    state = CoordinatorState.starting(plan(), join_window_s=window)
    for worker in workers:
        state.registering(worker, "node-a", f"{worker}:1", now=0.0)
    state.ticking(now=1.0)
    return state


def test_epoch_order_is_deterministic_and_covers_every_sample_once() -> None:
    first, again = plan().epoch_order(1), plan().epoch_order(1)
    assert first == again
    covered = sorted(i for r in first for i in r.indices())
    assert covered == list(range(10))


def test_walk_visits_every_sample_once_per_epoch() -> None:
    walk = Walk(plan(), epoch=0, step=0, todo=plan().epoch_order(0))
    seen: dict[int, int] = {}
    while (window := walk.next_window(4)) is not None:
        assert counting(window.ranges) <= 4
        for r in window.ranges:
            for i in r.indices():
                seen[i] = seen.get(i, 0) + 1
    assert seen == {i: 2 for i in range(10)}


def test_splitting_among_more_parts_than_samples_leaves_some_empty() -> None:
    parts = splitting_among([SampleRange(0, 2)], 3)
    assert [counting(p) for p in parts] == [1, 1, 0]


def test_bad_dataset_plans_are_refused() -> None:
    with pytest.raises(ValueError, match="empty"):
        DatasetPlan(samples=0, shard_size=1, epochs=1)
    with pytest.raises(ValueError):
        DatasetPlan(samples=5, shard_size=0, epochs=1)


def test_group_commit_takes_next_samples_and_advances_epoch() -> None:
    state = group_state("w0", "w1")
    walk = Walk(plan(), 0, 0, list(state.ledger.todo))
    windows = []
    while (window := walk.next_window(4)) is not None and window.epoch == 0:
        windows.append(window)
    state.committing_windows("w0", state.membership.generation, windows, 0.1)
    assert state.ledger.epoch == 1
    assert state.ledger.samples_done == 10


def test_group_commit_out_of_order_or_repeated_is_refused() -> None:
    state = group_state("w0")
    walk = Walk(plan(), 0, 0, list(state.ledger.todo))
    first = walk.next_window(4)
    second = walk.next_window(4)
    assert first is not None and second is not None
    with pytest.raises(LedgerError):
        state.committing_windows("w0", 1, [second], 0.1)
    state.committing_windows("w0", 1, [first], 0.1)
    before = state.to_json()
    # a repeated window is ignored as already committed; one that skips ahead is refused
    state.committing_windows("w0", 1, [first], 0.1)
    assert state.to_json() == before


def test_stale_generation_and_non_rank0_commits_are_fenced() -> None:
    state = group_state("w0", "w1")
    walk = Walk(plan(), 0, 0, list(state.ledger.todo))
    window = walk.next_window(2)
    assert window is not None
    with pytest.raises(FencedError, match="not rank 0"):
        state.committing_windows("w1", 1, [window], 0.1)
    state.registering("w2", "node-b", "w2:1", now=1.1)
    state.ticking(now=1.5)
    assert state.membership.generation == 2
    with pytest.raises(FencedError, match="stale"):
        state.committing_windows("w0", 1, [window], 0.1)
    assert state.ledger.committed_step == 0


def test_reconcile_reverts_steps_the_new_rank0_lacks_and_adds_those_it_has() -> None:
    state = group_state("w0", "w1")
    walk = Walk(plan(), 0, 0, list(state.ledger.todo))
    windows = [w for w in (walk.next_window(3) for _ in range(4)) if w is not None]
    state.committing_windows("w0", 1, windows[:3], 0.1)
    state.departing("w0")
    state.ticking(now=1.5)
    # w1 is rank 0 now; its state reached step 2 only: step 3 goes back to todo
    state.reconciling("w1", 2, 2, windows[:2])
    assert state.ledger.committed_step == 2
    assert state.ledger.samples_done == 6
    state.reconciling("w1", 2, 4, windows)
    assert state.ledger.committed_step == 4
    assert state.ledger.epoch == 1


def test_rank0_without_state_restarts_the_ledger_even_past_its_history() -> None:
    """A job suspended to zero workers with no checkpoint: the fresh rank 0 reconciles with
    step 0 and the ledger starts over, though more steps were committed than it can revert."""
    long_plan = DatasetPlan(samples=1000, shard_size=10, epochs=1, seed=7)
    state = CoordinatorState.starting(long_plan, join_window_s=0.2)
    for worker in ("w0", "w1"):
        state.registering(worker, "node-a", f"{worker}:1", now=0.0)
    state.ticking(now=1.0)
    walk = Walk(long_plan, 0, 0, list(state.ledger.todo))
    windows = [w for w in (walk.next_window(3) for _ in range(300)) if w is not None]
    state.committing_windows("w0", 1, windows, 0.1)
    assert state.ledger.committed_step == 300 > HISTORY_STEPS
    with pytest.raises(LedgerError, match="history too short"):
        state.reconciling("w0", 1, 1, [])
    state.departing("w0")
    state.ticking(now=1.5)
    state.reconciling("w1", 2, 0, [])
    assert state.ledger.committed_step == 0 and state.ledger.samples_done == 0
    assert state.ledger.todo == long_plan.epoch_order(0)


def test_shard_leases_move_todo_doing_done_and_failures_return_them() -> None:
    state = CoordinatorState.starting(plan(epochs=1), mode=ConsumptionMode.INDEPENDENT)
    state.registering("a", "n", "", 0.0)
    state.registering("b", "n", "", 0.0)
    state.ticking(1.0)
    lease_a = state.leasing_shard("a", 1)
    lease_b = state.leasing_shard("b", 1)
    assert lease_a is not None and lease_b is not None
    assert lease_a.samples != lease_b.samples
    with pytest.raises(LedgerError):
        state.committing_leases("a", [lease_b.lease_id], 0.1)
    state.committing_leases("a", [lease_a.lease_id], 0.1)
    state.departing("b")
    assert state.ledger.todo[0] == lease_b.samples
    with pytest.raises(FencedError):
        state.committing_leases("b", [lease_b.lease_id], 0.1)
    while (lease := state.leasing_shard("a", state.membership.generation)) is not None:
        state.committing_leases("a", [lease.lease_id], 0.1)
    assert state.ledger.finished
    assert state.ledger.samples_done == 10


def test_a_size_is_measured_once_every_member_has_committed() -> None:
    """In independent mode a size's throughput is the sum of its members' rates in the
    current generation: a commit made before a newcomer's first one records nothing (it
    undercounted the grown size), and a survivor's rate from the old size does not count."""
    state = CoordinatorState.starting(
        plan(samples=4000, shard=10, epochs=1), mode=ConsumptionMode.INDEPENDENT
    )

    def committing(worker: str, step_time_s: float = 0.1) -> None:
        lease = state.leasing_shard(worker, state.membership.generation)
        assert lease is not None
        state.committing_leases(worker, [lease.lease_id], step_time_s)  # 10 samples

    def measured() -> dict[int, float]:
        return {r.workers: r.samples_per_s for r in state.throughput.values()}

    for worker in ("w0", "w1"):
        state.registering(worker, "n", "", 0.0)
    state.ticking(1.0)
    committing("w0")
    assert measured() == {}, "w1 has no rate yet"
    committing("w1")
    assert measured() == {2: pytest.approx(200.0)}
    for worker in ("w2", "w3"):
        state.registering(worker, "n", "", 2.0)
    state.ticking(3.0)
    # At size 4 each worker makes 50 samples/s (10 in 0.2 s), not its 100 of size 2.
    for worker in ("w0", "w2", "w3"):
        committing(worker, 0.2)
    assert 4 not in measured(), "w1 has not committed at size 4 (its size-2 rate is stale)"
    committing("w1", 0.2)
    assert measured()[4] == pytest.approx(200.0)
    assert measured()[2] == pytest.approx(200.0)


def test_join_window_batches_newcomers_into_one_generation() -> None:
    state = CoordinatorState.starting(plan(), join_window_s=1.0)
    state.registering("w0", "n", "", now=0.0)
    assert not state.ticking(now=0.5)
    state.registering("w1", "n", "", now=0.6)
    assert state.ticking(now=1.0)
    assert state.membership.generation == 1
    assert [w.worker_id for w in state.membership.members()] == ["w0", "w1"]


def test_planned_count_closes_the_join_window_early() -> None:
    state = CoordinatorState.starting(plan(), join_window_s=60.0)
    state.membership.targeting(2)
    state.registering("w0", "n", "", now=0.0)
    assert not state.ticking(now=0.1)
    state.registering("w1", "n", "", now=0.1)
    assert state.ticking(now=0.2)


def test_oldest_member_stays_rank0_and_departure_opens_generation_at_once() -> None:
    state = group_state("w0", "w1", "w2")
    state.departing("w1")
    assert state.ticking(now=1.01)
    view = state.viewing_generation("w2")
    assert view.phase is WorkerPhase.MEMBER and view.rank == 1
    assert state.viewing_generation("w0").rank == 0
    assert state.viewing_generation("w1").phase is WorkerPhase.FENCED


def test_drained_worker_is_told_to_leave_and_excluded() -> None:
    state = group_state("w0", "w1")
    assert state.draining("w1")
    state.ticking(now=1.01)
    assert state.viewing_generation("w1").phase is WorkerPhase.DRAINED
    assert [w.worker_id for w in state.membership.members()] == ["w0"]
    assert not state.draining("nobody")


def test_silent_worker_expires_after_lease_timeout_but_connected_one_does_not() -> None:
    state = group_state("w0", "w1")
    state.membership.seeing("w0", 1.0, connected=True)
    state.ticking(now=1.0 + state.membership.lease_timeout_s + 1)
    assert [w.worker_id for w in state.membership.members()] == ["w0"]


def test_state_round_trips_through_json_and_restart_keeps_generation() -> None:
    state = group_state("w0", "w1")
    walk = Walk(plan(), 0, 0, list(state.ledger.todo))
    window = walk.next_window(4)
    assert window is not None
    state.committing_windows("w0", 1, [window], 0.25)
    restored = CoordinatorState.from_json(state.to_json(), now=100.0)
    assert restored.to_json() == state.to_json()
    assert restored.membership.generation == 1
    assert restored.ledger.committed_step == 1
    assert not restored.ticking(now=100.0 + 1.0)


def test_ledger_round_trips_with_leases() -> None:
    ledger = Ledger.starting(plan())
    ledger.leasing_shard("x")
    assert Ledger.from_dict(ledger.to_dict()).to_dict() == ledger.to_dict()


def test_file_store_replaces_atomically_and_leaves_no_temporaries(tmp_path: Path) -> None:
    store = FileStore(tmp_path / "state" / "coordinator.json")
    assert store.load() is None
    store.save("one")
    store.save("two")
    assert store.load() == "two"
    assert [p.name for p in (tmp_path / "state").iterdir()] == ["coordinator.json"]


def test_memory_store_returns_last_saved() -> None:
    store = MemoryStore()
    assert store.load() is None
    store.save("x")
    assert store.load() == "x"


def test_worker_arriving_after_the_last_commit_is_told_the_job_finished() -> None:
    state = CoordinatorState.starting(plan(epochs=1), mode=ConsumptionMode.INDEPENDENT)
    state.registering("a", "n", "", 0.0)
    state.ticking(1.0)
    while (lease := state.leasing_shard("a", 1)) is not None:
        state.committing_leases("a", [lease.lease_id], 0.1)
    state.registering("late", "n", "", 2.0)
    assert "late" not in state.membership.workers  # nothing to lease, no generation opens
    assert not state.ticking(3.0)
    assert state.viewing_generation("late").finished
