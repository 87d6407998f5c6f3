"""This worker's replica of the model: warmed up before it joins, wrapped in a
DistributedDataParallel for each generation, and what the session asks of it around a step.

What must stay true: DDP never broadcasts the model itself (the session's formation sent
rank 0's state, `grouping.broadcasting_state`); its buckets are rebuilt where a failure
breaks the group like any other (`rebuilding_buckets`); a step counts only once its device
work ran (`completion`).
"""

from __future__ import annotations

import copy
import gc
import warnings
import weakref

import torch
from torch.nn.parallel import DistributedDataParallel

from trainer_runtime.torch.groups import Group


def warming_up(module: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Pay the one-off costs (the optimizer's first step imports torch._dynamo) on a
    throw-away copy, before asking to join, so the group never waits for this worker."""
    shadow_model = copy.deepcopy(module)
    shadow = type(optimizer)(shadow_model.parameters(), **optimizer.defaults)
    for parameter in shadow_model.parameters():
        parameter.grad = torch.zeros_like(parameter)
    shadow.step()


def replicating(module: torch.nn.Module, group: Group) -> DistributedDataParallel:
    """`module` wrapped for `group`. Every member holds rank 0's parameters, or takes them
    in before it computes a gradient that counts (`broadcasting_state`, which also checked
    their shapes): DDP's own sync at construction, a second broadcast of the whole model,
    is skipped; buffers stay each rank's own in forward."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        return DistributedDataParallel(
            module, process_group=group.pg, broadcast_buffers=False, init_sync=False
        )


def discarding(
    left: weakref.ref[DistributedDataParallel] | None, broken: bool, device: torch.device
) -> None:
    """After the session dropped a generation's DDP (`left`, weakly), before it lets the
    group go: when the group failed on gloo and the DDP is still alive, collect it now.

    Why: the first DDP of a process is freed only by the cyclic collector (its constructor
    leaves it in a reference cycle of torch's own, through a frame kept alive), and its
    reducer holds the group; gloo closes its connections only once the group and its works
    are gone, so a peer waiting in a collective this rank gave up would wait for gloo's
    timeout. A collection takes about 70 ms in a worker on this 2-core machine, so it runs
    only where it frees something and a peer may be waiting: a failed group, on gloo
    (NCCL's communicator is aborted instead, `groups.aborting`)."""
    if broken and device.type != "cuda" and left is not None and left() is not None:
        gc.collect()


def rebuilding_buckets(ddp: DistributedDataParallel) -> None:
    """Let DDP rebuild its gradient buckets now, if this step made that due; raises when
    the group failed.

    DDP orders its buckets once per DDP object, by the order gradients became ready in its
    first synchronized backward, and agrees on that order with a broadcast from rank 0 at
    the next forward: in the user's `s.model(...)` call, where a peer lost just then raises
    an error the session cannot turn into re-forming, and the worker stops. Asked at the
    end of the step, the broadcast runs where a failure breaks the group like any other
    (the step itself was applied and recorded), and the user's forward finds nothing left
    to rebuild. Every rank asks at the same step: the step's backward is synchronized on
    all of them or on none."""
    ddp.reducer._rebuild_buckets()


def completion(device: torch.device) -> torch.cuda.Event | None:
    """The step's device work, as a CUDA event recorded after its optimizer step: rank 0's
    sender commits the window once the device ran it (`Committer.enqueue`). None on a CPU,
    where the step ran when `step` returned. The event blocks its waiter (the sender
    thread) rather than spinning on a core."""
    if device.type != "cuda":
        return None
    event = torch.cuda.Event(blocking=True)  # type: ignore[no-untyped-call]
    event.record(torch.cuda.current_stream(device))
    return event
