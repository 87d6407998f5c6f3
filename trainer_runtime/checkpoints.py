"""Checkpoints that carry a data-parallel job's model across a suspension to zero workers,
for every framework: what is written, where, and which file wins; the adapters only turn
their model and optimizer into something to save (``trainer_runtime/torch/checkpointing.py``,
``trainer_runtime/paddle/checkpointing.py``).

The model lives only in the workers, and every generation starts from its rank 0's state.
When the planner preempts a job whole (or the user suspends it), every worker is drained
and the coordinator keeps only the ledger; the next workers are fresh processes. So the
rank 0 of the last generation, when it is drained, writes its state here (model,
optimizer, batch-policy state, the step it reached and the step windows it applied since
its generation formed), and a later rank 0 that has no state of its own (a fresh process)
loads it before the state broadcast. The windows let that rank 0's reconcile commit the
steps the coordinator had not yet committed when the drain fenced them, so the ledger ends
exactly at the checkpoint's step: nothing lost, nothing trained twice.

Where: the contract's `EDL_CHECKPOINT_DIR` (a directory every worker of the job reaches: a
shared volume on Kubernetes, a directory under the job's state directory locally).

What must stay true: a checkpoint file is complete or absent (written to a temporary file,
fsynced, renamed, the directory fsynced); the newest step wins (one file per step, older
ones removed after a newer one is in place), so two drained ranks 0 writing at once (a
job drained one worker at a time) never leave an older state in place of a newer one; a
checkpoint of another job is never loaded.
"""

from __future__ import annotations

import logging
import os
import pickle
import re
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from trainer_runtime.sharding import SampleRange, StepWindow

LOG = logging.getLogger(__name__)
NAME = re.compile(r"^step-(\d{12})\.pt$")  # (for every framework: one store, one name)
KEPT = 2  # the newest files kept: the newest, and one before it in case it is unreadable

#: Writes a payload (a dict of plain values and the framework's tensors) to a stream.
Dump = Callable[[dict[str, Any], IO[bytes]], None]
#: Reads a payload back from a file; raises OSError, RuntimeError, EOFError, ValueError or
#: pickle's UnpicklingError for one that is unreadable.
Load = Callable[[Path], dict[str, Any]]


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """Rank 0's state at a step boundary, and the windows it applied in its generation;
    ``model`` and ``optimizer`` are in the adapter's own form."""

    job_id: str
    step: int
    model: Any
    optimizer: Any
    policy: dict[str, Any]
    windows: tuple[StepWindow, ...]


def file_name(step: int) -> str:
    return f"step-{step:012d}.pt"


def saving(directory: Path, checkpoint: Checkpoint, dump: Dump) -> Path:
    """Write ``checkpoint`` atomically into ``directory`` with ``dump``; returns its path."""
    directory.mkdir(parents=True, exist_ok=True)
    payload = {
        "job_id": checkpoint.job_id,
        "step": checkpoint.step,
        "model": checkpoint.model,
        "optimizer": checkpoint.optimizer,
        "policy": checkpoint.policy,
        "windows": [
            [w.step, w.epoch, [[r.start, r.stop] for r in w.ranges]] for w in checkpoint.windows
        ],
    }
    target = directory / file_name(checkpoint.step)
    handle, temporary = tempfile.mkstemp(dir=directory, prefix=".writing-", suffix=".pt")
    try:
        with os.fdopen(handle, "wb") as stream:
            dump(payload, stream)
            stream.flush()
            os.fsync(stream.fileno())
        os.replace(temporary, target)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    syncing_directory(directory)
    pruning(directory)
    return target


def syncing_directory(directory: Path) -> None:
    descriptor = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def stored_steps(directory: Path) -> list[int]:
    """The steps of the checkpoint files in ``directory``, newest first."""
    if not directory.is_dir():
        return []
    found = (NAME.match(entry.name) for entry in directory.iterdir())
    return sorted((int(m.group(1)) for m in found if m), reverse=True)


def pruning(directory: Path) -> None:
    for step in stored_steps(directory)[KEPT:]:
        (directory / file_name(step)).unlink(missing_ok=True)


def loading(directory: Path, job_id: str, load: Load) -> Checkpoint | None:
    """The newest readable checkpoint of ``job_id`` in ``directory``, or None."""
    for step in stored_steps(directory):
        path = directory / file_name(step)
        try:
            payload = load(path)
        except (OSError, RuntimeError, EOFError, ValueError, pickle.UnpicklingError) as error:
            LOG.warning("skipping checkpoint %s: %s", path, error)  # removed, or damaged
            continue
        if payload.get("job_id") != job_id:
            LOG.warning("skipping checkpoint %s: it belongs to job %r", path, payload.get("job_id"))
            continue
        windows = tuple(
            StepWindow(int(s), int(e), tuple(SampleRange(a, b) for a, b in ranges))
            for s, e, ranges in payload["windows"]
        )
        return Checkpoint(
            job_id,
            int(payload["step"]),
            payload["model"],
            payload["optimizer"],
            payload["policy"],
            windows,
        )
    return None


class Keeper:
    """A data-parallel worker's side of a suspension, the same for every adapter: rank 0,
    drained, keeps the job's state (``keeping``); a fresh rank 0 takes the newest one
    (``found``). The adapter saves and loads with ``save`` and ``load`` (its framework's
    calls) and moves its model and optimizer in and out."""

    def __init__(
        self,
        job_id: str,
        directory: str | None,
        save: Callable[[Path, Checkpoint], Path],
        load: Callable[[Path, str], Checkpoint | None],
    ) -> None:
        self.job_id = job_id
        self.directory = Path(directory) if directory else None
        self.save = save
        self.load = load

    def keeping(self, step: int, state: Callable[[], tuple[Any, Any, dict[str, Any]]],
                windows: Iterable[StepWindow]) -> None:  # fmt: skip
        """Drained as rank 0 of a generation: keep the job's state (``state()``: model,
        optimizer and batch-policy states) for a later generation that may have no member
        left of this one (the job suspended or preempted whole). A drained rank 0 whose
        peers stay writes it too (harmless: their next rank 0 has state of its own and never
        reads it)."""
        if self.directory is None:
            LOG.warning(
                "rank 0 drained at step %d with no EDL_CHECKPOINT_DIR: if no member of the job "
                "is left, the next generation starts from the initial model and the ledger "
                "rolls back to step 0",
                step,
            )
            return
        model, optimizer, policy = state()
        checkpoint = Checkpoint(self.job_id, step, model, optimizer, policy, tuple(windows))
        path = self.save(self.directory, checkpoint)
        LOG.info("saved the job's state at step %d to %s", step, path)

    def found(self, committed: Callable[[], int]) -> Checkpoint | None:
        """A fresh rank 0 (no state of its own): the newest checkpoint of the job, so that it
        continues from the step it belongs to; None, said loudly where the job had
        ``committed()`` steps, when it starts over."""
        checkpoint = self.load(self.directory, self.job_id) if self.directory else None
        if checkpoint is None:
            done = committed()
            if done > 0:
                LOG.warning(
                    "the job committed %d steps but this rank 0 has no state and %s: the "
                    "model starts from its initial state and the ledger rolls back to step 0",
                    done,
                    "no checkpoint was found in " + str(self.directory)
                    if self.directory is not None
                    else "EDL_CHECKPOINT_DIR is not set",
                )
            return None
        LOG.info("restoring the job's state at step %d", checkpoint.step)
        return checkpoint
