"""The gradient statistics the runtime measures for the planner's goodput model.

Aspects:
- the estimator, fed synthetic gradients of a known mean and per-sample variance (even and
  uneven local batches), converges to |G|^2 and sigma^2 / init_batch within a tolerance;
  one rank, non-finite numbers and a one-sample step are skipped; its state round-trips;
- the meter on a real two-process gloo group: a measured step's gradients, which it
  averages itself, and an unmeasured step's (DDP's) are those of plain DDP, and the carried
  scalars are exactly each rank's |g_i|^2, 1/b_i and |g|^2 computed by hand;
- the coordinator keeps the latest valid statistics (an invalid report is dropped with a
  warning, the commit still lands), saves and restores them, and GetProgress returns them;
- a two-worker gloo job under the test harness reports them: its progress carries the
  job's initial batch and positive statistics.
"""

from __future__ import annotations

import gc
import json
import logging
import math
import os
import random
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from trainer_runtime.client import CoordinatorClient
from trainer_runtime.coordinator.records import NoiseRecord
from trainer_runtime.coordinator.serving import CoordinatorServer, CoordinatorService
from trainer_runtime.coordinator.state import CoordinatorState
from trainer_runtime.coordinator.storing import MemoryStore
from trainer_runtime.noise import NoiseEstimator, NoiseSample
from trainer_runtime.protocol import pb
from trainer_runtime.sharding import DatasetPlan, Walk
from trainer_runtime.torch.measuring import NoiseMeter

from .harness import TOKEN, VERIFIER, Cluster, waiting_for

# ----- the estimator, against a known distribution -----


def synthetic_step(
    rng: random.Random, mean: list[float], sigma: float, batches: list[int]
) -> NoiseSample:
    """One step whose rank i averages b_i samples of gradient ~ N(mean, sigma^2 I): so the
    per-sample variance trace is len(mean) * sigma^2."""
    locals_: list[list[float]] = []
    for b in batches:
        locals_.append([m + rng.gauss(0.0, sigma / math.sqrt(b)) for m in mean])
    total = sum(batches)
    averaged = [
        sum(b * g[k] for b, g in zip(batches, locals_, strict=True)) / total
        for k in range(len(mean))
    ]
    return NoiseSample(
        local_sqr=sum(sum(x * x for x in g) for g in locals_),
        inverse_batch=sum(1.0 / b for b in batches),
        ranks=len(batches),
        global_sqr=sum(x * x for x in averaged),
        batch=total,
    )


@pytest.mark.parametrize("batches", [[8, 8], [8, 8, 8, 8], [3, 5, 8, 16]])
def test_estimator_converges_to_the_known_statistics(batches: list[int]) -> None:
    rng = random.Random(7)
    mean = [0.5, -0.25, 1.0, 0.0, 0.75]
    sigma = 2.0
    init_batch = 16
    estimator = NoiseEstimator(init_batch, smoothing=0.99)
    for _ in range(4000):
        assert estimator.observing(synthetic_step(rng, mean, sigma, batches))
    estimate = estimator.estimate()
    assert estimate is not None and estimate.steps == 4000
    true_sqr = sum(m * m for m in mean)  # 1.875
    true_var = len(mean) * sigma**2 / init_batch  # 1.25: a gradient over init_batch samples
    assert estimate.grad_sqr == pytest.approx(true_sqr, rel=0.15)
    assert estimate.grad_var == pytest.approx(true_var, rel=0.15)
    assert estimate.init_batch == init_batch


def test_the_debiased_average_of_one_step_is_that_step() -> None:
    estimator = NoiseEstimator(8)
    sample = NoiseSample(local_sqr=2 * 3.0, inverse_batch=2 / 4, ranks=2, global_sqr=2.0, batch=8)
    assert estimator.observing(sample)
    estimate = estimator.estimate()
    assert estimate is not None
    # sigma^2 = (3 - 2) / (1/4 - 1/8) = 8; |G|^2 = 2 - 8/8 = 1; grad_var = 8 / 8
    assert estimate.grad_sqr == pytest.approx(1.0)
    assert estimate.grad_var == pytest.approx(1.0)


def test_steps_that_cannot_separate_the_two_are_skipped() -> None:
    estimator = NoiseEstimator(8)
    one_rank = NoiseSample(local_sqr=3.0, inverse_batch=1 / 8, ranks=1, global_sqr=3.0, batch=8)
    not_finite = NoiseSample(math.nan, 0.5, 2, 1.0, 8)
    one_sample = NoiseSample(1.0, 1.0, 1, 1.0, 1)
    for sample in (one_rank, not_finite, one_sample):
        assert not estimator.observing(sample)
    assert estimator.estimate() is None and estimator.steps == 0
    with pytest.raises(ValueError, match="init_batch is 0"):
        NoiseEstimator(0)


def test_estimator_state_round_trips() -> None:
    rng = random.Random(1)
    first = NoiseEstimator(16, smoothing=0.9)
    for _ in range(20):
        first.observing(synthetic_step(rng, [1.0, 2.0], 1.0, [4, 4]))
    second = NoiseEstimator(1, smoothing=0.9)
    second.adopting(json.loads(json.dumps(first.shared_state())))
    assert second.estimate() == first.estimate()


# ----- the DDP hook on a real gloo group -----


class RecordingEstimator(NoiseEstimator):
    """An estimator that keeps every sample it is fed."""

    def __init__(self, init_batch: int) -> None:
        super().__init__(init_batch)
        self.samples: list[NoiseSample] = []

    def observing(self, sample: NoiseSample) -> bool:
        self.samples.append(sample)
        return super().observing(sample)


def hooked_rank(rank: int, world: int, init_file: str, out: str) -> None:
    """A rank of a two-process group: a linear model's gradients of one measured step
    (averaged by the meter) and of one plain DDP step, from the same parameters, on uneven
    local batches; then a step the meter leaves to DDP (not measured, averaged the same)."""
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    torch.manual_seed(0)
    model = nn.Linear(6, 3).double()
    data = torch.randn(10, 6, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    target = torch.randn(10, 3, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    sizes = [3, 7]  # uneven: b_0 = 3, b_1 = 7, B = 10
    start = sum(sizes[:rank])
    x, y = data[start : start + sizes[rank]], target[start : start + sizes[rank]]
    scale = sizes[rank] * world / sum(sizes)  # as the session scales each rank's mean loss

    def loss_of(module: nn.Module) -> torch.Tensor:
        return nn.functional.mse_loss(module(x), y) * scale

    estimator = RecordingEstimator(10)
    meter = NoiseMeter(estimator)
    measuring = DistributedDataParallel(model)
    meter.attaching(measuring, world)
    meter.arming(step=0)  # step 0: a measured one
    loss_of(measuring).backward()
    assert meter.averaging(sizes[rank], scale, sum(sizes))
    measured = [p.grad.clone() for p in model.parameters() if p.grad is not None]
    assert meter.keeping()  # the step settled: the first estimates fold at once
    for p in model.parameters():
        p.grad = None
    meter.arming(step=1)  # not measured: DDP averages, the meter adds nothing
    loss_of(measuring).backward()
    assert not meter.averaging(sizes[rank], scale, sum(sizes))
    unmeasured = [p.grad.clone() for p in model.parameters() if p.grad is not None]
    (sample,) = estimator.samples
    local = torch.autograd.grad(nn.functional.mse_loss(model(x), y), list(model.parameters()))
    for p in model.parameters():
        p.grad = None
    plain = DistributedDataParallel(model)
    loss_of(plain).backward()
    reference = [p.grad.clone() for p in model.parameters() if p.grad is not None]
    result = {
        "same_gradients": all(
            torch.allclose(a, b, rtol=0, atol=1e-12)
            for grads in (measured, unmeasured)
            for a, b in zip(grads, reference, strict=True)
        ),
        "samples_seen": len(estimator.samples),
        "local_sqr": sum(float((g * g).sum()) for g in local),
        "global_sqr_by_hand": sum(float((g * g).sum()) for g in reference),
        "carried": [sample.local_sqr, sample.inverse_batch, sample.ranks],
        "global_sqr": sample.global_sqr,
        "batch": sample.batch,
    }
    Path(out, f"{rank}.json").write_text(json.dumps(result))
    # The DDP wrappers go before their group, as the runtime lets go of a generation's
    # (``NoiseMeter.detaching``): a group destroyed under a live reducer left a C++ thread
    # to the interpreter's exit, which aborted the rank there now and then.
    meter.detaching()
    del measuring, plain
    gc.collect()
    dist.destroy_process_group()


def test_the_meter_keeps_ddp_gradients_and_measures_exactly(tmp_path: Path) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    mp.start_processes(
        hooked_rank,
        args=(2, str(tmp_path / "init"), str(tmp_path)),
        nprocs=2,
        join=True,
        # Not "fork": pytest's process holds other tests' threads (the kube tests' kubelet
        # in miniature), and a child forked while one of them held a lock hung there (seen
        # once on a clean-clone run: 600 s, then pytest-timeout).
        start_method="spawn",
    )
    ranks = [json.loads((tmp_path / f"{r}.json").read_text()) for r in (0, 1)]
    for result in ranks:
        assert result["same_gradients"]
        assert result["global_sqr"] == pytest.approx(result["global_sqr_by_hand"], rel=1e-9)
        assert result["batch"] == 10
        assert result["samples_seen"] == 1  # the unmeasured step fed nothing
        local_sum, inverse_sum, counted = result["carried"]
        assert local_sum == pytest.approx(ranks[0]["local_sqr"] + ranks[1]["local_sqr"], rel=1e-9)
        assert inverse_sum == pytest.approx(1 / 3 + 1 / 7, rel=1e-12)
        assert counted == 2


# ----- the coordinator keeps them -----


def group_state() -> CoordinatorState:
    state = CoordinatorState.starting(DatasetPlan(40, 4, 1), join_window_s=0.05)
    state.registering("w0", "node-a", "w0:1", now=0.0)
    state.ticking(now=1.0)
    return state


def next_windows(state: CoordinatorState, count: int) -> list:  # type: ignore[type-arg]
    ledger = state.ledger
    walk = Walk(ledger.plan, ledger.epoch, ledger.committed_step, list(ledger.todo))
    return [walk.next_window(4) for _ in range(count)]


def test_a_measured_step_that_fails_late_leaves_no_statistics(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On NCCL a measured step's allreduce is asynchronous: it may return and then fail
    (a peer died half-way), leaving a partial sum. The session then discards the step, and
    its numbers must not reach the estimator, now or at the next generation's fold; a step
    that settled counts."""
    from trainer_runtime.torch import measuring

    def partial_sum(tensor: torch.Tensor, group: object = None) -> None:  # a half-done one
        tensor[: tensor.numel() // 2] *= 2

    monkeypatch.setattr(measuring.dist, "all_reduce", partial_sum)
    estimator = RecordingEstimator(16)
    meter = NoiseMeter(estimator)
    model = nn.Linear(4, 2).double()
    meter.parameters, meter.world_size, meter.able = list(model.parameters()), 2, True
    meter.arming(step=0)
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    assert meter.averaging(8, 1.0, 16)
    assert estimator.samples == []  # nothing folded before the step is known whole
    meter.discarding()  # settling raised: the step is not applied
    meter.folding()  # what rank 0's next generation folds first
    assert (estimator.samples, meter.pending) == ([], [])
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    assert meter.averaging(8, 1.0, 16)
    assert meter.keeping()
    assert len(estimator.samples) == 1
    meter.discarding()  # a failure after the step settled (in the optimizer) drops nothing
    meter.folding()
    assert len(estimator.samples) == 1


def test_coordinator_keeps_the_latest_valid_statistics_through_a_restart(
    caplog: pytest.LogCaptureFixture,
) -> None:
    state = group_state()
    generation = state.membership.generation
    state.committing_windows(
        "w0", generation, next_windows(state, 1), 0.1, NoiseRecord(8, 1.5, 0.5, 3)
    )
    with caplog.at_level(logging.WARNING):
        state.committing_windows(
            "w0", generation, next_windows(state, 1), 0.1, NoiseRecord(8, math.nan, 0.5, 4)
        )
    assert "gradient statistics dropped" in caplog.text
    assert state.ledger.committed_step == 2  # the commit landed all the same
    assert state.noise == NoiseRecord(8, 1.5, 0.5, 3)
    restored = CoordinatorState.from_json(state.to_json(), now=5.0)
    assert restored.noise == NoiseRecord(8, 1.5, 0.5, 3)
    legacy = json.loads(state.to_json())
    del legacy["noise"]  # a state saved before statistics were measured
    assert CoordinatorState.from_json(json.dumps(legacy), now=5.0).noise is None


def test_get_progress_returns_what_a_commit_carried() -> None:
    state = CoordinatorState.starting(DatasetPlan(40, 4, 1), join_window_s=0.05)
    server = CoordinatorServer(CoordinatorService(state, MemoryStore(), VERIFIER)).start()
    client = CoordinatorClient(server.address, TOKEN, timeout_s=2.0, retry_s=2.0)
    try:
        client.register("w0", "node-a", "")
        generation = client.awaiting_generation("w0", 0, 2.0).number
        assert not client.progress().HasField("noise")
        noise = pb.GradientNoise(init_batch=32, grad_sqr=0.25, grad_var=2.0, steps=9)
        client.commit("w0", generation, next_windows(state, 1), 0.1, noise=noise)
        progress = client.progress()
        assert progress.HasField("noise") and progress.noise == noise
    finally:
        client.close()
        server.stop(0.1)


# ----- end to end: two gloo workers -----

JOB = str(Path(__file__).with_name("torch_job.py"))


def test_two_gloo_workers_report_their_gradient_statistics(cluster: Cluster) -> None:
    samples, batch = 960, 12
    cluster.starting_coordinator(
        "--samples", str(samples), "--shard-size", "10", "--epochs", "1",
        "--join-window-s", "60", "--lease-timeout-s", "15",
    )  # fmt: skip
    out = cluster.root / "out"
    args = [
        JOB, "--kind", "mlp", "--samples", str(samples), "--global-batch", str(batch),
        "--step-sleep-s", "0.02", "--out", str(out),
    ]  # fmt: skip
    client = cluster.client()
    client.set_target(2)  # one generation of both (one worker alone measures nothing)
    try:
        for name in ("w0", "w1"):
            cluster.starting_worker(name, args)
        waiting_for(lambda: client.progress().HasField("noise"), 90, "gradient statistics")
        for name in ("w0", "w1"):
            assert cluster.waiting_exit(name, 120) == 0, cluster.log(name)[-3000:]
        progress = client.progress()
        noise = progress.noise
    finally:
        client.close()
    # rank 0 reports what it runs at with the statistics: a fixed batch predicts no goodput
    assert progress.batch == pb.BatchInUse(global_batch=batch, accumulation=1, goodput=0.0)
    assert noise.init_batch == batch
    assert noise.steps >= 1
    assert math.isfinite(noise.grad_sqr) and noise.grad_sqr >= 0
    assert math.isfinite(noise.grad_var) and noise.grad_var > 0
