"""A coordinator replaced from a snapshot older than its last commits.

With `state.kind: snapshot` the controller keeps the coordinator's state by polling
`GetSnapshot` every few seconds; a replacement coordinator starts from the last document
kept, which may lack the commits of up to one period. The workers that made those commits
hold them, and report them when they register again with the new coordinator.

Aspects of the pure state (``recovering.py``, ``CoordinatorState``):
- a state loaded from a document awaits its workers: no shard, no generation, until each
  has registered again or gone (then a settle time), or the grace passed; the generation it
  opens is newer than any reported, and lease ids go on past the newest reported;
- a report moves samples of the ledger's epoch from todo, or from a lease of the saved
  state, to done; a report of a later epoch ends the epochs before it; merging it again
  changes nothing; a lease this incarnation granted is never taken back by a late report;
- leases and commits naming another incarnation are refused (``Reincarnated``); malformed
  reports are refused whole, with a message, the ledger unchanged; over the API, a
  replaced incarnation is told apart from a fence (``client.Reincarnated``), a worker's
  wait for a generation is answered at once by another incarnation, and a report
  beyond ``MAX_TRAINED`` ranges is refused before it reaches the state;
- every rank of a generation adopts the windows its rank 0 applied (``generations``).

Aspects with real processes (framework-free workers in independent mode, checked by the
workers' own ledger files, not by the coordinator's count):
- a snapshot taken mid-epoch, more shards committed after it, the coordinator SIGKILLed and
  a new one started from that snapshot: every sample is trained exactly once;
- the same with the snapshot an epoch behind (the old coordinator advanced the epoch after
  it): the new one learns from the reports that the epoch ended; and with a worker that
  joined after the snapshot (the new coordinator does not know it: it registers anew);
- no worker fails on the new coordinator (the test replaces one that does, as the
  controller would, so that a failure shows as repeated samples rather than a stalled job).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch

from trainer_runtime import generations
from trainer_runtime.client import CoordinatorClient, Reincarnated, Rejoining
from trainer_runtime.coordinator.ledger import Ledger
from trainer_runtime.coordinator.recovering import SETTLE_S, ReportError, TrainedRange
from trainer_runtime.coordinator.serving import CoordinatorServer, CoordinatorService
from trainer_runtime.coordinator.state import (
    ConsumptionMode,
    CoordinatorState,
    FencedError,
    Rejoin,
)
from trainer_runtime.coordinator.state import (
    Reincarnated as StateReincarnated,
)
from trainer_runtime.coordinator.storing import MemoryStore
from trainer_runtime.protocol import pb
from trainer_runtime.protocol.checks import MAX_TRAINED, size_problem
from trainer_runtime.sharding import DatasetPlan, SampleRange, StepWindow

from .harness import TOKEN, VERIFIER, Cluster, waiting_for
from .ledger_files import counting_trained, exactness

SAMPLES, SHARD, EPOCHS = 1500, 10, 2
PLAN = DatasetPlan(samples=40, shard_size=4, epochs=2, seed=3)


def running_state(*workers: str) -> CoordinatorState:
    """A fresh independent-mode state whose `workers` are members of generation 1."""
    state = CoordinatorState.starting(PLAN, ConsumptionMode.INDEPENDENT, join_window_s=0.1)
    for worker in workers:
        state.registering(worker, "n", "", now=0.0)
    state.ticking(now=1.0)
    return state


def training(state: CoordinatorState, worker: str) -> TrainedRange:
    """`worker` leases a shard and commits it; returns what it trained."""
    lease = state.leasing_shard(worker, state.membership.generation, state.incarnation)
    assert lease is not None
    state.committing_leases(worker, [lease.lease_id], 0.1, state.incarnation)
    return TrainedRange(lease.epoch, lease.samples)


def rejoin(old: CoordinatorState, *trained: TrainedRange, generation: int = 1) -> Rejoin:
    return Rejoin(old.incarnation, generation, trained, old.ledger.next_lease_id - 1)


def test_a_loaded_state_awaits_its_workers_then_opens_a_newer_generation() -> None:
    old = running_state("a", "b")
    saved = old.to_json()
    trained = [training(old, "a") for _ in range(3)]
    new = CoordinatorState.from_json(saved, now=10.0)
    assert new.is_recovering() and new.incarnation != old.incarnation
    new.registering("a", "n", "", 10.1, rejoin=rejoin(old, *trained, generation=4))
    assert new.leasing_shard("a", 1, new.incarnation) is None, "a shard while awaiting b"
    assert not new.ticking(10.1 + SETTLE_S)
    new.registering("b", "n", "", 10.2, rejoin=rejoin(old, generation=4))
    assert not new.ticking(10.2 + SETTLE_S / 2), "the settle time had not passed"
    assert new.ticking(10.0 + SETTLE_S)
    assert new.membership.generation == 5, "newer than every reported generation"
    assert new.ledger.samples_done == old.ledger.samples_done == 12
    lease = new.leasing_shard("a", 5, new.incarnation)
    assert lease is not None and lease.lease_id >= old.ledger.next_lease_id
    assert all(lease.samples != t.samples for t in trained)


def test_a_silent_worker_is_awaited_until_the_grace_passes() -> None:
    old = running_state("a", "b")
    new = CoordinatorState.from_json(old.to_json(), now=0.0)
    new.registering("a", "n", "", 0.1, rejoin=rejoin(old))
    grace = new.membership.lease_timeout_s
    assert not new.ticking(grace - 0.1)
    assert new.ticking(grace + 0.1) and not new.is_recovering()
    assert [w.worker_id for w in new.membership.members()] == ["a"], "b expired"


def test_reports_end_epochs_and_merge_leases_of_the_saved_state_once() -> None:
    old = running_state("a", "b")
    held = old.leasing_shard("b", 1, old.incarnation)
    assert held is not None
    saved = old.to_json()
    old.committing_leases("b", [held.lease_id], 0.1, old.incarnation)
    by_a: list[TrainedRange] = []
    while old.ledger.epoch == 0:
        by_a.append(training(old, "a"))
    in_epoch_1 = training(old, "a")
    new = CoordinatorState.from_json(saved, now=0.0)
    report_b = rejoin(old, TrainedRange(held.epoch, held.samples))
    new.registering("b", "n", "", 0.1, rejoin=report_b)
    assert held.lease_id not in new.ledger.leases, "the saved state's lease is done"
    assert new.ledger.samples_done == 4  # the shard b held in the saved state
    new.registering("a", "n", "", 0.2, rejoin=rejoin(old, in_epoch_1))
    assert new.ledger.epoch == 1 and new.ledger.samples_done == old.ledger.samples_done
    before = new.to_json()
    new.registering("a", "n", "", 0.3, rejoin=rejoin(old, in_epoch_1))
    new.registering("b", "n", "", 0.3, rejoin=report_b)
    assert new.to_json() == before, "a report merged again changed the state"


def test_a_late_report_never_takes_back_a_lease_of_this_incarnation() -> None:
    old = running_state("a")
    saved = old.to_json()
    late = training(old, "a")
    new = CoordinatorState.from_json(saved, now=0.0)
    new.registering("b", "n", "", 0.1)  # b was not in the saved state
    new.ticking(new.membership.lease_timeout_s + 0.05)  # a never reported in time
    assert not new.is_recovering()
    lease = new.leasing_shard("b", new.membership.generation, new.incarnation)
    assert lease is not None and lease.samples == late.samples
    new.registering("a", "n", "", 20.0, rejoin=rejoin(old, late))
    assert new.ledger.leases[lease.lease_id].holder == "b"


def test_calls_naming_another_incarnation_and_bad_reports_are_refused() -> None:
    old = running_state("a")
    new = CoordinatorState.from_json(old.to_json(), now=0.0)
    with pytest.raises(StateReincarnated):
        new.leasing_shard("a", 1, old.incarnation)
    with pytest.raises(StateReincarnated):
        new.committing_leases("a", [1], 0.1, old.incarnation)
    with pytest.raises(ReportError, match="register first"):
        new.leasing_shard("a", 1, "")
    before = new.to_json()
    bad = [
        (Rejoin(new.incarnation, 1), "this coordinator's own"),
        (rejoin(old, TrainedRange(2, SampleRange(0, 4))), "outside the plan"),
        (rejoin(old, TrainedRange(0, SampleRange(36, 44))), "outside the dataset"),
        (Rejoin(old.incarnation, -1), "negative"),
    ]
    for report, message in bad:
        with pytest.raises(ReportError, match=message):
            new.registering("a", "n", "", 0.1, rejoin=report)
    assert new.to_json() == before
    group = CoordinatorState.from_json(
        CoordinatorState.starting(PLAN, ConsumptionMode.GROUP).to_json(), now=0.0
    )
    with pytest.raises(ReportError, match="independent mode only"):
        group.registering("a", "n", "", 0.1, rejoin=rejoin(old, TrainedRange(0, SampleRange(0, 4))))
    assert issubclass(StateReincarnated, FencedError)


def test_a_report_beyond_the_cap_is_refused_before_the_state() -> None:
    ranges = [pb.SampleRange(start=2 * i, stop=2 * i + 1) for i in range(MAX_TRAINED + 1)]
    request = pb.RegisterRequest(
        worker_id="w0", trained=[pb.TrainedRange(epoch=0, range=r) for r in ranges]
    )
    problem = size_problem(request)
    assert problem is not None and "more than" in problem
    del request.trained[-1]
    assert size_problem(request) is None


def test_every_rank_adopts_the_windows_rank0_applied() -> None:
    windows = [
        StepWindow(7, 0, (SampleRange(0, 4),)),
        StepWindow(8, 1, (SampleRange(4, 6), SampleRange(9, 11))),
    ]
    view = pb.LedgerView(epoch=1, samples=40, shard_size=4, epochs=2, seed=3)
    sent = generations.handover(8, view, {}, {}, windows)
    assert generations.adopted_windows(sent) == windows
    assert generations.adopted_windows({}) == [], "a rank 0 that sent none"


def test_a_replaced_incarnation_is_told_apart_from_a_fence_over_the_api() -> None:
    old = running_state("w0")
    state = CoordinatorState.from_json(old.to_json(), now=time.monotonic())
    server = CoordinatorServer(CoordinatorService(state, MemoryStore(), VERIFIER)).start()
    try:
        client = CoordinatorClient(server.address, TOKEN, timeout_s=2.0, retry_s=2.0)
        client.incarnation = old.incarnation  # what w0's client knew
        with pytest.raises(Reincarnated):
            client.lease_shard("w0", 1)
        started = time.monotonic()
        reply = client.awaiting_generation("w0", 0, 5.0)  # answered at once, not polled out
        assert reply.status == pb.PENDING and reply.incarnation == state.incarnation
        assert time.monotonic() - started < 2.0
        client.register("w0", "n", "", rejoin=Rejoining(1, ((0, SampleRange(0, 4)),), 3))
        assert client.incarnation == state.incarnation
        waiting_for(lambda: not state.is_recovering(), 5.0, "the recovery to open")
        reply = client.awaiting_generation("w0", 1, 2.0)
        assert reply.number == 2 and reply.incarnation == state.incarnation
    finally:
        server.stop(0.1)


WORKER = ["-m", "trainer_runtime.plain_worker", "--step-time-s", "0.02"]
WORKERS = ("w0", "w1", "w2")


def replacing_failed_workers(cluster: Cluster, root: Path, failed: list[str]) -> bool:
    """What the controller does for a worker that exits non-zero: a new worker (a new id)
    takes its place. Returns whether the job finished."""
    for name in [n for n in list(cluster.processes) if n != "coordinator"]:
        code = cluster.processes[name].poll()
        if code is not None and code != 0 and name not in failed:
            failed.append(name)
            replacement = f"r{len(failed)}"
            cluster.starting_worker(
                replacement, [*WORKER, "--ledger-file", str(root / f"{replacement}.ledger")]
            )
    return bool(cluster.client().progress().finished)


def replacing_from_an_old_snapshot(
    cluster: Cluster, snapshot_at: int, kill_at: int, root: Path, joiner: bool = False
) -> tuple[int, int, list[str]]:
    """Run a job, keep a snapshot once `snapshot_at` samples are done (then, with `joiner`,
    start a fourth worker, which the snapshot does not know), SIGKILL the coordinator once
    `kill_at` are, and start a new one from that snapshot (as the controller's replacement
    pod does: the document seeded into its `--state-file`), then let the job finish,
    replacing the workers that fail. Returns the samples done in the snapshot and at the
    kill, and the workers that failed."""
    coordinator_args = [
        "--samples", str(SAMPLES), "--shard-size", str(SHARD), "--epochs", str(EPOCHS),
        "--mode", "independent", "--join-window-s", "0.1", "--lease-timeout-s", "5",
    ]  # fmt: skip
    cluster.starting_coordinator(*coordinator_args)
    for name in WORKERS:
        cluster.starting_worker(name, [*WORKER, "--ledger-file", str(root / f"{name}.ledger")])
    client = cluster.client()
    waiting_for(
        lambda: {m.worker_id for m in client.progress().members} == set(WORKERS),
        60,
        "three workers",
    )
    waiting_for(lambda: client.progress().samples_done >= snapshot_at, 60, "the snapshot's samples")
    snapshot = client.snapshot()  # what the controller keeps in the job's ConfigMap
    kept = Ledger.from_dict(json.loads(snapshot)["ledger"]).samples_done
    if joiner:
        cluster.starting_worker("w3", [*WORKER, "--ledger-file", str(root / "w3.ledger")])
        waiting_for(
            lambda: "w3" in {m.worker_id for m in client.progress().members}, 60, "a joiner"
        )
    waiting_for(lambda: client.progress().samples_done >= kill_at, 60, "commits after it")
    done_at_kill = int(client.progress().samples_done)
    cluster.killing("coordinator")
    (cluster.root / "state.json").write_text(snapshot)
    cluster.starting_coordinator(*coordinator_args)
    failed: list[str] = []
    waiting_for(lambda: replacing_failed_workers(cluster, root, failed), 90, "the job's end")
    for name in cluster.processes:
        if name != "coordinator" and name not in failed:
            assert cluster.waiting_exit(name, 30) == 0, cluster.log(name)
    return kept, done_at_kill, failed


@pytest.mark.slow
@pytest.mark.parametrize(
    ("snapshot_at", "kill_at", "joiner"),
    [(300, 700, False), (SAMPLES - 300, SAMPLES + 300, False), (300, 900, True)],
    ids=["mid-epoch", "an-epoch-behind", "a-joiner-it-lacks"],
)
def test_a_coordinator_replaced_from_an_old_snapshot_repeats_no_sample(
    cluster: Cluster, snapshot_at: int, kill_at: int, joiner: bool
) -> None:
    root = cluster.root / "ledgers"
    root.mkdir()
    kept, done_at_kill, failed = replacing_from_an_old_snapshot(
        cluster, snapshot_at, kill_at, root, joiner
    )
    if joiner:
        assert (root / "w3.ledger").read_text(), "the joiner trained nothing"
    counts, unknown = counting_trained(root, EPOCHS)
    result = exactness(counts, SAMPLES, unknown)
    print(
        f"snapshot at {kept} samples, killed at {done_at_kill}: lost {result.lost}, "
        f"repeated {result.repeated}, unknown {result.unknown}, failed workers {failed}"
    )
    assert (result.lost, result.repeated) == (0, 0), result
    assert failed == [], [cluster.log(name)[-500:] for name in failed]


@pytest.mark.slow
@pytest.mark.parametrize("resize_after_snapshot", [False, True], ids=["steady", "resized"])
def test_a_group_replaced_from_an_old_snapshot_trains_each_sample_once(
    cluster: Cluster, resize_after_snapshot: bool
) -> None:
    """Group mode (PyTorch, gloo): the per-sample counter of `torch_job.py --kind ledger`
    ends at exactly the number of epochs."""
    samples, epochs = 600, 2
    args = [
        "--samples", str(samples), "--shard-size", "10", "--epochs", str(epochs),
        "--join-window-s", "0.3", "--lease-timeout-s", "15",
    ]  # fmt: skip
    cluster.starting_coordinator(*args)
    out = cluster.root / "out"
    job = [
        str(Path(__file__).with_name("torch_job.py")), "--kind", "ledger",
        "--samples", str(samples), "--global-batch", "8", "--step-sleep-s", "0.05",
        "--out", str(out),
    ]  # fmt: skip
    workers = ["w0", "w1"]
    for name in workers:
        cluster.starting_worker(name, job)
    client = cluster.client()

    def step() -> int:
        return int(client.progress().committed_step)

    waiting_for(lambda: len(client.progress().members) == 2 and step() >= 5, 90, "step 5")
    snapshot = client.snapshot()
    if resize_after_snapshot:
        workers.append("w2")
        cluster.starting_worker("w2", job)
        waiting_for(lambda: len(client.progress().members) == 3, 90, "a third worker")
    target = step() + 15
    waiting_for(lambda: step() >= target, 90, f"step {target}")
    cluster.killing("coordinator")
    (cluster.root / "state.json").write_text(snapshot)
    cluster.starting_coordinator(*args)
    for name in workers:
        assert cluster.waiting_exit(name, 120) == 0, cluster.log(name)[-3000:]
    counts = torch.load(out / "w0.pt")["counts"]
    assert torch.equal(counts, torch.full((samples,), float(epochs), dtype=torch.float64))
