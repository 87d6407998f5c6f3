"""Batch adaptation of Pollux-workload jobs (``simulations.profiles``): an adapting job
picks the batch of the most progress per second among those it could run, gradient
accumulation included, so at no placement is it slower than the batch it was submitted
with, and across nodes it takes batches above the largest local batch where the network's
sync makes small steps dear."""

from __future__ import annotations

import csv

from simulations.profiles import ProfileSpeed, load_application
from simulations.traces import default_traces

POLLUX = default_traces() / "pollux"
PROFILES = POLLUX / "traces"
PLACEMENTS = ((1,), (2,), (4,), (1, 1), (2, 2), (1, 3), (4, 4), (4, 4, 4, 4))


def _submitted() -> set[tuple[str, int]]:
    """Every (application, global batch) submitted in the eight 1.0x workloads."""
    out = set()
    for path in sorted((POLLUX / "workloads").glob("workload-*.csv")):
        with path.open(newline="") as handle:
            out |= {(r["application"], int(r["batch_size"])) for r in csv.DictReader(handle)}
    return out


def test_adapting_is_never_slower_than_the_submitted_batch() -> None:
    submitted = _submitted()
    assert {name for name, _ in submitted} >= {"bert", "yolov3", "cifar10", "imagenet"}
    for name, batch in sorted(submitted):
        app = load_application(PROFILES, name)
        fixed, adaptive = ProfileSpeed(app, batch), ProfileSpeed(app, batch, True)
        for placement in PLACEMENTS:
            for epoch_start in (0.0, app.target / 2):
                assert adaptive.rate(placement, epoch_start) >= fixed.rate(
                    placement, epoch_start
                ), (name, batch, placement, epoch_start)


def test_across_nodes_an_adapting_job_accumulates() -> None:
    """bert's sync across nodes costs more than a step's compute: on two nodes it trains
    at a global batch above what its largest local batch gives without accumulation."""
    bert = load_application(PROFILES, "bert")
    adaptive = ProfileSpeed(bert, 0, True)
    _, batch = adaptive.measured((4, 4), 0.0)
    assert batch > bert.max_local * 8
    # On one GPU there is no sync to amortize: it keeps a batch a single step holds.
    _, single = adaptive.measured((1,), 0.0)
    assert single <= bert.max_local


def test_an_adapting_job_reports_the_bounds_it_adapts_within() -> None:
    """The planner predicts an adapting job's sizes at the batch it would choose there
    (``throughput.BatchedSteps``) from the bounds its efficiency reports; a job at a fixed
    batch reports none, and the planner keeps its fixed-batch model."""
    yolo = load_application(PROFILES, "yolov3")
    adapting = ProfileSpeed(yolo, 0, True).efficiency((4,), 0.0)
    assert adapting.limits() == yolo.limits
    assert ProfileSpeed(yolo, yolo.init_batch).efficiency((4,), 0.0).limits() is None
