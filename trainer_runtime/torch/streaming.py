"""Rank 0's state streamed to the members that lack it, over a generation's first steps.

A newcomer needs rank 0's parameters and optimizer state before it computes a gradient
that counts, and sending all of it when the group forms stops the whole group for the
transfer (an 11M-parameter model with momentum on gloo: about 1 s of a join's pause). So
when some members hold rank 0's state and others do not (`grouping.broadcasting_state`
says STREAMED), the state goes over the next few steps instead:
- the state is cut into units a step updates together: each parameter with its optimizer
  state (an optimizer such as LAMB updates a parameter by norms of the whole tensor), and
  the units into at most `STREAM_STEPS` chunks of about equal size, the same on every
  member (they hold the same shapes: `broadcasting_state` checked them);
- at each of those steps' start every member issues one chunk's broadcast from rank 0
  (its tensors in one byte buffer, `Chunk`), asynchronously, after the step's vote; the
  transfer runs while the step computes, and each member waits for it just before the
  optimizer step (`landing`): the members that lack the state copy what they received
  into their parameters and optimizer state then, so that from that step on they apply
  the same averaged gradients to the same values as rank 0 (updates are per parameter);
- until the last chunk landed those members stand by: the step's window is split among
  the holders only (`generations.Share`), the others run stand-in samples whose
  gradients are zeroed before they are averaged (`standing_by`: a model part-way through
  taking rank 0's values may compute anything, a NaN included, and 0 x NaN is NaN).
Every member then holds rank 0's state, and the ones that took it in name it as the
holders do (`ElasticSession.origin`), so that a later re-formation skips them too.

Rank 0 sends a copy of the chunk as it is at the step's start, and the members that
receive take it into a buffer of their own: nothing writes a tensor the step is using. A
step that fails leaves the stream (`abandoning`): the members that had not taken all of it
still name no state, and the next formation sends it to them whole.

What must stay true: every member issues the same broadcasts in the same order at the same
steps; a received value is written into the state only between the step's backward and its
optimizer step; a member that lacks the state contributes zeros to every average until it
holds all of it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence

import torch
import torch.distributed as dist
from torch.utils.hooks import RemovableHandle

from trainer_runtime.generations import Share
from trainer_runtime.torch.groups import Group

LOG = logging.getLogger(__name__)
#: Steps over which the state is streamed, at most: the members that take it in stand by
#: that long, and each of those steps carries about 1/STREAM_STEPS of the state beside its
#: own allreduce of the gradients.
STREAM_STEPS = 8
#: A chunk is at least this large (a small model's state goes in one step: a broadcast
#: costs a round trip whatever its size).
MIN_CHUNK_BYTES = 4 << 20
#: Each tensor starts at a multiple of this many bytes in a chunk's buffer (any dtype's
#: alignment), so that its bytes can be read back as its dtype in place.
ALIGN = 16

#: Chunks in flight whose group broke, left behind by `Stream.abandoning`: each buffer, its
#: work and its group, kept until gloo is done with them. Destroying a gloo group joins its
#: worker threads, one of them still in the chunk's broadcast, so the group goes once the
#: broadcast ended, and so does the buffer: the last references drop on the main thread
#: (`pruning`, which the session calls at each formation), never on a gloo thread.
_left_behind: list[tuple[torch.Tensor, dist.Work, Group]] = []


def pruning() -> None:
    """Let go of the chunks left behind whose broadcast ended, and of their groups."""
    _left_behind[:] = [left for left in _left_behind if not left[1].is_completed()]


Unit = list[torch.Tensor]


def units_of(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> list[Unit]:
    """The state as units an optimizer step updates together: each parameter the optimizer
    steps, with its state's tensors (by name), in the optimizer's order; then each
    parameter of the model it does not step."""
    seen: set[int] = set()
    units: list[Unit] = []
    for group in optimizer.param_groups:
        for parameter in group["params"]:
            if id(parameter) in seen:
                continue
            seen.add(id(parameter))
            state = optimizer.state.get(parameter, {})
            kept = [state[name] for name in sorted(state) if isinstance(state[name], torch.Tensor)]
            units.append([parameter, *kept])
    for parameter in model.parameters():
        if id(parameter) not in seen:
            seen.add(id(parameter))
            units.append([parameter])
    return units


def chunking(units: Sequence[Unit], steps: int, min_bytes: int) -> list[list[torch.Tensor]]:
    """The units in consecutive chunks of about `max(total / steps, min_bytes)` bytes each
    (so at most `steps` of them), every tensor of a unit in one chunk."""
    total = sum(t.nbytes for unit in units for t in unit)
    target = max(-(-total // max(1, steps)), min_bytes, 1)
    chunks: list[list[torch.Tensor]] = []
    current: list[torch.Tensor] = []
    size = 0
    for unit in units:
        current.extend(unit)
        size += sum(t.nbytes for t in unit)
        if size >= target:
            chunks.append(current)
            current, size = [], 0
    if current:
        chunks.append(current)
    return chunks


def standing_by(parameters: Iterable[torch.Tensor]) -> list[RemovableHandle]:
    """Zero this member's gradients before they are averaged (see the module docstring);
    the handles take the hooks off."""

    def zeroed(grad: torch.Tensor) -> torch.Tensor:
        return torch.zeros_like(grad)

    return [
        p.register_hook(zeroed)  # type: ignore[no-untyped-call]
        for p in parameters
        if p.requires_grad
    ]


class Chunk:
    """One chunk's tensors, laid out in one byte buffer: a single broadcast a step rather
    than one per tensor (one launch; and a member lost mid-chunk leaves one collective to
    wait out, not a queue of them on gloo's two worker threads)."""

    def __init__(self, tensors: list[torch.Tensor]) -> None:
        self.tensors = tensors
        self.offsets: list[int] = []
        size = 0
        for tensor in tensors:
            self.offsets.append(size)
            size += -(-tensor.nbytes // ALIGN) * ALIGN
        self.size = size

    def packing(self, device: torch.device) -> torch.Tensor:
        """Rank 0: a copy of the tensors as they are now, in one buffer on `device`."""
        buffer = torch.empty(self.size, dtype=torch.uint8, device=device)
        for tensor, offset in zip(self.tensors, self.offsets, strict=True):
            raw = tensor.detach().reshape(-1).view(torch.uint8)
            buffer[offset : offset + raw.numel()].copy_(raw)
        return buffer

    def unpacking(self, buffer: torch.Tensor) -> None:
        """A member without the state: the tensors take the values in `buffer`."""
        for tensor, offset in zip(self.tensors, self.offsets, strict=True):
            size = tensor.nbytes
            piece = buffer[offset : offset + size].view(tensor.dtype).view(tensor.shape)
            tensor.copy_(piece)


class Stream:
    """One member's part in streaming rank 0's state over a generation's first steps."""

    def __init__(
        self,
        group: Group,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        holders: list[int],
        origin: tuple[int, int],
        min_bytes: int = MIN_CHUNK_BYTES,
        steps: int = STREAM_STEPS,
    ) -> None:
        self.group = group
        rank = group.rank
        self.receiving = rank not in holders
        #: How the window is split meanwhile: among the holders (`generations.Share`).
        self.share = Share(None if self.receiving else holders.index(rank), len(holders))
        #: The formation whose state this member holds once the stream is done.
        self.origin = origin
        self.chunks = [Chunk(c) for c in chunking(units_of(model, optimizer), steps, min_bytes)]
        self.sent = 0  # chunks issued
        self.pending: tuple[Chunk, torch.Tensor, dist.Work] | None = None
        self.hooks = standing_by(model.parameters()) if self.receiving else []

    @property
    def done(self) -> bool:
        """Whether every chunk landed."""
        return self.sent == len(self.chunks) and self.pending is None

    def issuing(self) -> None:
        """At a step's start (every member at the same one): the next chunk's broadcast
        from rank 0, asynchronously. Rank 0 sends a copy of its tensors as they are at
        the step's start; every other member receives into a buffer of its own."""
        if self.sent == len(self.chunks) or self.pending is not None:
            return
        chunk, device = self.chunks[self.sent], self.group.device
        with torch.no_grad():
            if self.group.rank == 0:
                buffer = chunk.packing(device)
            else:
                buffer = torch.empty(chunk.size, dtype=torch.uint8, device=device)
            work = dist.broadcast(buffer, group=self.group.pg, group_src=0, async_op=True)
        assert work is not None
        self.pending = (chunk, buffer, work)
        self.sent += 1

    def landing(self) -> None:
        """Before the step's optimizer step: wait for the chunk in flight; a member that
        lacks the state takes it into its parameters and optimizer state. Raises when the
        group failed (the step is then not applied)."""
        pending, self.pending = self.pending, None
        if pending is not None:
            chunk, buffer, work = pending
            work.wait()
            if self.receiving:
                with torch.no_grad():
                    chunk.unpacking(buffer)
        if self.done:
            self.releasing()

    def abandoning(self, broken: bool = False) -> None:
        """The group is left before the stream is done: wait out the chunk in flight (it
        ends at once where the group is whole), and stand by no more.

        A `broken` group on gloo is not waited for: rank 0, whose broadcast failed on a
        dead member, may never send the rest of the chunk to this one, and it has moved on
        to the next roll call while gloo works still in flight keep the old connections
        open, so the wait would last the group's timeout (measured: 30 s in 10 of 30
        SIGKILLs of a newcomer while the state streamed). The chunk is left behind
        instead, with the group, until gloo is done with it (`_left_behind`): destroying
        the group now would wait for that broadcast just the same."""
        pending, self.pending = self.pending, None
        if pending is not None:
            _, buffer, work = pending
            if broken and self.group.device.type != "cuda":
                _left_behind.append((buffer, work, self.group))
            else:
                try:
                    work.wait()
                except RuntimeError as error:  # the group failed: the chunk is moot
                    LOG.debug("a chunk of the state stream failed (%s)", error)
        self.releasing()

    def releasing(self) -> None:
        hooks, self.hooks = self.hooks, []
        for hook in hooks:
            hook.remove()
