"""A generation's process group, built by the session itself rather than as torch's default
group.

Why not `init_process_group`: a process has one default group, and a join is cheapest when
the next generation's group is built while the current one still trains
(`trainer_runtime.torch.joining`): two groups live at once, and the switch between them is
a reference. So every group of a session is a standalone `ProcessGroup` over one backend
(gloo on a CPU, NCCL on a GPU), built in the attempt's store, and the session passes it to
every collective (`group=`), to DistributedDataParallel (`process_group=`) and to the
meter. Torch's default group stays uninitialized; a training loop reads its place from the
session (`s.rank`, `s.world_size`, `s.group`).

On NCCL the communicator is connected when the group is built
(`eager_connect_single_device`), not at its first collective: built beside a running group,
the set-up then happens off the training thread, and every member of an attempt builds
the same way, since the set-up is itself a collective of all of them.

What must stay true: a group is built only after its attempt's roll call said BUILD
(`grouping.meeting`); every collective of a session names its group; a group that failed
is aborted before it is let go (a collective left queued on a failed NCCL communicator
would hold its destructor for ever), and a group left is destroyed as it is left
(`grouping.Holding`: gloo closes its connections only then, and a peer still inside one of
its collectives fails at once).
"""

from __future__ import annotations

import datetime
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

import torch
from torch._C._distributed_c10d import (
    Backend,
    ErrorType,
    PrefixStore,
    ProcessGroup,
    ProcessGroupGloo,
    Store,
)

if TYPE_CHECKING:  # a NewType of recent torch only
    from torch.distributed.distributed_c10d import GroupName

LOG = logging.getLogger(__name__)
GROUP_PREFIX = "group/"  # the backend's keys, under the attempt's prefix


@dataclass(eq=False, slots=True)
class Group:
    """One generation's process group on this worker, and the store it was built in (a
    shrink builds the survivors' group in the same store)."""

    pg: ProcessGroup
    store: Store
    device: torch.device
    name: str

    @property
    def rank(self) -> int:
        return int(self.pg.rank())

    @property
    def size(self) -> int:
        return int(self.pg.size())

    @property
    def is_nccl(self) -> bool:
        return self.device.type == "cuda"

    def backend(self) -> Backend:
        return self.pg._get_backend(self.device)

    def failed(self) -> bool:
        """Whether the communicator reported a failure (NCCL; gloo raises in the call)."""
        if not self.is_nccl:
            return False
        return bool(self.backend().get_error() != ErrorType.SUCCESS)


def wrapping(backend: Backend, store: Store, device: torch.device, name: str) -> Group:
    """A `ProcessGroup` over one backend, as torch builds its own groups: the backend
    registered for the device's type and made the default, named for torch's logs."""
    kind = ProcessGroup.BackendType.NCCL if device.type == "cuda" else ProcessGroup.BackendType.GLOO
    pg = ProcessGroup(store, backend.rank(), backend.size())
    pg._set_default_backend(kind)
    pg._register_backend(torch.device(device.type), kind, backend)
    if device.type == "cuda":
        pg.bound_device_id = device
    pg._set_group_name(cast("GroupName", name))
    return Group(pg, store, device, name)


def building(
    store: Store,
    rank: int,
    world_size: int,
    device: torch.device,
    timeout: datetime.timedelta,
    name: str,
) -> Group:
    """Build the group of `world_size` members in `store` (the attempt's, after its roll
    call): it returns once every member built its part (gloo's mesh is connected, NCCL's
    communicator set up), or raises within `timeout`. Safe off the training thread: the
    backends' constructors release the GIL while they wait for peers."""
    prefixed = PrefixStore(GROUP_PREFIX, store)
    backend: Backend
    if device.type == "cuda" and device.index is None:  # the communicator's own device
        device = torch.device("cuda", torch.cuda.current_device())
    if device.type == "cuda":
        from torch.distributed import ProcessGroupNCCL  # absent from CPU builds

        options = ProcessGroupNCCL.Options()
        options._timeout = timeout
        options.group_name = cast("GroupName", name)
        backend = ProcessGroupNCCL(prefixed, rank, world_size, options)
    else:
        backend = ProcessGroupGloo(prefixed, rank, world_size, timeout)
    backend._set_sequence_number_for_group()
    group = wrapping(backend, prefixed, device, name)
    if device.type == "cuda":
        backend.eager_connect_single_device(device)
    return group


def aborting(group: Group) -> None:
    """Abort an NCCL group's communicator (a no-op on gloo, whose calls end on their own):
    what must come before letting go of a group whose peer may be gone."""
    if group.is_nccl:
        try:
            group.backend().abort()
        except RuntimeError as error:  # already aborted by the watchdog
            LOG.debug("aborting %s: %s", group.name, error)
