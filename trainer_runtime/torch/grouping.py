"""Forming a torch.distributed group for each generation, inside the running process.

Every worker hosts a small TCPStore server from its start; a generation's group meets in
the store of its rank 0, under a fresh prefix (`job/g<generation>/`), so no key of an older
generation is ever read. Re-forming is `destroy_process_group` then `init_process_group`:
no process restart, no re-import. Then rank 0 broadcasts model parameters, buffers and the
optimizer state to every member (newcomers and survivors alike), so survivors that diverged
inside a failed step converge.

Before the group is built, every rank of the generation checks in under the prefix and
waits for the others, bounded by the store's timeout: NCCL sets its communicator up at the
first collective, in torch's default (blocking) setup a wait that the group's timeout does
not bound, so a member that never comes (it died, or hangs in its start) could hold the
others forever; here they get an error. (From torch's documentation; not yet observed on a
GPU: `benchmarks/gpu_nccl_check.py` checks it.)

On NCCL, `TORCH_NCCL_ASYNC_ERROR_HANDLING` is set to 2 before each group is built: when a
collective fails or times out, torch's watchdog aborts the communicator and the process
lives on, so the next call into the group raises and the worker re-forms. (1 and 3, torch's
default, end the process; 0 leaves a hung collective hanging.)

What must stay true: every collective runs under the group's bounded timeout; after
`forming` returns, all members hold rank 0's state.
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
from torch._C._distributed_c10d import PrefixStore, Store, TCPStore

from trainer_runtime.agent import Assignment

LOG = logging.getLogger(__name__)
NCCL_ERROR_HANDLING = "TORCH_NCCL_ASYNC_ERROR_HANDLING"
ABORT_ONLY = "2"
VERDICT = "verdict"  # one per attempt, under the attempt's prefix
BUILD, ABANDON = "build", "abandon"
MEETING_POLL_S = 0.005


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
) -> None:
    """Leave the old group (if any) and join attempt `attempt` at this generation's group
    (a generation that failed to form, or whose step failed while nobody left, is formed
    again under keys of its own: `job/g<generation>/` at attempt 0, `job/g<generation>a<n>/`
    at attempt n)."""
    dissolving()
    leader = next(p for p in assignment.peers if p.rank == 0)
    tag = f"g{assignment.generation}" + (f"a{attempt}" if attempt else "")
    store = PrefixStore(f"{job_id}/{tag}/", stores.store_of(leader.store_address))
    timeout_s = stores.timeout.total_seconds()
    meeting(store, assignment.rank, assignment.world_size, timeout_s, superseded)
    backend = backend_for(device)
    if backend == "nccl":
        aborting_on_failure()
    dist.init_process_group(
        backend,
        store=store,
        rank=assignment.rank,
        world_size=assignment.world_size,
        timeout=stores.timeout,
    )


def meeting(
    store: Store,
    rank: int,
    world_size: int,
    timeout_s: float | None = None,
    superseded: Callable[[], bool] = lambda: False,
) -> None:
    """Check in, and return once every rank of this attempt has; raise `DistStoreError` (a
    RuntimeError) once the attempt is abandoned. One verdict per attempt, the first one
    proposed (`compare_set` on an absent key): any member proposes BUILD once all have
    checked in, and ABANDON once `timeout_s` (default: the store's timeout) passed or a
    newer generation opened (`superseded`, a memory read); so a
    member that arrives at an attempt its peers gave up learns it at once and moves on to
    the next attempt, and a member that gave up is never counted in a group that is built."""
    store.set(f"arrived/{rank}", "1")
    everyone = [f"arrived/{other}" for other in range(world_size)]
    if timeout_s is None:  # the store's own timeout
        timeout_s = store.timeout.total_seconds()  # type: ignore[attr-defined]
    deadline = time.monotonic() + timeout_s
    while True:
        proposal = ""
        if store.check(everyone):
            proposal = BUILD
        elif time.monotonic() > deadline or superseded():
            proposal = ABANDON
        elif store.check([VERDICT]):
            proposal = ABANDON  # only an abandoned attempt has a verdict before all came
        if proposal:
            verdict = store.compare_set(VERDICT, "", proposal).decode()
            if verdict == BUILD:
                return
            raise dist.DistStoreError(f"attempt abandoned: not every member checked in ({rank})")
        time.sleep(MEETING_POLL_S)


def aborting_on_failure() -> None:
    """Make NCCL's watchdog abort the communicator of a failed collective and keep the
    process (read by torch each time a group is built, so set before every one)."""
    current = os.environ.get(NCCL_ERROR_HANDLING)
    if current not in (None, ABORT_ONLY):
        LOG.warning(
            "%s=%s would end this worker on a failed collective; the elastic runtime sets %s",
            NCCL_ERROR_HANDLING,
            current,
            ABORT_ONLY,
        )
    os.environ[NCCL_ERROR_HANDLING] = ABORT_ONLY


def dissolving() -> None:
    if dist.is_initialized():
        if torch.cuda.is_available() and dist.get_backend() == "nccl":
            dist.get_default_group()._get_backend(torch.device("cuda")).abort()  # type: ignore[attr-defined]
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
) -> dict[str, Any]:
    """Make every member hold rank 0's model, optimizer state and `extra`; returns `extra`
    as rank 0 sent it."""
    rank = dist.get_rank()
    tensors: list[torch.Tensor] = []
    header: list[Any] = [None]
    if rank == 0:
        header = [(placeholders(optimizer.state_dict(), tensors), extra)]
    dist.broadcast_object_list(header, src=0)
    optimizer_tree, sent = header[0]
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
    return result
