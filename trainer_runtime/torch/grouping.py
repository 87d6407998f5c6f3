"""Forming a torch.distributed group for each generation, inside the running process.

Every worker hosts a small TCPStore server from its start; a generation's group meets in
the store of its rank 0, under a fresh prefix (`job/g<generation>/`), so no key of an older
generation is ever read. Re-forming is letting the old group go and building a new one
(`trainer_runtime.torch.groups`): no process restart, no re-import. Then rank 0 broadcasts
model parameters, buffers and the optimizer state to every member (newcomers and survivors
alike), so survivors that diverged inside a failed step converge.

Before the group is built, every rank of the generation checks in under the prefix and
waits for the others (the roll call, `trainer_runtime.rollcall`), bounded by the store's
timeout, so a member that never comes (it died, or hangs in its start) gives the others an
error rather than a wait.

On NCCL, before each group is built (`nccl_environment`):
- `TORCH_NCCL_ASYNC_ERROR_HANDLING=2`: when a collective fails or times out, torch's watchdog
  aborts the communicator and the process lives on, so the worker re-forms. (1 and 3,
  torch's default, end the process; 0 leaves a hung collective hanging.)
- `TORCH_NCCL_USE_COMM_NONBLOCKING=1` and `TORCH_NCCL_NONBLOCKING_TIMEOUT` = the group's
  timeout: in torch's default (blocking) set-up of a communicator the wait for the others
  has no bound. A member that checked in and then never built
  its group held its peers there for ever (seen on an H100: `peer_never_initializes` in
  `benchmarks/gpu_nccl_check.py`).
NCCL runs collectives asynchronously to Python, so a step's allreduce may still be running,
or may have been aborted half-way, when backward returns; `settling` waits for it and asks
the communicator whether it failed, so a step applies only gradients that were whole (on an
H100 a SIGKILLed peer otherwise cost the survivor 4 samples of the step it was in).

A generation that only drops members of the previous one may keep the live group instead
(`trainer_runtime.torch.shrinking`), and members that already hold rank 0's state are not
sent it again (`broadcasting_state`). A generation that only adds members may be built by
the running ones beside their group while it trains (`trainer_runtime.torch.joining`);
then every member of the attempt meets once more at the switch (`switching`) before the
group's first collective.

What must stay true: every collective runs under the group's bounded timeout; after
`broadcasting_state` returns, all members hold rank 0's state, or the ones that do not
take it over the next steps (`trainer_runtime.torch.streaming`) and stand by until they
hold it; an applied step's collectives completed.
"""

from __future__ import annotations

import datetime
import enum
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import PrefixStore, Store, TCPStore
from torch.distributed.utils import _verify_param_shape_across_processes as verify_shapes

from trainer_runtime.agent import Assignment
from trainer_runtime.generations import holding_state
from trainer_runtime.rollcall import ABANDON, Abandoned, calling_roll, proposing
from trainer_runtime.torch.groups import Group, aborting, building
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
SWITCH_PREFIX = "switch/"  # the switch's roll call (`switching`)
PREPARED_KEY = "prepared"  # members that build the group beside a running one


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
            self.clients[address] = self.connecting(address)
        return self.clients[address]

    def connecting(self, address: str) -> Store:
        """A client of its own to the store at `address`, for another thread: a store
        object runs one call at a time, a blocking wait included (a group's set-up waits
        on its peers' keys), so threads that share one wait for each other."""
        host, port = address.rsplit(":", 1)
        return TCPStore(host, int(port), is_master=False, timeout=self.timeout)


def attempt_tag(assignment: Assignment, attempt: int) -> str:
    """The attempt's name: `g<generation>` at attempt 0, `g<generation>a<n>` at attempt n."""
    return f"g{assignment.generation}" + (f"a{attempt}" if attempt else "")


def attempt_store(
    assignment: Assignment, attempt: int, job_id: str, stores: StoreHost, own: bool = False
) -> Store:
    """Where the attempt's members meet: the store of its rank 0, under the attempt's own
    prefix (`job/g<generation>/`), so that no key of another attempt is ever read. `own`:
    over a connection of its own (`StoreHost.connecting`), for a thread beside the
    training thread."""
    leader = next(p for p in assignment.peers if p.rank == 0)
    tag = attempt_tag(assignment, attempt)
    address = leader.store_address
    base = stores.connecting(address) if own else stores.store_of(address)
    return PrefixStore(f"{job_id}/{tag}/", base)


def forming(
    assignment: Assignment,
    attempt: int,
    job_id: str,
    stores: StoreHost,
    device: torch.device,
    superseded: Callable[[], bool] = lambda: False,
    live: Holding | None = None,
    previous: Assignment | None = None,
    shrinker: Shrinker | None = None,
) -> tuple[Reformation, Group]:
    """Join attempt `attempt` at this generation's group (a generation that failed to form,
    or whose step failed while nobody left, is formed again under keys of its own:
    `job/g<generation>/` at attempt 0, `job/g<generation>a<n>/` at attempt n).

    `live`: this process's group, formed as `previous` (empty: none), held only there. When
    the new generation only drops members of it, and every member can, the live group is
    shrunk (`shrinking`); otherwise, or when a shrink fails, it is let go before the new one
    is built. `shrinker`: how the live group shrinks (`shrinking.shrinker_for`), None where
    it cannot."""
    live = live or Holding(None)
    store = attempt_store(assignment, attempt, job_id, stores)
    timeout_s = stores.timeout.total_seconds()
    excluded = None
    if live.group is not None and shrinker is not None and attempt == 0:
        excluded = leavers(previous, assignment)
    if excluded is None:
        live.letting_go()
    else:
        offering(store)
    meeting(store, assignment.rank, assignment.world_size, timeout_s, superseded)
    if excluded is not None:
        assert shrinker is not None and live.group is not None
        if agreed(store, assignment.world_size):
            # past NCCL's own bound on the shrink (the group's timeout), so that only a
            # member that is gone is waited for to the end
            deadline = time.monotonic() + 2 * timeout_s
            world_size = assignment.world_size
            shrunk = shrinking(store, shrinker, live.group, excluded, world_size, deadline)
            live.letting_go()
            if shrunk is not None:
                return Reformation.SHRUNK, shrunk
            store = PrefixStore("full/", store)  # all build anew, under keys of their own
            meeting(store, assignment.rank, assignment.world_size, timeout_s, superseded)
        else:
            live.letting_go()
    if device.type == "cuda":
        nccl_environment(timeout_s)
    name = f"{job_id}/{attempt_tag(assignment, attempt)}"
    group = building(store, assignment.rank, assignment.world_size, device, stores.timeout, name)
    try:
        if prepared_count(store) > 0:  # a member built it beside its running group
            switching(store, assignment.rank, assignment.world_size, timeout_s, superseded)
    except dist.DistStoreError:
        dissolving(group)
        raise
    return Reformation.FORMED, group


def preparing(store: Store) -> None:
    """This member builds the attempt's group beside its running one: counted before it
    checks in at the roll call, so that every member reads the count whole once the roll
    call said BUILD (`prepared_count`) and meets the others at the switch."""
    store.add(PREPARED_KEY, 1)


def prepared_count(store: Store) -> int:
    """How many members of the attempt build its group beside a running one."""
    return int(store.add(PREPARED_KEY, 0))


def switching(
    store: Store,
    rank: int,
    world_size: int,
    timeout_s: float,
    superseded: Callable[[], bool] = lambda: False,
) -> None:
    """The second roll call of an attempt some member built beside its running group: every
    member checks in once it will use the built group (a newcomer at once, a running member
    at the step boundary where its group leaves), so that no collective runs on the group
    before all of them are there; bounded by twice the timeout (the running members may
    finish a step or two first) or a newer generation. Raises `DistStoreError` when the
    attempt is abandoned."""
    try:
        calling_roll(
            store, SWITCH_PREFIX, rank, world_size, superseded, time.monotonic() + 2 * timeout_s
        )
    except Abandoned as error:
        raise dist.DistStoreError(str(error)) from error


def giving_up_switch(store: Store) -> None:
    """A member that will not use the attempt's group it built beside its running one says
    so, and the others stop waiting for it at the switch."""
    proposing(store, SWITCH_PREFIX, ABANDON)


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


def settling(group: Group) -> None:
    """Wait until this rank's queued collectives ended, and raise if the communicator
    failed meanwhile (a peer died, or the watchdog aborted it on a timeout): the gradients
    they produced may be partial and must not be applied. Only for NCCL; a gloo collective
    raises in the call itself."""
    torch.cuda.current_stream(group.device).synchronize()
    if group.failed():
        raise RuntimeError(f"the group's collectives failed ({group.backend().get_error()})")


class Holding:
    """The live group, held in this one place so that letting it go releases it: gloo
    closes its connections only when the group is destroyed (its abort does not), and a
    peer still inside a collective of the old group (its partner died mid-step) waits
    there until gloo's timeout unless they close. Measured: 31 s instead of 1.3 s from a
    SIGKILL to the first step, once in 8, with an 11M-parameter model, while a reference
    outlived the new group's set-up."""

    def __init__(self, group: Group | None) -> None:
        self.group = group
        #: Works of the group's last step (its vote), released right after the group: a
        #: gloo work holds the group's connections (its context) open, however finished,
        #: and a survivor that kept its last vote through the next roll call kept a peer
        #: waiting in a broadcast it had given up for gloo's timeout (SIGKILLs that cost
        #: 30.7 s instead of about 1 s with an 11M-parameter model: docs/runtime.md).
        self.works: list[Any] = []

    def letting_go(self) -> None:
        """Abort the group (NCCL) and drop the reference: it is destroyed here, unless
        something else still holds it (the caller lets go of its DDP first); then its
        works, on this thread (`ElasticSession.unwrapping` says why after it)."""
        group, self.group = self.group, None
        dissolving(group)
        del group
        self.works.clear()


def dissolving(group: Group | None) -> None:
    """Leave `group`, if any. An NCCL communicator is aborted first: a peer that died may
    have left a collective queued on it, and destroying it would wait for that collective
    for ever. The group itself goes with the caller's last reference to it."""
    if group is not None:
        aborting(group)


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
        # zeros: a member that takes the values in steps (`streaming`) steps with them first
        tensor = torch.zeros(tree[1], dtype=getattr(torch, tree[2]), device=device)
        tensors.append(tensor)
        return tensor
    if isinstance(tree, dict):
        return {key: rebuilding(value, tensors, device) for key, value in tree.items()}
    if isinstance(tree, list | tuple):
        return type(tree)(rebuilding(value, tensors, device) for value in tree)
    return tree


class Delivery(enum.Enum):
    """How rank 0's state reached a generation's members (`broadcasting_state`)."""

    HELD = "held"  # every member held it: only the buffers were sent
    SENT = "sent"  # all of it, to every member, before the first step
    STREAMED = "streamed"  # the buffers now, the rest to the members without it in steps


@dataclass(frozen=True, slots=True)
class Reformed:
    """How one generation formed on this worker: the path its group took and how rank 0's
    parameters and optimizer state reached the members (what a benchmark reports)."""

    generation: int
    attempt: int
    path: Reformation
    delivery: Delivery

    @property
    def state_sent(self) -> bool:
        """Whether the parameters and optimizer state went to some member."""
        return self.delivery is not Delivery.HELD


def broadcasting_state(
    group: Group,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    extra: dict[str, Any],
    device: torch.device,
    mark: tuple[int, ...] | None = None,
    streaming: bool = False,
) -> tuple[dict[str, Any], Delivery, list[int]]:
    """Make every member hold rank 0's model, optimizer state and `extra`, or start to;
    returns `extra` as rank 0 sent it, how the state went, and the ranks that held it.

    `mark` names this member's state: the formation it adopted and the step it reached
    since (None: a state of its own, a newcomer's or one restored). Members whose marks
    equal rank 0's hold its parameters and optimizer state already: they adopted the same
    state and applied the same averaged gradients since. One allreduce tells every member
    who holds it. When all of them do (a graceful shrink, a step that failed everywhere)
    only the buffers are sent (each rank's own between formations: DDP here does not
    broadcast them). When some do and `streaming`, the buffers are sent, a member without
    the state takes the optimizer state's layout (zeros) and the rest follows over the
    next steps (`trainer_runtime.torch.streaming`); otherwise everything is sent now, as
    to a newcomer."""
    rank, pg = group.rank, group.pg
    tensors: list[torch.Tensor] = []
    header: list[Any] = [None]
    if rank == 0:
        header = [(placeholders(optimizer.state_dict(), tensors), extra, mark)]
    dist.broadcast_object_list(header, group=pg, group_src=0)
    optimizer_tree, sent, leading = header[0]
    holding = torch.zeros(group.size, device=device)
    holding[rank] = float(holding_state(mark, leading))
    dist.all_reduce(holding, group=pg)
    holders = [r for r, held in enumerate(holding.tolist()) if held > 0.5]
    if len(holders) == group.size:
        broadcasting_buffers(pg, model)
        return sent, Delivery.HELD, holders
    # the parameters' shapes first, as DDP would: a member built from another model is a
    # clear error here rather than a broadcast into tensors of the wrong size
    verify_shapes(pg, list(model.parameters()))
    if streaming and holders and holders[0] == 0:
        broadcasting_buffers(pg, model)
        if rank not in holders:
            optimizer.load_state_dict(rebuilding(optimizer_tree, [], device))
        return sent, Delivery.STREAMED, holders
    if rank != 0:
        optimizer_tree = rebuilding(optimizer_tree, tensors, device)
    with torch.no_grad():
        for value in model.state_dict().values():
            dist.broadcast(value, group=pg, group_src=0)
        for tensor in tensors:
            if tensor.device.type != device.type and tensor.dim() == 0:
                holder = tensor.to(device)
                dist.broadcast(holder, group=pg, group_src=0)
                tensor.copy_(holder)
            else:
                dist.broadcast(tensor, group=pg, group_src=0)
    if rank != 0:
        optimizer.load_state_dict(optimizer_tree)
    result: dict[str, Any] = sent
    return result, Delivery.SENT, holders


def broadcasting_buffers(pg: dist.ProcessGroup, model: torch.nn.Module) -> None:
    """Rank 0's buffers to every member (running statistics: small)."""
    with torch.no_grad():
        for buffer in model.buffers():
            dist.broadcast(buffer, group=pg, group_src=0)
