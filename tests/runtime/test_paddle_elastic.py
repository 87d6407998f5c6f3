"""The PaddlePaddle adapter under real processes on CPU (gloo), re-forming its group
in-process with a fresh group id per generation.

Aspects:
- the model is the ledger: through a graceful shrink 3->2, a join 2->3 and a SIGKILL 3->2,
  every per-sample counter ends at exactly the number of epochs on every survivor, and the
  survivors keep their PIDs (no restart) while forming several generations;
- after the graceful shrink the survivors, who hold rank 0's state, are not sent it again;
- with a fixed global batch, the final parameters of every survivor equal those of a
  fixed-size, one-process Paddle run over the same sample sequence, through a join and a
  SIGKILL (Momentum state included: it is handed to the newcomer);
- with gradient accumulation (`--max-local`: 2 to 4 micro-batches a step), through a
  SIGKILL, the ledger is still exact, and an MLP ends with the parameters of the
  fixed-size run, within the same tolerance;
- that job reports its gradient statistics (initial batch, positive variance) in its
  progress, the allreduce that carries them leaving the parameters exact;
- with a batch that changes at every formation and every few steps inside a generation
  (an adaptive policy's own paths: the state sent with the model, the gradient allreduce),
  through a join, a SIGKILL and a coordinator restart, the ledger is still exact;
- the adaptive batch sets a decision's rate on a Paddle optimizer and compensates its
  velocities, as PyTorch's does;
- bad input: an unreachable coordinator is a clear error within the timeout; a policy
  that cannot drive the optimizer names the fix.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import numpy as np
import paddle
import pytest
from paddle import nn

from trainer_runtime.adaptive import Decision
from trainer_runtime.client import CoordinatorUnreachable
from trainer_runtime.environment import WorkerContract
from trainer_runtime.paddle import AdaptiveBatch, KeepGlobalBatch, ScaleBatch, session
from trainer_runtime.sharding import DatasetPlan, Walk

from .harness import TOKEN, Cluster, changing_batch, cycle_windows, gated, waiting_for
from .paddle_job import mlp, mlp_arrays, momentum

JOB = str(Path(__file__).with_name("paddle_job.py"))


# Starting workers import Paddle at once; on a loaded 2-core machine that alone was seen
# to take 40-60 s.
STARTUP_S = 150


def job_args(kind: str, samples: int, out: Path, batch: int, sleep_s: float) -> list[str]:
    return [
        JOB, "--kind", kind, "--samples", str(samples), "--global-batch", str(batch),
        "--step-sleep-s", str(sleep_s), "--out", str(out),
    ]  # fmt: skip


def coordinator_args(samples: int, epochs: int) -> list[str]:
    return [
        "--samples", str(samples), "--shard-size", "10", "--epochs", str(epochs),
        "--join-window-s", "0.3", "--lease-timeout-s", "15",
    ]  # fmt: skip


@pytest.mark.slow
def test_model_ledger_is_exact_through_shrink_join_and_sigkill(cluster: Cluster) -> None:
    samples, epochs = 1600, 2
    cluster.starting_coordinator(*coordinator_args(samples, epochs))
    out = cluster.root / "out"
    args = job_args("ledger", samples, out, batch=8, sleep_s=0.05)
    client = cluster.client()

    def members() -> list[str]:
        return [m.worker_id for m in client.progress().members]

    def advancing(by: int) -> None:
        target = int(client.progress().committed_step) + by
        waiting_for(
            lambda: client.progress().committed_step >= target, 60, f"step {target}", cluster.tails
        )

    cluster.client().set_target(3)
    gate = cluster.root / "w3-joins"
    for name in ("w0", "w1", "w2"):
        cluster.starting_worker(name, args)
    cluster.starting_worker("w3", gated(args, gate))
    waiting_for(lambda: len(members()) == 3, STARTUP_S, "three workers")
    advancing(5)
    victim = members()[-1]
    client.drain(victim)  # 3 -> 2, graceful
    assert cluster.waiting_exit(victim, 60) == 0, cluster.log(victim)[-3000:]
    advancing(5)
    drained_at = int(client.progress().generation)
    gate.touch()  # 2 -> 3
    waiting_for(lambda: "w3" in members(), 60, "w3 to join")
    advancing(5)
    assert not client.progress().finished, "the SIGKILL should land mid-job"
    killed = members()[1]
    cluster.killing(killed)  # 3 -> 2
    survivors = [n for n in ("w0", "w1", "w2", "w3") if n not in (victim, killed)]
    pids = {name: cluster.processes[name].pid for name in survivors}
    for name in survivors:
        assert cluster.waiting_exit(name, 90) == 0, cluster.log(name)[-3000:]
    assert client.progress().finished
    expected = np.full(samples, float(epochs))
    for name in survivors:
        np.testing.assert_array_equal(np.load(out / f"{name}.npz")["counts"], expected)
    for name in survivors:  # re-formed in the same process, never restarted
        summary = json.loads((out / f"{name}.json").read_text())
        assert summary["pid"] == pids[name]
        if name != "w3":
            assert summary["generations"] >= 3 and {2, 3} <= set(summary["worlds"])
            # after the drain the survivors held rank 0's state: it was not sent again
            assert [drained_at, False] in summary["states_sent"], summary["states_sent"]


def reference_parameters(samples: int, epochs: int, batch: int) -> dict[str, np.ndarray]:
    """One process, the same sample sequence, no elasticity."""
    paddle.set_device("cpu")
    model = mlp()
    optimizer = momentum(model)
    inputs, targets = (paddle.to_tensor(a) for a in mlp_arrays(samples))
    plan = DatasetPlan(samples, 10, epochs)
    walk = Walk(plan, 0, 0, plan.epoch_order(0))
    while (window := walk.next_window(batch)) is not None:
        index = paddle.to_tensor([i for r in window.ranges for i in r.indices()])
        logits = model(paddle.gather(inputs, index))
        nn.functional.cross_entropy(logits, paddle.gather(targets, index)).backward()
        optimizer.step()
        optimizer.clear_grad()
    return {key: value.numpy() for key, value in model.state_dict().items()}


@pytest.mark.slow
def test_fixed_global_batch_matches_a_fixed_size_run(cluster: Cluster) -> None:
    samples, epochs, batch = 1800, 1, 12
    cluster.starting_coordinator(*coordinator_args(samples, epochs))
    out = cluster.root / "out"
    args = job_args("mlp", samples, out, batch=batch, sleep_s=0.08)
    client = cluster.client()
    client.set_target(2)
    gate = cluster.root / "w2-joins"
    for name in ("w0", "w1"):
        cluster.starting_worker(name, args)
    cluster.starting_worker("w2", gated(args, gate))
    waiting_for(lambda: client.progress().committed_step >= 5, STARTUP_S, "first steps")
    gate.touch()
    waiting_for(lambda: len(client.progress().members) == 3, 60, "the join")
    target = client.progress().committed_step + 3
    waiting_for(lambda: client.progress().committed_step >= target, 60, "steps at 3")
    assert not client.progress().finished, "the SIGKILL should land mid-job"
    cluster.killing("w1")
    for name in ("w0", "w2"):
        assert cluster.waiting_exit(name, 90) == 0, cluster.log(name)[-3000:]
    # the allreduce that carried the gradient statistics left the trained parameters exact
    noise = client.progress().noise
    assert noise.init_batch == batch and noise.steps >= 1, noise
    in_use = client.progress().batch  # what rank 0 runs at, sent with the statistics
    assert (in_use.global_batch, in_use.accumulation, in_use.goodput) == (batch, 1, 0.0)
    assert noise.grad_var > 0 and math.isfinite(noise.grad_sqr + noise.grad_var), noise
    matching_reference(out, ("w0", "w2"), (samples, epochs, batch), rtol=1e-9, atol=1e-10)


def matching_reference(
    out: Path, workers: tuple[str, ...], run: tuple[int, int, int], rtol: float, atol: float
) -> None:
    """Each of `workers` ended with the parameters of `reference_parameters(*run)`."""
    expected = reference_parameters(*run)
    for name in workers:
        final = np.load(out / f"{name}.npz")
        assert sorted(final.files) == sorted(expected)
        for key, value in expected.items():
            np.testing.assert_allclose(final[key], value, rtol=rtol, atol=atol)


def all_at_once(samples: int, epochs: int) -> list[str]:
    """A coordinator whose first generation waits for `set_target`'s workers, however
    long their imports take."""
    return [*coordinator_args(samples, epochs), "--join-window-s", str(STARTUP_S)]


@pytest.mark.slow
def test_accumulation_keeps_the_ledger_exact_through_a_sigkill(cluster: Cluster) -> None:
    samples, epochs = 200, 2  # 8 a step, at most 2 a rank at once: 2 micro-batches, then 4
    cluster.starting_coordinator(*all_at_once(samples, epochs))
    client = cluster.client()
    client.set_target(2)
    out = cluster.root / "out"
    args = [*job_args("ledger", samples, out, batch=8, sleep_s=0.05), "--max-local", "2"]
    for name in ("w0", "w1"):
        cluster.starting_worker(name, args)
    waiting_for(lambda: client.progress().committed_step >= 5, STARTUP_S, "first steps")
    assert not client.progress().finished, "the SIGKILL should land mid-job"
    cluster.killing("w1")  # 2 -> 1, most likely between two micro-batches of a step
    assert cluster.waiting_exit("w0", 90) == 0, cluster.log("w0")[-3000:]
    assert client.progress().finished
    np.testing.assert_array_equal(
        np.load(out / "w0.npz")["counts"], np.full(samples, float(epochs))
    )
    assert json.loads((out / "w0.json").read_text())["worlds"] == [1, 2]


@pytest.mark.slow
def test_accumulation_matches_a_fixed_size_run_through_a_sigkill(cluster: Cluster) -> None:
    samples, epochs, batch = 360, 1, 12  # at most 3 a rank at once: 2, then 4 micro-batches
    cluster.starting_coordinator(*all_at_once(samples, epochs))
    client = cluster.client()
    client.set_target(2)
    out = cluster.root / "out"
    args = [*job_args("mlp", samples, out, batch=batch, sleep_s=0.1), "--max-local", "3"]
    for name in ("w0", "w1"):
        cluster.starting_worker(name, args)
    # ten steps at two ranks, each averaged (noise probe and vote included) once, after
    # the last micro-batch
    waiting_for(lambda: client.progress().committed_step >= 10, STARTUP_S, "ten steps")
    assert not client.progress().finished, "the SIGKILL should land mid-job"
    cluster.killing("w1")  # 2 -> 1
    assert cluster.waiting_exit("w0", 90) == 0, cluster.log("w0")[-3000:]
    assert json.loads((out / "w0.json").read_text())["worlds"] == [1, 2]
    noise = client.progress().noise  # measured over each rank's whole slice, at two ranks
    assert noise.init_batch == batch and noise.steps >= 1, noise
    assert noise.grad_var > 0 and math.isfinite(noise.grad_sqr + noise.grad_var), noise
    matching_reference(out, ("w0",), (samples, epochs, batch), rtol=1e-9, atol=1e-10)


def test_unreachable_coordinator_is_a_clear_error_within_the_timeout() -> None:
    contract = WorkerContract("127.0.0.1:1", TOKEN, "job", "w0", "node", timeout_s=1.5)
    model = nn.Linear(2, 1)
    optimizer = paddle.optimizer.SGD(learning_rate=0.1, parameters=model.parameters())
    started = time.monotonic()
    with (
        pytest.raises(CoordinatorUnreachable),
        session(model, optimizer, [np.zeros(2, dtype="float32")], KeepGlobalBatch(1), contract),
    ):
        pass
    assert time.monotonic() - started < 15


def test_scale_batch_refuses_a_scheduler_and_compensates_momentum() -> None:
    model = nn.Linear(2, 1)
    scheduler = paddle.optimizer.lr.StepDecay(learning_rate=0.1, step_size=10)
    scheduled = paddle.optimizer.Momentum(learning_rate=scheduler, parameters=model.parameters())
    with pytest.raises(TypeError, match="float learning_rate"):
        ScaleBatch(4, 0.1).adjusting(scheduled, 2)
    with pytest.raises(ValueError, match="per_worker"):
        ScaleBatch(0, 0.1)

    optimizer = paddle.optimizer.Momentum(
        learning_rate=0.1, momentum=0.9, parameters=model.parameters()
    )
    policy = ScaleBatch(4, 0.1, base_workers=1)
    policy.adjusting(optimizer, 1)
    model(paddle.ones([3, 2])).mean().backward()
    optimizer.step()
    optimizer.clear_grad()
    before = {
        name: float(v.numpy().sum()) for name, v in optimizer._accumulators["velocity"].items()
    }
    policy.adjusting(optimizer, 2)  # the rate doubles: velocities halve
    assert optimizer.get_lr() == pytest.approx(0.2)
    for name, velocity in optimizer._accumulators["velocity"].items():
        assert float(velocity.numpy().sum()) == pytest.approx(before[name] / 2)


def test_the_adaptive_batch_sets_a_paddle_rate_and_compensates_momentum() -> None:
    """The same policy object as PyTorch's (`trainer_runtime.adaptive`), through Paddle's
    hooks: a decision's rate factor is set on the optimizer and its velocities are
    rescaled; a scheduler-owned rate is refused with the fix named."""
    model = nn.Linear(2, 1)
    scheduler = paddle.optimizer.lr.StepDecay(learning_rate=0.1, step_size=10)
    scheduled = paddle.optimizer.Momentum(learning_rate=scheduler, parameters=model.parameters())
    policy = AdaptiveBatch(initial_batch=8, max_batch=64, max_local=8, base_lr=0.1)
    with pytest.raises(TypeError, match="float learning_rate"):
        policy.adjusting(scheduled, 2)
    optimizer = paddle.optimizer.Momentum(
        learning_rate=0.1, momentum=0.9, parameters=model.parameters()
    )
    policy.adjusting(optimizer, 2)
    assert optimizer.get_lr() == pytest.approx(0.1) and policy.accumulation(2) == 1
    model(paddle.ones([3, 2])).mean().backward()
    optimizer.step()
    optimizer.clear_grad()
    before = {
        name: float(v.numpy().sum()) for name, v in optimizer._accumulators["velocity"].items()
    }
    policy.adopting_decision(Decision(8, 2, 2.5))  # 8 x 2 micro-batches on each of 2 ranks
    policy._workers = 2
    assert policy.global_batch(2) == 32 and policy.accumulation(2) == 2
    policy.adjusting(optimizer, 2)
    assert optimizer.get_lr() == pytest.approx(0.25)
    for name, velocity in optimizer._accumulators["velocity"].items():
        assert float(velocity.numpy().sum()) == pytest.approx(before[name] / 2.5)


@pytest.mark.slow
def test_a_changing_batch_keeps_the_ledger_exact_through_join_kill_and_restart(
    cluster: Cluster,
) -> None:
    """The PyTorch test of the same name, on Paddle: global batches 6, 20, 9, 14 in turn
    (at every formation and every few steps), 1 to 4 micro-batches; a join, a SIGKILL and a
    coordinator restart among the changes; every sample trained once per epoch."""
    samples, epochs = 1200, 2
    cluster.starting_coordinator(*all_at_once(samples, epochs))
    out = cluster.root / "out"
    args = job_args("ledger", samples, out, batch=8, sleep_s=0.05)
    survivors = changing_batch(cluster, args, coordinator_args(samples, epochs), STARTUP_S)
    expected = np.full(samples, float(epochs))
    for name in survivors:
        np.testing.assert_array_equal(np.load(out / f"{name}.npz")["counts"], expected)
    windows = set(json.loads((out / f"{survivors[0]}.json").read_text())["windows"])
    full = windows & cycle_windows()  # (an epoch's short last window aside)
    assert len(full) >= 3, windows  # the batch did change, at and between resizes
