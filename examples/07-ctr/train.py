"""A wide-and-deep click-through-rate model in parameter-server mode, on synthetic clicks.

What: PaddlePaddle trains a wide-and-deep model (Cheng et al., 2016) on click logs made here,
from a seed, with no download. Each sample has `FIELDS` categorical fields (an ad, a user,
a site...) whose values are hashed into one id space of `--vocabulary` ids, and `DENSE`
dense features. The wide part is a weight per hashed id (an embedding table of width 1)
plus a linear term of the dense features; the deep part looks every id up in a second
table (`--width` columns), then runs an MLP over those vectors and the dense features. The
two tables are row-sparse parameter-server tables: a step pulls and pushes only the rows
its batch touches; the MLP and the linear term are dense.

Why synthetic: the clicks come from a hidden "true" model (a weight per field value, a
pairwise interaction of two fields, dense weights, a bias that makes about one sample in
four a click), so the job can learn something real and the held-out AUC and log loss
show how much: the true model's own AUC is the ceiling, a constant predictor's (AUC 0.5,
the log loss of the base rate) the floor.

How it runs: as a worker of a `strategy: ps` job (see docs/runtime.md, "Parameter-server
mode"): it reads the environment contract (EDL_COORDINATOR, EDL_JOB_TOKEN, EDL_JOB_ID,
EDL_WORKER_ID) and the snapshot directory EDL_PS_SNAPSHOTS that the servers share; the
optimizer (SGD with momentum, lazy on the tables' rows) runs on the servers. The dataset
has `--samples` samples, which must equal the coordinator's `--samples`; the number of
epochs and the shard size are the coordinator's (`edl.dev/coordinator-args`), not this
script's. `EDL_PS_CONSISTENCY=async` (with `EDL_PS_STALENESS=2`) switches to bounded
staleness. Rank 0 prints `step S world W loss L`; every worker ends with one line,
`wK: done, N steps, auc A (true model T), log loss L (constant C)`.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import numpy.typing as npt
import paddle
from paddle import nn

from trainer_runtime.paddle.ps import Consistency, PsConfig, ps_session

FIELDS = 8  # categorical fields per sample
DENSE = 4  # dense features per sample
CLICK_RATE_BIAS = -1.6  # the true model's bias: about one sample in four is a click
Floats = npt.NDArray[np.float32]
Ids = npt.NDArray[np.int64]


@dataclass(frozen=True)
class Clicks:
    """Samples: hashed ids (n x FIELDS), dense features (n x DENSE), clicks (0/1) and the
    true model's click logits."""

    ids: Ids
    dense: Floats
    clicks: Floats
    truth: Floats


class TrueModel:
    """The hidden model the clicks come from (drawn from `seed`, never seen by the job)."""

    def __init__(self, seed: int, cardinality: int, vocabulary: int) -> None:
        rng = np.random.default_rng([seed, 0])
        self.cardinality, self.vocabulary = cardinality, vocabulary
        self.weights = rng.normal(0.0, 0.6, (FIELDS, cardinality))
        self.factors = rng.normal(0.0, 0.5, (2, cardinality, 4))  # fields 0 and 1 interact
        self.dense = rng.normal(0.0, 0.5, DENSE)
        popularity = 1.0 / np.arange(1, cardinality + 1) ** 1.1  # few values are common
        self.popularity = popularity / popularity.sum()

    def hashed(self, values: Ids) -> Ids:
        """Each field's raw values hashed into one id space of `vocabulary` ids (the hashing
        trick: distinct values may share an id)."""
        keyed = np.arange(FIELDS, dtype=np.int64) * self.cardinality + values
        mixed = (keyed * 2654435761 + 0x7F4A7C15) % (1 << 32)
        return mixed % self.vocabulary

    def sampling(self, samples: int, stream: int, seed: int) -> Clicks:
        rng = np.random.default_rng([seed, stream])
        values = rng.choice(self.cardinality, size=(samples, FIELDS), p=self.popularity)
        dense = rng.standard_normal((samples, DENSE))
        logits = CLICK_RATE_BIAS + self.weights[np.arange(FIELDS), values].sum(axis=1)
        pair = self.factors[0, values[:, 0]] * self.factors[1, values[:, 1]]
        logits = logits + pair.sum(axis=1) + dense @ self.dense
        clicks = rng.random(samples) < 1.0 / (1.0 + np.exp(-logits))
        return Clicks(
            self.hashed(values),
            dense.astype(np.float32),
            clicks.astype(np.float32),
            logits.astype(np.float32),
        )


class WideAndDeep(nn.Layer):
    """Wide (a weight per id, a linear term of the dense features) plus deep (an MLP over
    each field's embedding and the dense features): the click logit is their sum."""

    def __init__(self, vocabulary: int, width: int, hidden: int) -> None:
        super().__init__()
        zero = paddle.ParamAttr(initializer=nn.initializer.Constant(0.0))
        self.wide = nn.Embedding(vocabulary, 1, weight_attr=zero)  # a weight per id
        self.wide_dense = nn.Linear(DENSE, 1)
        normal = paddle.ParamAttr(initializer=nn.initializer.Normal(0.0, 0.05))
        self.embedding = nn.Embedding(vocabulary, width, weight_attr=normal)
        self.deep = nn.Sequential(
            nn.Linear(FIELDS * width + DENSE, hidden),
            nn.ReLU(),
            nn.Linear(hidden, hidden),
            nn.ReLU(),
            nn.Linear(hidden, 1),
        )

    def forward(self, ids: paddle.Tensor, dense: paddle.Tensor) -> paddle.Tensor:
        """The click logit of each sample."""
        wide = self.wide(ids).sum(axis=[1, 2]) + self.wide_dense(dense).reshape([-1])
        looked = self.embedding(ids).reshape([ids.shape[0], -1])
        deep = self.deep(paddle.concat([looked, dense], axis=1)).reshape([-1])
        logits: paddle.Tensor = wide + deep
        return logits


def auc(scores: npt.NDArray[np.floating], labels: npt.NDArray[np.floating]) -> float:
    """The area under the ROC curve: the chance that a click scores above a non-click (ties
    count half, so a constant scores 0.5)."""
    order = np.argsort(scores, kind="mergesort")
    ranked = scores[order]
    _, first, counts = np.unique(ranked, return_index=True, return_counts=True)
    ranks = np.empty(len(scores))
    ranks[order] = np.repeat(first + (counts + 1) / 2.0, counts)  # tied scores share a rank
    clicked = labels > 0.5
    positives, negatives = int(clicked.sum()), int((~clicked).sum())
    if not positives or not negatives:
        raise ValueError("the AUC needs clicks and non-clicks: raise --eval-samples")
    return float((ranks[clicked].sum() - positives * (positives + 1) / 2) / positives / negatives)


def log_loss(logits: npt.NDArray[np.floating], labels: npt.NDArray[np.floating]) -> float:
    """The mean binary cross-entropy of click logits."""
    logits = logits.astype(np.float64)
    return float(np.mean(np.logaddexp(0.0, logits) - labels * logits))


def scoring(model: WideAndDeep, data: Clicks) -> tuple[float, float]:
    """The model's AUC and log loss on `data`."""
    with paddle.no_grad():
        logits = model(paddle.to_tensor(data.ids), paddle.to_tensor(data.dense)).numpy()
    return auc(logits, data.clicks), log_loss(logits, data.clicks)


def positive(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {value}")
    return value


def parsing(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add = parser.add_argument
    add("--samples", type=positive, default=65536,
        help="training samples: must equal the coordinator's --samples")  # fmt: skip
    add("--vocabulary", type=positive, default=20000, help="hashed ids (rows of each table)")
    add("--cardinality", type=positive, default=2000, help="distinct raw values per field")
    add("--width", type=positive, default=8, help="the deep part's embedding width")
    add("--hidden", type=positive, default=32, help="the MLP's hidden units")
    add("--global-batch", type=positive, default=256, help="samples per step, all workers")
    add("--lr", type=float, default=0.3, help="the servers' learning rate")
    add("--momentum", type=float, default=0.9, help="the servers' momentum")
    add("--eval-samples", type=positive, default=4096, help="held-out samples scored at the end")
    add("--seed", type=int, default=0, help="draws the true model and the data")
    add("--snapshot-every", type=positive, default=10, help="steps between server snapshots")
    add("--print-every", type=positive, default=50, help="steps between rank 0's progress lines")
    add("--epochs", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.epochs is not None:
        parser.error(
            "--epochs is the coordinator's: give it in the coordinator's arguments "
            "(edl.dev/coordinator-args, or `python -m trainer_runtime.coordinator --epochs N`)"
        )
    if args.vocabulary < FIELDS:
        parser.error(f"--vocabulary must be at least {FIELDS} (one id per field), got "
                     f"{args.vocabulary}")  # fmt: skip
    return args


def snapshot_dir() -> str:
    found = os.environ.get("EDL_PS_SNAPSHOTS")
    if not found:
        sys.exit(
            "EDL_PS_SNAPSHOTS is not set: set it to a directory every server and worker "
            "of the job shares (on Kubernetes the controller sets it from the annotation "
            "edl.dev/ps-snapshots)"
        )
    return found


def main(argv: Sequence[str] | None = None) -> None:
    args = parsing(argv)
    directory = snapshot_dir()
    paddle.device.set_device("cpu")  # the PS worker moves CPU tensors
    paddle.seed(args.seed)
    truth = TrueModel(args.seed, args.cardinality, args.vocabulary)
    train = truth.sampling(args.samples, 1, args.seed)
    held_out = truth.sampling(args.eval_samples, 2, args.seed)  # another stream, same truth
    tensors = [paddle.to_tensor(a) for a in (train.ids, train.dense, train.clicks)]
    dataset = cast("Sequence[Any]", paddle.io.TensorDataset(tensors))  # batches: slices
    model = WideAndDeep(args.vocabulary, args.width, args.hidden)
    config = PsConfig(
        global_batch=args.global_batch,
        lr=args.lr,
        momentum=args.momentum,
        snapshot_dir=directory,
        consistency=Consistency(os.environ.get("EDL_PS_CONSISTENCY", "sync")),
        staleness=int(os.environ.get("EDL_PS_STALENESS", "0")),
        snapshot_every=args.snapshot_every,
    )
    ids_of_batch = lambda batch: batch[0]  # noqa: E731 - the ids every table looks up
    sparse = {"wide.weight": ids_of_batch, "embedding.weight": ids_of_batch}
    losses: list[float] = []
    with ps_session(model, dataset, config, sparse=sparse) as s:
        for ids, dense, clicks in s.batches():
            loss = nn.functional.binary_cross_entropy_with_logits(model(ids, dense), clicks)
            s.step(loss)
            losses.append(float(loss))
            done = s.step_count + 1  # this worker's steps, this one included
            if s.leader and done % args.print_every == 0:
                world = s.place.world if s.place else 0
                recent = np.mean(losses[-args.print_every :])
                print(f"step {done} world {world} loss {recent:.4f}", flush=True)
    score, loss_held_out = scoring(model, held_out)
    rate = float(train.clicks.mean())
    constant = log_loss(np.full(len(held_out.clicks), np.log(rate / (1 - rate))), held_out.clicks)
    print(
        f"{os.environ['EDL_WORKER_ID']}: done, {s.step_count} steps, auc {score:.3f} "
        f"(true model {auc(held_out.truth, held_out.clicks):.3f}), log loss "
        f"{loss_held_out:.4f} (constant {constant:.4f})",
        flush=True,
    )


if __name__ == "__main__":
    main()
