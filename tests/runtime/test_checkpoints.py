"""The checkpoint store every data-parallel adapter uses across a suspension to zero workers
(``trainer_runtime/checkpoints.py``), and Paddle's side of it.

Aspects:
- a Paddle model's and Momentum optimizer's states come back equal, through a file that
  holds no pickle (an archive with an object array in it is skipped as unreadable);
- the newest readable checkpoint of the job wins; a damaged newest file or another job's
  is skipped; only the two newest files are kept.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import paddle

from trainer_runtime.checkpoints import Checkpoint, file_name, stored_steps
from trainer_runtime.paddle.checkpointing import as_tensors, loading, saving
from trainer_runtime.sharding import SampleRange, StepWindow


def trained() -> tuple[paddle.nn.Layer, paddle.optimizer.Optimizer]:
    paddle.seed(0)
    model = paddle.nn.Linear(4, 3)
    optimizer = paddle.optimizer.Momentum(0.1, momentum=0.9, parameters=model.parameters())
    model(paddle.randn([5, 4])).mean().backward()
    optimizer.step()
    optimizer.clear_grad()
    return model, optimizer


def checkpoint(step: int, job: str = "job") -> Checkpoint:
    model, optimizer = trained()
    window = StepWindow(step, 0, (SampleRange(0, 4),))
    return Checkpoint(job, step, model.state_dict(), optimizer.state_dict(), {"b": 8}, (window,))


def test_paddle_state_comes_back_equal_without_pickle(tmp_path: Path) -> None:
    model, optimizer = trained()
    saved = Checkpoint("job", 7, model.state_dict(), optimizer.state_dict(), {"b": 8}, ())
    saving(tmp_path, saved)
    found = loading(tmp_path, "job")
    assert found is not None and found.step == 7 and found.policy == {"b": 8}
    fresh = paddle.nn.Linear(4, 3)
    again = paddle.optimizer.Momentum(0.1, momentum=0.9, parameters=fresh.parameters())
    fresh.set_state_dict(as_tensors(found.model))
    again.set_state_dict(as_tensors(found.optimizer))
    for name, value in model.state_dict().items():
        assert np.array_equal(value.numpy(), fresh.state_dict()[name].numpy()), name
    restored = again.state_dict()
    velocities = [k for k, v in optimizer.state_dict().items() if isinstance(v, paddle.Tensor)]
    assert velocities
    for name in velocities:
        assert np.array_equal(optimizer.state_dict()[name].numpy(), restored[name].numpy())
    # An archive that would need pickle to read is refused, not run.
    np.savez(tmp_path / file_name(9), structure=np.array([object()], dtype=object))
    assert loading(tmp_path, "job").step == 7  # type: ignore[union-attr]


def test_newest_readable_checkpoint_of_the_job_wins(tmp_path: Path) -> None:
    for step in (3, 5, 8):
        saving(tmp_path, checkpoint(step))
    assert stored_steps(tmp_path) == [8, 5]  # the two newest are kept
    (tmp_path / file_name(8)).write_bytes(b"torn")
    assert loading(tmp_path, "job").step == 5  # type: ignore[union-attr]
    (tmp_path / file_name(8)).unlink()
    saving(tmp_path, checkpoint(9, job="other"))  # (a directory shared by two jobs)
    assert stored_steps(tmp_path) == [9, 5]
    assert loading(tmp_path, "job").step == 5  # type: ignore[union-attr]
    assert loading(tmp_path, "nobody") is None
