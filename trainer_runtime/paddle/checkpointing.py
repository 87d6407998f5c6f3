"""PaddlePaddle's side of the checkpoints that carry a job across a suspension to zero
workers (``trainer_runtime/checkpoints.py`` says what is written, where, and which file
wins): the model's and optimizer's state dicts, every tensor as a NumPy array.

The file is a NumPy ``.npz`` archive: the arrays, and one JSON document (``structure``) that
holds everything else and names each array where it stood. Nothing in it is pickled, so
reading a checkpoint never runs code (as ``torch.load(weights_only=True)`` for PyTorch).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import IO, Any

import numpy as np
import paddle

from trainer_runtime import checkpoints
from trainer_runtime.checkpoints import Checkpoint

ARRAY = "__array__"  # {"__array__": "a7"}: the archive's array named a7


def _flattening(value: Any, arrays: dict[str, np.ndarray]) -> Any:
    """``value`` as JSON, its tensors and arrays moved into ``arrays``."""
    if isinstance(value, paddle.Tensor):
        value = value.numpy()
    if isinstance(value, np.ndarray):
        name = f"a{len(arrays)}"
        arrays[name] = value
        return {ARRAY: name}
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, dict):
        if not all(isinstance(k, str) for k in value):
            raise TypeError(f"a checkpoint's dict keys must be strings, got {list(value)[:3]}")
        return {k: _flattening(v, arrays) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_flattening(v, arrays) for v in value]
    if value is None or isinstance(value, bool | int | float | str):
        return value
    raise TypeError(f"a checkpoint cannot hold a {type(value).__name__}")


def _rebuilding(value: Any, arrays: Any) -> Any:
    if isinstance(value, dict):
        if set(value) == {ARRAY}:
            return arrays[value[ARRAY]]
        return {k: _rebuilding(v, arrays) for k, v in value.items()}
    if isinstance(value, list):
        return [_rebuilding(v, arrays) for v in value]
    return value


def _dump(payload: dict[str, Any], stream: IO[bytes]) -> None:
    arrays: dict[str, np.ndarray] = {}
    structure = json.dumps(_flattening(payload, arrays))
    members: dict[str, Any] = {"structure": np.array(structure), **arrays}
    np.savez(stream, **members)


def _load(path: Path) -> dict[str, Any]:
    with np.load(path, allow_pickle=False) as archive:
        arrays = {name: archive[name] for name in archive.files if name != "structure"}
        payload: dict[str, Any] = _rebuilding(json.loads(str(archive["structure"])), arrays)
    return payload


def saving(directory: Path, checkpoint: Checkpoint) -> Path:
    """Write ``checkpoint`` (Paddle state dicts) atomically into ``directory``."""
    return checkpoints.saving(directory, checkpoint, _dump)


def loading(directory: Path, job_id: str) -> Checkpoint | None:
    """The newest readable checkpoint of ``job_id`` in ``directory``, or None; its model and
    optimizer states hold NumPy arrays where the saved ones held tensors (``as_tensors``)."""
    return checkpoints.loading(directory, job_id, _load)


def as_tensors(state: Any) -> Any:
    """A loaded state with Paddle tensors again, for ``set_state_dict``."""
    if isinstance(state, np.ndarray):
        return paddle.to_tensor(state)
    if isinstance(state, dict):
        return {k: as_tensors(v) for k, v in state.items()}
    if isinstance(state, list):
        return [as_tensors(v) for v in state]
    return state
