"""The PaddlePaddle worker of parameter-server mode (`strategy: ps`).

```
config = PsConfig(global_batch=64, lr=0.1, snapshot_dir="/shared/ps")
sparse = {"embedding.weight": lambda batch: batch[0]}   # the ids each batch looks up
with ps_session(model, dataset, config, sparse=sparse) as s:
    for ids, labels in s.batches():
        s.step(loss_fn(model(ids), labels))   # the loss is a mean over the batch
```
The same worker as PyTorch's (`ps/working.py`: coordinator, ledger, partitions, consistency
modes, resizes), with Paddle's calls. Paddle parameters cannot be views of a shared buffer,
so the worker keeps the flat numpy vectors and copies: after each pull it writes the dense
parameters with `set_value` and, of each embedding table, only the pulled rows (an in-place
`scatter_`); after each backward it copies the dense gradients and, of each table, only the
gradient rows of the batch's ids (`gather`), then clears the gradients. Tensors and numpy
arrays meet through DLPack (`viewing`, `wrapping`), which shares memory instead of copying.
Tables are the `sparse` parameters: 2-D (a row per id), trained with a dense gradient in
Paddle (`nn.Embedding(sparse=False)`), moved by row between worker and servers.

What must stay true: the model's parameters equal `values` for every dense parameter and
every table row the current batch looks up; `gradient` holds the batch's gradient there.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import paddle

from trainer_runtime.client import Fenced
from trainer_runtime.environment import WorkerContract
from trainer_runtime.paddle.session import fetching
from trainer_runtime.ps.transport import Rows
from trainer_runtime.ps.working import Array, Consistency, Flat, PsConfig, PsWorker, Sparse
from trainer_runtime.sharding import SampleRange

DTYPES = {paddle.float32: "float32", paddle.float64: "float64"}


def viewing(tensor: Any) -> Array:
    """A numpy view of a CPU tensor's memory (DLPack: no copy)."""
    found: Array = np.from_dlpack(tensor.detach())
    return found


def wrapping(array: Array) -> paddle.Tensor:
    """A tensor over a numpy array's memory (DLPack: no copy); the array must outlive it."""
    wrapped: paddle.Tensor = paddle.utils.dlpack.from_dlpack(np.ascontiguousarray(array))
    return wrapped


def gradient_rows(grad: paddle.Tensor, rows: Array) -> Array:
    """The rows `rows` of a table's gradient, gathered by Paddle, viewed by numpy."""
    return viewing(paddle.gather(grad, wrapping(rows)))


def writing_rows(parameter: paddle.Tensor, rows: Array, values: Array) -> None:
    """Overwrite the rows `rows` of a table in place with `values`."""
    with paddle.no_grad():
        paddle.scatter_(parameter, wrapping(rows), wrapping(values), overwrite=True)


def flat_values(parameters: Sequence[Any]) -> Array:
    """The parameters' values, one after another, in one numpy vector (a copy)."""
    dtypes = {p.dtype for p in parameters}
    if len(dtypes) != 1 or next(iter(dtypes)) not in DTYPES:
        raise ValueError(f"parameter-server mode needs one dtype, float32 or float64: {dtypes}")
    return np.concatenate([p.numpy().reshape(-1) for p in parameters])


class PaddlePsSession(PsWorker):
    """One Paddle worker of a parameter-server job (see the module docstring)."""

    def __init__(
        self,
        model: paddle.nn.Layer,
        dataset: Sequence[Any],
        config: PsConfig,
        contract: WorkerContract | None = None,
        sparse: Sparse | None = None,
    ) -> None:
        self.model = model
        self.dataset = dataset
        named = [(n, p) for n, p in model.named_parameters() if not p.stop_gradient]
        self.parameters = [p for _, p in named]
        layout = Flat.of([(n, tuple(int(d) for d in p.shape)) for n, p in named])
        tables = layout.tables(sparse or {})
        #: each parameter, where it lies in `values`, and its table (None: dense)
        self.spans = [
            (p, start, start + int(np.prod(shape, dtype=np.int64)), tables.get(name))
            for (name, p), start, shape in zip(named, layout.starts, layout.shapes, strict=True)
        ]
        values = flat_values(self.parameters)
        super().__init__(
            len(dataset), config, values, np.zeros_like(values), tables, sparse or {}, contract
        )

    def window_batch(self, ranges: list[SampleRange]) -> Any:
        return fetching(self.dataset, ranges)

    def ids_of(self, found: Any) -> Array:
        return found.numpy() if isinstance(found, paddle.Tensor) else np.asarray(found)

    def loaded(self, touched: Rows | None) -> None:
        """Write pulled values into the model: dense parameters whole, tables by row."""
        with paddle.no_grad():
            for parameter, start, stop, table in self.spans:
                if table is None or touched is None:
                    parameter.set_value(self.values[start:stop].reshape(parameter.shape))
                    continue
                rows = touched.get(table)
                if rows is None or not rows.size:
                    continue
                table_values = self.values[start:stop].reshape(-1, table.row_length)
                writing_rows(parameter, rows, np.take(table_values, rows, axis=0))

    def step(self, loss: paddle.Tensor) -> None:
        """Backpropagate `loss` (a mean over this worker's batch) into `gradient`."""
        loss.backward()
        for parameter, start, stop, table in self.spans:
            grad = parameter.grad
            if table is None:
                self.gradient[start:stop] = 0.0 if grad is None else viewing(grad).reshape(-1)
            else:
                rows = self.touched.get(table, np.zeros(0, np.int64))
                view = self.gradient[start:stop].reshape(-1, table.row_length)
                if grad is None or not rows.size:
                    view[rows] = 0.0
                else:
                    view[rows] = gradient_rows(grad, rows)
            parameter.clear_gradient(False)
        self.loss_taken = True


def ps_session(
    model: paddle.nn.Layer,
    dataset: Sequence[Any],
    config: PsConfig,
    contract: WorkerContract | None = None,
    sparse: Sparse | None = None,
) -> PaddlePsSession:
    """A Paddle PS worker; `sparse` names embedding tables (parameter name -> the ids a
    batch looks up), pushed and pulled by row."""
    return PaddlePsSession(model, dataset, config, contract, sparse)


__all__ = ["Consistency", "Fenced", "PaddlePsSession", "PsConfig", "ps_session"]
