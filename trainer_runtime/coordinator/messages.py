"""The coordinator API's messages, made from the state's values and read into them.

Why a module of its own: the server (``serving.py``) is the executor of calls; what a reply
holds, and what a request is read as, is a translation with no decision in it, kept apart
so that each stays small. A request that cannot be read into the state's values (a
malformed report) is refused here with ``ReportError``, before the state sees it.
"""

from __future__ import annotations

from typing import Any

from trainer_runtime.coordinator.ledger import Ledger
from trainer_runtime.coordinator.membership import WorkerPhase
from trainer_runtime.coordinator.records import BatchRecord, NoiseRecord
from trainer_runtime.coordinator.recovering import ReportError, TrainedRange
from trainer_runtime.coordinator.state import CoordinatorState, Rejoin
from trainer_runtime.protocol import pb
from trainer_runtime.sharding import SampleRange, StepWindow

PHASE_STATUS = {
    WorkerPhase.MEMBER: pb.MEMBER,
    WorkerPhase.DRAINED: pb.DRAINED,
    WorkerPhase.FENCED: pb.FENCED,
    WorkerPhase.PENDING: pb.PENDING,
}


def member_messages(rows: tuple[tuple[str, int, str, str], ...]) -> list[Any]:
    return [pb.Member(worker_id=w, rank=r, node=n, store_address=a) for w, r, n, a in rows]


def windows_from(messages: Any) -> list[StepWindow]:
    return [
        StepWindow(m.step, m.epoch, tuple(SampleRange(r.start, r.stop) for r in m.ranges))
        for m in messages
    ]


def rejoin_from(request: Any) -> Rejoin | None:
    """What a worker registering again reports, or None for a first registration."""
    if not request.previous_incarnation:
        if request.trained or request.last_generation or request.last_lease_id:
            raise ReportError("a report of what was trained needs previous_incarnation")
        return None
    try:
        trained = tuple(
            TrainedRange(int(m.epoch), SampleRange(int(m.range.start), int(m.range.stop)))
            for m in request.trained
        )
    except ValueError as error:  # a range with start >= stop, or a negative start
        raise ReportError(f"a trained range is malformed: {error}") from None
    return Rejoin(
        request.previous_incarnation,
        int(request.last_generation),
        trained,
        int(request.last_lease_id),
    )


def noise_from(request: Any) -> NoiseRecord | None:
    """The gradient statistics a commit carries, if it carries any."""
    if not request.HasField("noise"):
        return None
    m = request.noise
    return NoiseRecord(int(m.init_batch), float(m.grad_sqr), float(m.grad_var), int(m.steps))


def batch_from(request: Any) -> BatchRecord | None:
    """What rank 0 runs at, as a commit reports it, if it does."""
    if not request.HasField("batch"):
        return None
    m = request.batch
    bounds = (int(m.max_batch), int(m.max_local), int(m.min_local))
    return BatchRecord(int(m.global_batch), int(m.accumulation), float(m.goodput), *bounds)


def ledger_message(ledger: Ledger) -> Any:
    return pb.LedgerView(
        epoch=ledger.epoch,
        committed_step=ledger.committed_step,
        todo=[pb.SampleRange(start=r.start, stop=r.stop) for r in ledger.todo],
        finished=ledger.finished,
        samples=ledger.plan.samples,
        shard_size=ledger.plan.shard_size,
        epochs=ledger.plan.epochs,
        seed=ledger.plan.seed,
    )


def progress_message(state: CoordinatorState) -> Any:
    """What ``GetProgress`` answers: the job's progress, members and measurements."""
    view = state.viewing_generation("")
    return pb.Progress(
        generation=state.membership.generation,
        epoch=state.ledger.epoch,
        epochs=state.ledger.plan.epochs,
        committed_step=state.ledger.committed_step,
        samples_done=state.ledger.samples_done,
        samples_per_epoch=state.ledger.plan.samples,
        finished=state.ledger.finished,
        members=member_messages(view.members),
        servers=member_messages(view.servers),
        draining=sorted(state.membership.drained),
        throughput=[
            pb.Throughput(
                nodes=t.nodes,
                workers=t.workers,
                samples_per_s=t.samples_per_s,
                step_time_s=t.step_time_s,
                steps=t.steps,
                batch=t.batch,
            )
            for t in state.throughput.values()
        ],
        noise=None
        if state.noise is None
        else pb.GradientNoise(
            init_batch=state.noise.init_batch,
            grad_sqr=state.noise.grad_sqr,
            grad_var=state.noise.grad_var,
            steps=state.noise.steps,
        ),
        batch=None
        if state.batch is None
        else pb.BatchInUse(
            global_batch=state.batch.global_batch,
            accumulation=state.batch.accumulation,
            goodput=state.batch.goodput,
            max_batch=state.batch.max_batch,
            max_local=state.batch.max_local,
            min_local=state.batch.min_local,
        ),
    )
