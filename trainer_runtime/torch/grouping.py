"""Forming a torch.distributed group for each generation, inside the running process.

Every worker hosts a small TCPStore server from its start; a generation's group meets in
the store of its rank 0, under a fresh prefix (`job/g<generation>/`), so no key of an older
generation is ever read. Re-forming is `destroy_process_group` then `init_process_group`:
no process restart, no re-import. Then rank 0 broadcasts model parameters, buffers and the
optimizer state to every member (newcomers and survivors alike), so survivors that diverged
inside a failed step converge.

Before the group is built, every rank of the generation checks in under the prefix and
waits for the others (the roll call, `trainer_runtime.rollcall`), bounded by the store's
timeout, so a member that never comes (it died, or hangs in its start) gives the others an
error rather than a wait.

On NCCL, before each group is built (`nccl_environment`):
- `TORCH_NCCL_ASYNC_ERROR_HANDLING=2`: when a collective fails or times out, torch's watchdog
  aborts the communicator and the process lives on, so the worker re-forms. (1 and 3,
  torch's default, end the process; 0 leaves a hung collective hanging.)
- `TORCH_NCCL_USE_COMM_NONBLOCKING=1` and `TORCH_NCCL_NONBLOCKING_TIMEOUT` = the group's
  timeout: NCCL sets its communicator up at the first collective, and in torch's default
  (blocking) setup that wait has no bound. A member that checked in and then never built
  its group held its peers there for ever (seen on an H100: `peer_never_initializes` in
  `benchmarks/gpu_nccl_check.py`).
NCCL runs collectives asynchronously to Python, so a step's allreduce may still be running,
or may have been aborted half-way, when backward returns; `settling` waits for it and asks
the communicator whether it failed, so a step applies only gradients that were whole (on an
H100 a SIGKILLed peer otherwise cost the survivor 4 samples of the step it was in).

A generation that only drops members of the previous one may keep the live group instead
(`trainer_runtime.torch.shrinking`), and members that already hold rank 0's state are not
sent it again (`broadcasting_state`).

What must stay true: every collective runs under the group's bounded timeout; after
`broadcasting_state` returns, all members hold rank 0's state; an applied step's
collectives completed.
"""

from __future__ import annotations

import datetime
import logging
import os
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import ErrorType, PrefixStore, Store, TCPStore
from torch.distributed.utils import _verify_param_shape_across_processes as verify_shapes

from trainer_runtime.agent import Assignment
from trainer_runtime.generations import holding_state
from trainer_runtime.rollcall import Abandoned, calling_roll
from trainer_runtime.torch.shrinking import (
    Reformation,
    Shrinker,
    agreed,
    leavers,
    offering,
    shrinking,
)

LOG = logging.getLogger(__name__)
NCCL_ERROR_HANDLING = "TORCH_NCCL_ASYNC_ERROR_HANDLING"
ABORT_ONLY = "2"
NCCL_NONBLOCKING = "TORCH_NCCL_USE_COMM_NONBLOCKING"
NCCL_NONBLOCKING_TIMEOUT = "TORCH_NCCL_NONBLOCKING_TIMEOUT"
ROLL_PREFIX = "roll/"  # the roll call's keys, under the attempt's prefix


class StoreHost:
    """This worker's store server, and clients to the stores of other workers."""

    def __init__(self, host: str, timeout_s: float) -> None:
        self.timeout = datetime.timedelta(seconds=timeout_s)
        self.server = TCPStore(
            host, 0, is_master=True, wait_for_workers=False, timeout=self.timeout
        )
        self.address = f"{host}:{self.server.port}"
        self.clients: dict[str, Store] = {}

    def store_of(self, address: str) -> Store:
        if address == self.address:
            return self.server
        if address not in self.clients:
            host, port = address.rsplit(":", 1)
            self.clients[address] = TCPStore(host, int(port), is_master=False, timeout=self.timeout)
        return self.clients[address]


def backend_for(device: torch.device) -> str:
    return "nccl" if device.type == "cuda" else "gloo"


def forming(
    assignment: Assignment,
    attempt: int,
    job_id: str,
    stores: StoreHost,
    device: torch.device,
    superseded: Callable[[], bool] = lambda: False,
    previous: Assignment | None = None,
    shrinker: Shrinker | None = None,
) -> Reformation:
    """Join attempt `attempt` at this generation's group (a generation that failed to form,
    or whose step failed while nobody left, is formed again under keys of its own:
    `job/g<generation>/` at attempt 0, `job/g<generation>a<n>/` at attempt n).

    `previous`: the assignment this process's live group was formed as (None: no live
    group). When the new generation only drops members of it, and every member can, the
    live group is shrunk (`shrinking`); otherwise, or when a shrink fails, the old group
    (if any) is left and a new one built. `shrinker`: how the live group shrinks
    (`shrinking.shrinker_for`), None where it cannot."""
    leader = next(p for p in assignment.peers if p.rank == 0)
    tag = f"g{assignment.generation}" + (f"a{attempt}" if attempt else "")
    store = PrefixStore(f"{job_id}/{tag}/", stores.store_of(leader.store_address))
    timeout_s = stores.timeout.total_seconds()
    excluded = leavers(previous, assignment) if shrinker is not None and attempt == 0 else None
    if excluded is not None:
        offering(store)
    else:
        dissolving()
    meeting(store, assignment.rank, assignment.world_size, timeout_s, superseded)
    if excluded is not None:
        assert shrinker is not None
        if agreed(store, assignment.world_size):
            # past NCCL's own bound on the shrink (the group's timeout), so that only a
            # member that is gone is waited for to the end
            deadline = time.monotonic() + 2 * timeout_s
            if shrinking(store, shrinker, excluded, assignment.world_size, deadline):
                return Reformation.SHRUNK
            store = PrefixStore("full/", store)  # all build anew, under keys of their own
            dissolving()
            meeting(store, assignment.rank, assignment.world_size, timeout_s, superseded)
        else:
            dissolving()
    backend = backend_for(device)
    if backend == "nccl":
        nccl_environment(timeout_s)
    dist.init_process_group(
        backend,
        store=store,
        rank=assignment.rank,
        world_size=assignment.world_size,
        timeout=stores.timeout,
    )
    return Reformation.FORMED


def meeting(
    store: Store,
    rank: int,
    world_size: int,
    timeout_s: float | None = None,
    superseded: Callable[[], bool] = lambda: False,
) -> None:
    """Check in at the attempt's roll call (`trainer_runtime.rollcall`), and return once its
    verdict is to build the group; raise `DistStoreError` (a RuntimeError) once the attempt
    is abandoned: at `timeout_s` (default: the store's timeout) or once a newer generation
    opened (`superseded`, a memory read)."""
    if timeout_s is None:  # the store's own timeout
        timeout_s = store.timeout.total_seconds()  # type: ignore[attr-defined]
    try:
        calling_roll(store, ROLL_PREFIX, rank, world_size, superseded, time.monotonic() + timeout_s)
    except Abandoned as error:
        raise dist.DistStoreError(str(error)) from error


def nccl_environment(timeout_s: float) -> None:
    """Make NCCL's watchdog abort the communicator of a failed collective and keep the
    process, and bound the communicator's set-up by `timeout_s`. Set before every group:
    torch reads the first two when a group is built, the timeout once per process (the
    contract's timeout does not change). A value the user set otherwise is overridden,
    with a warning, since the runtime's guarantees rest on it."""
    wanted = {
        NCCL_ERROR_HANDLING: ABORT_ONLY,
        NCCL_NONBLOCKING: "1",
        NCCL_NONBLOCKING_TIMEOUT: str(max(1, round(timeout_s))),
    }
    for name, value in wanted.items():
        current = os.environ.get(name)
        if current not in (None, value):
            LOG.warning("%s=%s: the elastic runtime sets %s", name, current, value)
        os.environ[name] = value


def settling(device: torch.device) -> None:
    """Wait until this rank's queued collectives ended, and raise if the communicator
    failed meanwhile (a peer died, or the watchdog aborted it on a timeout): the gradients
    they produced may be partial and must not be applied. Only for NCCL; a gloo collective
    raises in the call itself."""
    torch.cuda.current_stream(device).synchronize()
    backend = dist.distributed_c10d._get_default_group()._get_backend(device)
    error = backend.get_error()
    if error != ErrorType.SUCCESS:
        raise RuntimeError(f"the group's collectives failed ({error})")


def dissolving() -> None:
    """Leave the current group, if any. An NCCL communicator is aborted first: a peer that
    died may have left a collective queued on it, and destroying it would wait for that
    collective for ever. (torch has no public name for the default group; the private one
    is typed, so mypy checks the call: a stale name here once failed only on a GPU.)"""
    if dist.is_initialized():
        if torch.cuda.is_available() and dist.get_backend() == "nccl":
            group = dist.distributed_c10d._get_default_group()
            group._get_backend(torch.device("cuda")).abort()
        dist.destroy_process_group()


def placeholders(tree: Any, tensors: list[torch.Tensor]) -> Any:
    """The tree with each tensor replaced by (shape, dtype) and appended to `tensors`."""
    if isinstance(tree, torch.Tensor):
        tensors.append(tree)
        return ("__tensor__", tuple(tree.shape), str(tree.dtype).removeprefix("torch."))
    if isinstance(tree, dict):
        return {key: placeholders(value, tensors) for key, value in tree.items()}
    if isinstance(tree, list | tuple):
        return type(tree)(placeholders(value, tensors) for value in tree)
    return tree


def rebuilding(tree: Any, tensors: list[torch.Tensor], device: torch.device) -> Any:
    """Allocate a tensor for every placeholder of `tree` (inverse of `placeholders`)."""
    if isinstance(tree, tuple) and len(tree) == 3 and tree[0] == "__tensor__":
        tensor = torch.empty(tree[1], dtype=getattr(torch, tree[2]), device=device)
        tensors.append(tensor)
        return tensor
    if isinstance(tree, dict):
        return {key: rebuilding(value, tensors, device) for key, value in tree.items()}
    if isinstance(tree, list | tuple):
        return type(tree)(rebuilding(value, tensors, device) for value in tree)
    return tree


def broadcasting_state(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    extra: dict[str, Any],
    device: torch.device,
    mark: tuple[int, ...] | None = None,
) -> tuple[dict[str, Any], bool]:
    """Make every member hold rank 0's model, optimizer state and `extra`; returns `extra`
    as rank 0 sent it, and whether the parameters and optimizer state were sent.

    `mark` names this member's state: the formation it adopted and the step it reached
    since (None: a state of its own, a newcomer's or one restored). Members whose marks
    equal rank 0's hold its parameters and optimizer state already: they adopted the same
    state and applied the same averaged gradients since. When all of them do (a graceful
    shrink, a step that failed everywhere), one flag's allreduce says so and only the
    buffers are sent (each rank's own between formations: DDP here does not broadcast
    them); otherwise everything is, as to a newcomer."""
    rank = dist.get_rank()
    tensors: list[torch.Tensor] = []
    header: list[Any] = [None]
    if rank == 0:
        header = [(placeholders(optimizer.state_dict(), tensors), extra, mark)]
    dist.broadcast_object_list(header, src=0)
    optimizer_tree, sent, leading = header[0]
    holding = torch.tensor([int(holding_state(mark, leading))], device=device)
    dist.all_reduce(holding, op=dist.ReduceOp.MIN)
    if int(holding.item()) == 1:
        with torch.no_grad():
            for buffer in model.buffers():
                dist.broadcast(buffer, src=0)
        return sent, False
    # the parameters' shapes first, as DDP would: a member built from another model is a
    # clear error here rather than a broadcast into tensors of the wrong size
    verify_shapes(dist.distributed_c10d._get_default_group(), list(model.parameters()))
    if rank != 0:
        optimizer_tree = rebuilding(optimizer_tree, tensors, device)
    with torch.no_grad():
        for value in model.state_dict().values():
            dist.broadcast(value, src=0)
        for tensor in tensors:
            if tensor.device.type != device.type and tensor.dim() == 0:
                holder = tensor.to(device)
                dist.broadcast(holder, src=0)
                tensor.copy_(holder)
            else:
                dist.broadcast(tensor, src=0)
    if rank != 0:
        optimizer.load_state_dict(optimizer_tree)
    result: dict[str, Any] = sent
    return result, True
