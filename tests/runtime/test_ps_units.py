"""The pure parts of parameter-server mode, without processes.

Aspects:
- layout: the pieces tile the model in server order; step windows equal a `Walk` from the
  start of the job, for every step, across epochs (hypothesis);
- partition: a step applies only when every contribution is in and it was decided; decided
  steps apply in order; a contributor pushing twice is refused; settling applies complete
  steps and refuses a missing one; fencing refuses older generations; keeping a range
  requires the same range at the same step; momentum follows torch's SGD;
- snapshots: a cut covers the model only when its files tile it; pieces written by two
  layouts restore any third range; a range keeps its newest files only;
- coordinator: servers register beside workers, are listed apart in layout order, a drained
  server retires (listed until it leaves), a departed server opens a generation, and the
  roster survives `to_json`/`from_json`.
"""

from __future__ import annotations

import itertools
import random
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from trainer_runtime.committing import mean_step_time
from trainer_runtime.coordinator.membership import WorkerPhase
from trainer_runtime.coordinator.state import CoordinatorState, FencedError
from trainer_runtime.ps.layout import laying_out, total_steps, window_of
from trainer_runtime.ps.partition import CELL, Partition, PartitionError, StaleGeneration
from trainer_runtime.ps.snapshots import SnapshotDirectory, SnapshotMissing
from trainer_runtime.sharding import DatasetPlan, Walk

from .harness import CREDENTIALS, VERIFIER


def test_layout_tiles_the_model_in_server_order() -> None:
    pieces = laying_out(10, [("a", "h:1"), ("b", "h:2"), ("c", "h:3")])
    assert [(p.server_id, p.start, p.stop) for p in pieces] == [
        ("a", 0, 4), ("b", 4, 7), ("c", 7, 10),
    ]  # fmt: skip
    assert len(laying_out(2, [("a", ""), ("b", ""), ("c", "")])) == 2
    with pytest.raises(ValueError, match="at least one server"):
        laying_out(10, [])


@settings(max_examples=60, deadline=None)
@given(
    samples=st.integers(1, 60),
    shard=st.integers(1, 12),
    epochs=st.integers(1, 3),
    batch=st.integers(1, 20),
    seed=st.integers(0, 5),
)
def test_window_of_equals_a_walk_from_the_start(
    samples: int, shard: int, epochs: int, batch: int, seed: int
) -> None:
    plan = DatasetPlan(samples, shard, epochs, seed)
    walk = Walk(plan, 0, 0, plan.epoch_order(0))
    step = 0
    while (window := walk.next_window(batch)) is not None:
        step += 1
        assert window_of(plan, batch, step) == window
    assert step == total_steps(plan, batch)


def adopted(length: int = 4, lr: float = 1.0, momentum: float = 0.0) -> Partition:
    part = Partition()
    zeros = np.zeros(length)
    part.adopting(1, 0, length, length, "float64", lr, momentum, 0, 0, (zeros, zeros))
    return part


def pushing(part: Partition, step: int, contributor: int, expected: int, values: list[float]):
    part.adding(step, contributor, expected, 0, np.array(values, dtype=np.float64).tobytes())


def test_a_step_applies_only_complete_and_decided_and_in_order() -> None:
    part = adopted()
    pushing(part, 1, 0, 2, [1, 1, 1, 1])
    assert not part.complete(1) and not part.deciding(1)
    pushing(part, 1, 1, 2, [1, 0, 0, 0])
    assert part.complete(1)
    pushing(part, 2, 0, 2, [0, 0, 0, 1])
    pushing(part, 2, 1, 2, [0, 0, 0, 1])
    assert part.deciding(2) and part.watermark == 0, "step 2 waits for step 1"
    assert part.deciding(1) and part.watermark == 2
    np.testing.assert_array_equal(part.params, [-2, -1, -1, -3])


@settings(max_examples=25, deadline=None)
@given(
    cuts=st.lists(st.lists(st.integers(1, 3 * CELL + 4), max_size=4), min_size=1, max_size=3),
    order=st.randoms(use_true_random=False),
)
def test_step_sums_are_exact_whatever_the_chunking_in_reused_memory(
    cuts: list[list[int]], order: random.Random
) -> None:
    length = 3 * CELL + 5
    part = Partition()
    zeros = np.zeros(length)
    part.adopting(1, 0, length, length, "float64", 1.0, 0.0, 0, 0, (zeros, zeros))
    part.spare.append(np.full(length, 7.0))  # reused memory holds garbage
    contributions = [np.arange(length, dtype=np.float64) * (c + 1) for c in range(len(cuts))]
    chunks = []
    for contributor, points in enumerate(cuts):
        edges = [0, *sorted(set(points)), length]
        for a, b in itertools.pairwise(edges):
            chunk = contributions[contributor][a:b].tobytes()
            chunks.append((contributor, a, chunk))
    order.shuffle(chunks)
    for contributor, offset, chunk in chunks:
        part.adding(1, contributor, len(cuts), offset, chunk)
    assert part.complete(1) and part.deciding(1)
    np.testing.assert_array_equal(part.params, -sum(contributions))


def test_a_contributor_pushing_twice_is_refused() -> None:
    part = adopted()
    pushing(part, 1, 0, 2, [1, 1, 1, 1])
    with pytest.raises(PartitionError, match="twice"):
        pushing(part, 1, 0, 2, [1, 1, 1, 1])


def test_settling_applies_complete_steps_and_refuses_a_missing_one() -> None:
    part = adopted()
    pushing(part, 1, 0, 1, [1, 0, 0, 0])
    pushing(part, 3, 0, 1, [0, 1, 0, 0])
    with pytest.raises(PartitionError, match="step 2"):
        part.settling(3)
    assert part.watermark == 0
    status = part.settling(1)
    assert status.watermark == 1 and status.complete_steps == ()
    np.testing.assert_array_equal(part.params, [-1, 0, 0, 0])


def test_fencing_refuses_older_generations_and_waits_for_adoption() -> None:
    part = adopted()
    part.fencing(3)
    with pytest.raises(StaleGeneration):
        part.serving(1)
    with pytest.raises(StaleGeneration):
        part.fencing(2)
    keep = part.adopting(3, 0, 4, 4, "float64", 1.0, 0.0, 0, 0, None)
    assert keep.adopted == 3
    with pytest.raises(PartitionError, match="cannot keep"):
        part.adopting(4, 0, 2, 4, "float64", 1.0, 0.0, 0, 0, None)


def test_momentum_follows_torchs_sgd() -> None:
    part = adopted(length=3, lr=0.1, momentum=0.9)
    weight = torch.zeros(3, dtype=torch.float64, requires_grad=True)
    optimizer = torch.optim.SGD([weight], lr=0.1, momentum=0.9)
    for step, gradient in enumerate(([1.0, 2.0, 3.0], [0.5, -1.0, 2.0], [3.0, 0.0, -1.0]), 1):
        pushing(part, step, 0, 1, gradient)
        part.deciding(step)
        weight.grad = torch.tensor(gradient, dtype=torch.float64)
        optimizer.step()
    np.testing.assert_allclose(part.params, weight.detach().numpy(), rtol=1e-12)


def test_snapshot_cuts_cover_and_restore_across_layouts(tmp_path: Path) -> None:
    directory = SnapshotDirectory(tmp_path)
    values = np.arange(10, dtype=np.float32)
    directory.writing(5, 0, 4, values[:4], -values[:4])
    assert not directory.covers(5, 10)
    with pytest.raises(SnapshotMissing):
        directory.latest_cut(10)
    directory.writing(5, 4, 10, values[4:], -values[4:])
    assert directory.latest_cut(10) == 5
    params, velocity = directory.reading(5, 2, 7, "float32")
    np.testing.assert_array_equal(params, values[2:7])
    np.testing.assert_array_equal(velocity, -values[2:7])
    for step in (10, 15, 20, 25):
        directory.writing(step, 0, 4, values[:4], values[:4], size=10)
    assert directory.latest_cut(10) == 5, "files of the newest complete cut stay"
    directory.writing(25, 4, 10, values[4:], values[4:], size=10)
    directory.writing(30, 0, 4, values[:4], values[:4], size=10)
    assert directory.latest_cut(10) == 25
    assert not (directory.step_dir(5) / "0-4.npy").exists(), "older files of a range go"
    assert (directory.step_dir(20) / "0-4.npy").exists(), "the newest few stay"


def test_servers_register_beside_workers_and_retire_when_drained() -> None:
    state = CoordinatorState.starting(DatasetPlan(20, 5, 1), join_window_s=0.0)
    state.registering("w0", "n", "", 0.0)
    state.registering("ps0", "n", "h:1", 0.0, server=True)
    state.registering("ps1", "n", "h:2", 0.0, server=True)
    with pytest.raises(FencedError, match="parameter server"):
        state.registering("ps0", "n", "", 0.0)
    assert state.ticking(1.0)
    view = state.viewing_generation("w0")
    assert [m[0] for m in view.members] == ["w0"]
    assert [m[0] for m in view.servers] == ["ps0", "ps1"]
    assert state.membership.phase_of("ps0") is WorkerPhase.MEMBER
    assert state.draining("ps0")
    assert state.ticking(2.0), "a drained server opens a generation"
    view = state.viewing_generation("w0")
    assert [m[0] for m in view.servers] == ["ps1"]
    assert [m[0] for m in view.retiring] == ["ps0"]
    restored = CoordinatorState.from_json(state.to_json(), now=3.0)
    assert restored.viewing_generation("w0").retiring == view.retiring
    state.departing("ps0")
    assert state.viewing_generation("w0").retiring == ()
    generation = state.membership.generation
    state.departing("ps1")
    assert state.ticking(4.0) and state.membership.generation == generation + 1


def test_bad_ps_configurations_name_the_field() -> None:
    from trainer_runtime.ps.session import PsConfig, flattening

    with pytest.raises(ValueError, match="global_batch"):
        PsConfig(global_batch=0, lr=0.1, snapshot_dir="/tmp/x")
    with pytest.raises(ValueError, match="snapshot_every"):
        PsConfig(global_batch=8, lr=0.1, snapshot_dir="/tmp/x", snapshot_every=500)
    mixed = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2).double())
    with pytest.raises(ValueError, match="one dtype"):
        flattening(mixed)


def test_a_job_without_servers_fails_clearly_within_the_timeout(tmp_path: Path) -> None:
    import time

    from trainer_runtime.client import CoordinatorUnreachable
    from trainer_runtime.coordinator.serving import CoordinatorServer, CoordinatorService
    from trainer_runtime.coordinator.storing import MemoryStore
    from trainer_runtime.environment import WorkerContract
    from trainer_runtime.ps.session import PsConfig, ps_session

    state = CoordinatorState.starting(DatasetPlan(8, 4, 1), join_window_s=0.05)
    server = CoordinatorServer(CoordinatorService(state, MemoryStore(), VERIFIER)).start()
    try:
        worker = CREDENTIALS.worker("w0")
        contract = WorkerContract(server.address, worker, "job", "w0", "node", timeout_s=2.0)
        model = torch.nn.Linear(2, 1)
        data = torch.utils.data.TensorDataset(torch.zeros(8, 2), torch.zeros(8, 1))
        config = PsConfig(global_batch=4, lr=0.1, snapshot_dir=tmp_path)
        started = time.monotonic()
        with (
            pytest.raises(CoordinatorUnreachable, match="no parameter server"),
            ps_session(model, data, config, contract) as s,
        ):
            for _ in s.batches():
                pass
        assert time.monotonic() - started < 15
    finally:
        server.stop(0.1)


def test_commits_carry_the_mean_step_time_the_planner_learns_from() -> None:
    # From the previous batch's last window: 3 windows over 1.5 s.
    assert mean_step_time(10.0, [10.5, 11.0, 11.5]) == pytest.approx(0.5)
    # Bulk-enqueued windows (asynchronous mode) share one time: still measured from before.
    assert mean_step_time(10.0, [12.0, 12.0, 12.0, 12.0]) == pytest.approx(0.5)
    # A generation's first batch: between its own windows.
    assert mean_step_time(None, [1.0, 1.2, 1.4]) == pytest.approx(0.2)
    # Nothing measurable: no time between them, one window, or none.
    assert mean_step_time(None, [5.0, 5.0]) == 0.0
    assert mean_step_time(None, [5.0]) == 0.0
    assert mean_step_time(3.0, []) == 0.0
