"""The PyTorch worker of parameter-server mode (`strategy: ps`).

```
config = PsConfig(global_batch=64, lr=0.1, momentum=0.9, snapshot_dir="/shared/ps")
with ps_session(model, dataset, config) as s:
    for inputs, targets in s.batches():
        s.step(loss_fn(model(inputs), targets))   # the loss is a mean over the batch
```
The model's parameters become views of one flat buffer (and their gradients of another), so
a pull writes the partitions' bytes straight into the parameters and a push reads the
gradient's bytes straight from the buffer. The optimizer runs on the servers. Everything but
these torch calls is the framework-free worker (`working.py`: consistency modes, resizes,
commits, and the row-sparse embedding tables that `sparse=` declares).
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.data import TensorDataset

from trainer_runtime.client import Fenced
from trainer_runtime.environment import WorkerContract
from trainer_runtime.ps.working import Consistency, Flat, PsConfig, PsWorker, Sparse
from trainer_runtime.sharding import SampleRange


def flattening(model: torch.nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
    """Make every parameter a view of one flat tensor, and its gradient a view of another."""
    parameters = [p for p in model.parameters() if p.requires_grad]
    if not parameters:
        raise ValueError("the model has no trainable parameters")
    dtypes = {p.dtype for p in parameters}
    if len(dtypes) != 1 or next(iter(dtypes)) not in (torch.float32, torch.float64):
        raise ValueError(f"parameter-server mode needs one dtype, float32 or float64: {dtypes}")
    with torch.no_grad():
        flat = torch.cat([p.detach().reshape(-1) for p in parameters]).contiguous()
        gradient = torch.zeros_like(flat)
        offset = 0
        for p in parameters:
            n = p.numel()
            p.data = flat[offset : offset + n].view_as(p)
            p.grad = gradient[offset : offset + n].view_as(p)
            offset += n
    return flat, gradient


class PsSession(PsWorker):
    """One PyTorch worker of a parameter-server job (see `working.py`)."""

    def __init__(
        self,
        model: torch.nn.Module,
        dataset: TensorDataset,
        config: PsConfig,
        contract: WorkerContract | None = None,
        sparse: Sparse | None = None,
    ) -> None:
        self.model = model
        self.dataset = dataset
        named = [(n, tuple(p.shape)) for n, p in model.named_parameters() if p.requires_grad]
        self.flat, self.flat_gradient = flattening(model)
        self.parameters = [p for p in model.parameters() if p.requires_grad]
        tables = Flat.of(named).tables(sparse or {})
        super().__init__(
            len(dataset),
            config,
            self.flat.numpy(),
            self.flat_gradient.numpy(),
            tables,
            sparse or {},
            contract,
        )

    def window_batch(self, ranges: list[SampleRange]) -> Any:
        index = torch.cat([torch.arange(r.start, r.stop) for r in ranges])
        return tuple(tensor[index] for tensor in self.dataset.tensors)

    def step(self, loss: torch.Tensor) -> None:
        """Compute this worker's gradient of `loss` (a mean over its batch)."""
        self.flat_gradient.zero_()
        torch.autograd.backward(loss)
        offset = 0
        for p in self.parameters:  # an optimizer or user code may have replaced a grad
            n = p.numel()
            view = self.flat_gradient[offset : offset + n]
            if p.grad is not None and p.grad.data_ptr() != view.data_ptr():
                view.copy_(p.grad.reshape(-1))
                p.grad = view.view_as(p)
            offset += n
        self.loss_taken = True


def ps_session(
    model: torch.nn.Module,
    dataset: TensorDataset,
    config: PsConfig,
    contract: WorkerContract | None = None,
    sparse: Sparse | None = None,
) -> PsSession:
    """A PyTorch PS worker; `sparse` names embedding tables (parameter name -> the ids a
    batch looks up), pushed and pulled by row."""
    return PsSession(model, dataset, config, contract, sparse)


__all__ = ["Consistency", "Fenced", "PsConfig", "PsSession", "ps_session"]
