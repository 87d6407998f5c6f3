"""PyTorch's side of the checkpoints that carry a job across a suspension to zero workers
(``trainer_runtime/checkpoints.py`` says what is written, where, and which file wins): the
model's and optimizer's state dicts, saved with ``torch.save`` and read back on the CPU with
``weights_only`` (a checkpoint holds tensors and plain values, never code to run).
"""

from __future__ import annotations

from pathlib import Path
from typing import IO, Any

import torch

from trainer_runtime import checkpoints
from trainer_runtime.checkpoints import Checkpoint, file_name, stored_steps

__all__ = ["Checkpoint", "file_name", "loading", "saving", "stored_steps"]


def _dump(payload: dict[str, Any], stream: IO[bytes]) -> None:
    torch.save(payload, stream)


def _load(path: Path) -> dict[str, Any]:
    payload: dict[str, Any] = torch.load(path, map_location="cpu", weights_only=True)
    return payload


def saving(directory: Path, checkpoint: Checkpoint) -> Path:
    """Write ``checkpoint`` (state dicts of tensors) atomically into ``directory``."""
    return checkpoints.saving(directory, checkpoint, _dump)


def loading(directory: Path, job_id: str) -> Checkpoint | None:
    """The newest readable checkpoint of ``job_id`` in ``directory``, or None."""
    return checkpoints.loading(directory, job_id, _load)
