"""The batch a job runs at, from the runtime's progress to the status and the planner.

Aspects:
- the controller's coordinator port reads each size's batch (`Throughput.batch`) and what
  rank 0 runs at (`Progress.batch`); the status it writes carries them (`throughput[].batch`,
  `status.batch`), and observing that status gives the planner's samples their batch, so
  that its model of the job is the goodput-weighted one;
- the local backend does the same from the raw progress message, into its status and the
  Job its planner is given;
- a progress without them leaves the status without them (batch 0, no block).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from edl_scheduler.api import BatchInUse, TrainingJobStatus, load_training_job
from edl_scheduler.controller.deciding import decide
from edl_scheduler.controller.intents import PatchStatus
from edl_scheduler.controller.observing import observe
from edl_scheduler.core import Job, ThroughputSample
from edl_scheduler.core.building import job_from_training_job, remaining_from_status
from edl_scheduler.core.snapshot import Efficiency
from edl_scheduler.core.throughput import fit, goodput, job_model
from edl_scheduler.local.statusing import planned_efficiency, progress_fields
from trainer_runtime.protocol import pb

from .test_deciding import CONFIG, NOW, coordinator, job_body, names, of, pod, view
from .test_observing import k8s_node
from .test_observing_efficiency import ReplyingCoordinator

NOISE = pb.GradientNoise(init_batch=64, grad_sqr=1.0, grad_var=4.0, steps=50)
EFFICIENCY = Efficiency(64, 1.0, 4.0)


def progress_message(batched: bool = True) -> Any:
    """Two sizes, the larger measured at four times the batch, and the batch in use."""
    return pb.Progress(
        generation=3,
        epoch=1,
        epochs=2,
        committed_step=40,
        members=[pb.Member(worker_id="a")],
        throughput=[
            pb.Throughput(nodes=1, workers=1, samples_per_s=100.0, step_time_s=0.64, steps=9,
                          batch=64 if batched else 0),
            pb.Throughput(nodes=1, workers=2, samples_per_s=180.0, step_time_s=1.42, steps=9,
                          batch=256 if batched else 0),
        ],
        noise=NOISE,
        batch=pb.BatchInUse(global_batch=256, accumulation=2, goodput=170.5) if batched else None,
    )  # fmt: skip


def weighed(samples: tuple[ThroughputSample, ...]) -> tuple[ThroughputSample, ...]:
    return tuple(goodput(s, EFFICIENCY) for s in samples)


def assert_planned_by_goodput(job: Job) -> None:
    assert [(s.workers, s.batch) for s in job.throughput] == [(1, 64), (2, 256)]
    assert job.efficiency == EFFICIENCY
    assert job_model(job) == fit(weighed(job.throughput))
    assert job_model(job).speedup(1, 2) < fit(job.throughput).speedup(1, 2)  # weighed down


def controller_status(message: Any) -> dict[str, Any]:
    """The status the controller writes for a running job whose coordinator answered."""
    progress = ReplyingCoordinator(message).progress()
    body = job_body(phase="Running")
    pods = [pod("a"), coordinator()]
    out = decide({"ns/j": view(body, pods, progress=progress)}, None, CONFIG, NOW, names())
    status: dict[str, Any] = of(PatchStatus, out.intents)[0].status
    return status


def test_the_controller_writes_the_batches_and_plans_by_them() -> None:
    status = controller_status(progress_message())
    assert [(t["workers"], t.get("batch")) for t in status["throughput"]] == [(1, 64), (2, 256)]
    assert status["batch"] == {"globalBatch": 256, "accumulation": 2, "goodput": 170.5}
    body = job_body(**status)
    assert load_training_job(body).status.batch == BatchInUse(
        global_batch=256, accumulation=2, goodput=170.5
    )
    (job,) = observe([k8s_node("n0")], [], [body], {}).snapshot.jobs
    assert_planned_by_goodput(job)


def test_a_progress_without_batches_writes_none() -> None:
    status = controller_status(progress_message(batched=False))
    assert all("batch" not in t for t in status["throughput"])
    assert "batch" not in status
    (job,) = observe([k8s_node("n0")], [], [job_body(**status)], {}).snapshot.jobs
    assert [s.batch for s in job.throughput] == [0, 0]
    assert job_model(job) == fit(job.throughput)  # nothing to weigh: the throughput model


def test_the_local_backend_takes_them_from_the_progress_message() -> None:
    status = TrainingJobStatus().model_copy(update=progress_fields(progress_message()))
    assert [t.batch for t in status.throughput] == [64, 256]
    assert status.batch == BatchInUse(global_batch=256, accumulation=2, goodput=170.5)
    tj = load_training_job(job_body()).model_copy(update={"status": status})
    job = replace(job_from_training_job(tj, 0, (), None), efficiency=planned_efficiency(status))
    assert_planned_by_goodput(job)
    bare = progress_fields(progress_message(batched=False))
    assert "batch" not in bare
    assert [t.batch for t in bare["throughput"]] == [0, 0]


def adapting_message(max_local: int = 128, min_local: int = 1) -> Any:
    """``progress_message`` from a job whose batch adapts: the bounds ride with the batch."""
    message = progress_message()
    message.batch.max_batch, message.batch.max_local = 4096, max_local
    message.batch.min_local = min_local
    return message


def test_an_adapting_jobs_bounds_reach_the_planner_both_ways() -> None:
    """Controller and local backend alike: the status carries the bounds, the planner's
    efficiency holds them, and its model predicts each size at the batch the job would
    choose there (``throughput.BatchedSteps``)."""
    status = controller_status(adapting_message())
    assert status["batch"] == {
        "globalBatch": 256,
        "accumulation": 2,
        "goodput": 170.5,
        "maxBatch": 4096,
        "maxLocal": 128,
        "minLocal": 1,
    }
    (job,) = observe([k8s_node("n0")], [], [job_body(**status)], {}).snapshot.jobs
    bounded = Efficiency(64, 1.0, 4.0, 4096, 128, 1)
    assert job.efficiency == bounded
    assert job_model(job).batched is not None
    local = TrainingJobStatus().model_copy(update=progress_fields(adapting_message()))
    assert planned_efficiency(local) == bounded


def test_bounds_that_cannot_be_right_leave_the_batch_as_measured(caplog: Any) -> None:
    """min_local above max_local: planned on the efficiency without bounds, with a warning
    naming the field; the status keeps what was reported."""
    status = controller_status(adapting_message(max_local=8, min_local=16))
    assert status["batch"]["minLocal"] == 16
    with caplog.at_level("WARNING"):
        (job,) = observe([k8s_node("n0")], [], [job_body(**status)], {}).snapshot.jobs
    assert job.efficiency == EFFICIENCY
    assert "min_local" in caplog.text and "status.batch's bounds left out" in caplog.text
    assert_planned_by_goodput(job)


def test_the_samples_left_reach_the_planner_both_ways() -> None:
    """Controller and local backend alike: the ledger's epochs, samples per epoch and
    samples done, through the status, give the planner the samples the job has left."""
    message = progress_message()
    message.samples_per_epoch, message.samples_done = 1000, 1250  # epoch 1 of 2
    status = controller_status(message)
    assert status["progress"]["samplesDone"] == 1250
    (job,) = observe([k8s_node("n0")], [], [job_body(**status)], {}).snapshot.jobs
    assert job.remaining_samples == 750.0
    local = TrainingJobStatus().model_copy(update=progress_fields(message))
    assert remaining_from_status(local) == 750.0
