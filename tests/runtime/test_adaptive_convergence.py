"""The adaptive batch trains as well as a fixed batch, and its rate is AdaScale's gain of
what the job really measured (real processes, gloo on CPU).

Aspects:
- a small classifier (`adaptive_job.py`: 8 classes, 30% label noise) trained with the
  adaptive batch through the resize schedule 1 -> 3 -> 2 workers reaches the validation
  loss of the fixed-batch run (same data, 2 epochs) within 2%, where its AdaScale progress
  reaches the fixed run's steps; and the adaptive run really changed its batch
  (otherwise this proves nothing);
- at that decision the rate factor adopted is `gain(init, sqr, var, B)` of the cautious
  estimate the decision came from (to float32's rounding: the decision travels in the
  step's float32 vote), and it matches the gain computed offline, from per-sample
  gradients over the whole training set, of the model saved at the decision (tolerances
  at the assertions).

Bounded: every wait has a timeout; no assertion on time.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.func import functional_call, grad, vmap

from edl_gradients.goodput import gain
from trainer_runtime.adaptive import MIN_NOISE_STEPS
from trainer_runtime.sharding import DatasetPlan, Walk

from .adaptive_job import MOMENTUM, classifier, problem, validation_loss
from .harness import Cluster, waiting_for

JOB = str(Path(__file__).with_name("adaptive_job.py"))
SAMPLES, EPOCHS, SHARD, SEED = 16384, 2, 256, 0
#: The adaptive job may train past the fixed run's epochs: it is compared where its
#: AdaScale progress reaches the fixed run's steps (a larger batch's sample is worth less).
ADAPTIVE_EPOCHS, EVAL_EVERY = 3, 1024
BATCH, LR, MAX_BATCH = 8, 0.02, 512


def events(trace: Path) -> list[dict[str, Any]]:
    if not trace.exists():
        return []
    lines = trace.read_text().splitlines()
    return [json.loads(line) for line in lines if line.endswith("}")]


def fixed_batch_run() -> tuple[float, int]:
    """The fixed-batch run, in this process: the job's sample sequence at `BATCH` (what
    `KeepGlobalBatch` trains through any resize, `test_torch_elastic.py`) for `EPOCHS`;
    its validation loss and its steps."""
    data = problem(SAMPLES, SEED)
    model = classifier(SEED)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    plan = DatasetPlan(SAMPLES, SHARD, EPOCHS, SEED)
    walk = Walk(plan, 0, 0, plan.epoch_order(0))
    inputs, targets = data.train.tensors
    steps = 0
    while (window := walk.next_window(BATCH)) is not None:
        steps += 1
        index = torch.cat([torch.arange(r.start, r.stop) for r in window.ranges])
        loss = nn.functional.cross_entropy(model(inputs[index]), targets[index])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return validation_loss(model, data), steps


def informed(decision: dict[str, Any]) -> bool:
    """A decision made from a usable noise estimate (`adaptive.MIN_NOISE_STEPS`)."""
    used = decision.get("decided_with")
    return used is not None and used["steps"] >= MIN_NOISE_STEPS


def loaded(path: Path) -> nn.Module:
    model = classifier(SEED)
    model.load_state_dict(torch.load(path))
    return model


def offline_statistics(state: dict[str, torch.Tensor]) -> tuple[float, float]:
    """|G|^2 and sigma^2 (the trace of one sample's gradient covariance) of the model in
    `state`, over every training sample, from per-sample gradients."""
    data = problem(SAMPLES, SEED)
    model = classifier(SEED)
    model.load_state_dict(state)
    params = {k: v.detach() for k, v in model.named_parameters()}

    def loss(p: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        out = functional_call(model, p, (x.unsqueeze(0),))
        return nn.functional.cross_entropy(out, y.unsqueeze(0))

    inputs, targets = data.train.tensors
    grads = vmap(grad(loss), in_dims=(None, 0, 0))(params, inputs, targets)
    flat = torch.cat([g.reshape(SAMPLES, -1) for g in grads.values()], dim=1).double()
    mean = flat.mean(dim=0)
    sigma2 = float(((flat - mean) ** 2).sum(dim=1).mean())
    return float(mean @ mean), sigma2


@pytest.mark.slow
def test_adaptive_batch_converges_as_the_fixed_one_through_resizes(cluster: Cluster) -> None:
    cluster.starting_coordinator(
        "--samples", str(SAMPLES), "--shard-size", str(SHARD), "--epochs", str(ADAPTIVE_EPOCHS),
        "--seed", str(SEED), "--join-window-s", "5", "--lease-timeout-s", "15",
    )  # fmt: skip
    out, go = cluster.root / "out", cluster.root / "go"
    trace = out / "trace"
    argv = [
        JOB, "--kind", "mlp", "--samples", str(SAMPLES), "--global-batch", str(BATCH),
        "--out", str(out), "--policy", "adaptive", "--lr", str(LR), "--max-batch",
        str(MAX_BATCH), "--seed", str(SEED), "--eval-every", str(EVAL_EVERY), "--save-decisions",
    ]  # fmt: skip
    client = cluster.client()
    client.set_target(1)  # w0 starts alone; later, w1 and w2 join in one generation
    cluster.starting_worker("w0", argv)
    for name in ("w1", "w2"):  # held until `go`: their start-up costs w0 nothing
        cluster.starting_worker(name, [*argv, "--start-file", str(go)])
    waiting_for(lambda: bool(events(trace)), 60, "w0's first step")
    client.set_target(3)
    go.touch()  # 1 -> 3

    def informed_at_three() -> bool:
        return any(e["world"] == 3 and informed(e) for e in events(trace))

    waiting_for(informed_at_three, 60, "an informed decision at three workers")
    client.drain("w2")  # 3 -> 2
    for name in ("w0", "w1", "w2"):
        assert cluster.waiting_exit(name, 90) == 0, cluster.log(name)[-3000:]
    decisions = [e for e in events(trace) if e["event"] == "decision"]
    assert [e["world"] for e in decisions][:2] == [1, 3] and decisions[-1]["world"] == 2
    initial = {e["world"]: e["global_batch"] for e in decisions if not informed(e)}
    changed = [
        e for e in decisions if informed(e) and e["global_batch"] > initial.get(e["world"], BATCH)
    ]
    assert changed, decisions  # the adaptive run really changed its batch

    fixed, fixed_steps = fixed_batch_run()
    evaluations = [e for e in events(trace) if e["event"] == "eval"]
    at_par = next(e for e in evaluations if e["progress"] >= fixed_steps)
    assert at_par["samples"] < SAMPLES * ADAPTIVE_EPOCHS  # reached before the job's end
    adaptive = at_par["val_loss"]
    assert adaptive <= 1.02 * fixed, (adaptive, fixed, at_par, decisions)  # reached, to 2%

    saved = [torch.load(path) for path in sorted(out.glob("decision-*.pt"))]
    at = next(s for s in saved if informed(s["decision"]) and s["decision"]["lr_factor"] > 1)
    decision, used = at["decision"], at["decision"]["decided_with"]
    cautious = used["grad_sqr"] + used["sqr_error"]  # what the policy decides by (`usable`)
    expected = gain(used["init_batch"], cautious, used["grad_var"], decision["global_batch"])
    assert decision["lr_factor"] == pytest.approx(expected, rel=1e-6)
    sqr, sigma2 = offline_statistics(at["model"])
    # The variance hardly moves as training goes (label noise): the estimate is within a
    # quarter of the offline value. |G|^2 falls as the model learns, and the estimate is a
    # moving average over the way there, made cautious by a standard error (`usable`): so
    # the gain the job took is compared, within a fifth, with the offline gain at the
    # decision's model (measured: 4-6% below it).
    assert used["grad_var"] * used["init_batch"] == pytest.approx(sigma2, rel=0.25)
    offline = gain(used["init_batch"], sqr, sigma2 / used["init_batch"], decision["global_batch"])
    assert decision["lr_factor"] == pytest.approx(offline, rel=0.2), (decision, sqr, sigma2)
