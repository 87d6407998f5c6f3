"""The leader's re-formation of the PS group at the start of every worker generation.

Rank 0 of a new generation runs this before anyone trains in it; the other workers wait
until their servers adopted the generation. Steps, in order:

1. Fence every server it can reach (the generation's servers and the retiring ones) at the
   new generation and read its status: from then on no call of an older generation changes
   any partition.
2. If the servers holding the last adopted layout still cover every parameter, settle them
   all to the highest watermark found (a step applied anywhere is complete everywhere, see
   `partition.py`): the cut is that watermark and nothing is lost. Otherwise (a server
   died, or the job is new) the cut is the newest complete snapshot, and every partition and
   the ledger go back to it; a new job first writes the leader's initial parameters as the
   snapshot of step 0.
3. Lay the parameters out over the generation's servers. A server that already holds its
   new range at the cut keeps it in memory; any other gets its range from the snapshot at
   the cut (written now, by the old holders, when no snapshot of the cut exists yet).
4. Release the servers that are no longer in the layout (retiring ones exit 0).
5. Make the coordinator's ledger agree with the cut: revert the committed steps above it,
   commit the windows up to it (`Reconcile`).

The guarantee: a PS that dies costs a rollback to the last snapshot (at most
`snapshot_every` steps plus the steps in flight), and the ledger rolls back with the
parameters, so no sample's update is lost or applied twice. A PS that is added or drained
costs no rollback: the cut is the current watermark.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from trainer_runtime.client import CoordinatorClient
from trainer_runtime.protocol.parameter_server import ps
from trainer_runtime.ps.layout import Piece, Table, laying_out, windows_between
from trainer_runtime.ps.snapshots import SnapshotDirectory
from trainer_runtime.ps.transport import GroupChanged, Links, ServerError
from trainer_runtime.sharding import DatasetPlan

LOG = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Optimizer:
    """The update rule every partition applies: SGD with momentum (PyTorch's formula)."""

    lr: float
    momentum: float = 0.0


@dataclass(frozen=True, slots=True)
class Model:
    """The flattened parameters: `size` elements of `dtype`, with its embedding tables."""

    size: int
    dtype: str
    tables: tuple[Table, ...] = ()


@dataclass(frozen=True, slots=True)
class Formation:
    generation: int
    cut: int
    pieces: tuple[Piece, ...]
    rolled_back: bool


def covering(statuses: dict[str, Any], size: int) -> list[tuple[str, Any]] | None:
    """The holders of the newest adopted layout, if their ranges tile `[0, size)`."""
    holders = [(a, s) for a, s in statuses.items() if s.holding == ps.HOLDING_RANGE]
    holders = [(a, s) for a, s in holders if s.size == size]
    if not holders:
        return None
    newest = max(s.adopted for _, s in holders)
    layout = sorted(((a, s) for a, s in holders if s.adopted == newest), key=lambda x: x[1].start)
    reached = 0
    for _, status in layout:
        if status.start != reached:
            return None
        reached = status.stop
    return layout if reached == size else None


def forming(
    links: Links,
    generation: int,
    servers: Sequence[tuple[str, str]],
    retiring: Sequence[tuple[str, str]],
    model: Model,
    optimizer: Optimizer,
    initial: npt.NDArray[Any],
    directory: SnapshotDirectory,
    snapshot_every: int,
) -> Formation:
    """Steps 1-4 above; returns the cut every partition now holds."""
    statuses: dict[str, Any] = {}
    for _, address in [*servers, *retiring]:
        try:
            statuses[address] = links.link(address).calling(
                "Fence", ps.FenceRequest(generation=generation), timeout_s=10.0
            )
        except GroupChanged as error:
            LOG.warning("server %s is not reachable while forming: %s", address, error)
    layout = covering(statuses, model.size)
    cut, rolled_back, keep = 0, False, set()
    if layout is not None:
        cut = max(status.watermark for _, status in layout)
        try:
            for address, _ in layout:
                links.link(address).calling(
                    "Settle", ps.SettleRequest(generation=generation, through=cut)
                )
            keep = {(address, s.start, s.stop) for address, s in layout}
        except ServerError as error:
            LOG.warning("cannot settle the partitions at step %d (%s): rolling back", cut, error)
            layout = None
    if layout is None:
        if not directory.steps():
            directory.writing(0, 0, model.size, initial, np.zeros_like(initial))
        cut = directory.latest_cut(model.size)
        rolled_back = bool(statuses) and any(
            s.holding == ps.HOLDING_RANGE for s in statuses.values()
        )
        LOG.warning("generation %d starts from the snapshot of step %d", generation, cut)
    pieces = laying_out(model.size, servers, model.tables)
    moving = [p for p in pieces if (p.address, p.start, p.stop) not in keep]
    if moving and layout is not None and not directory.covers(cut, model.size):
        links.everywhere(
            [
                lambda address=address: links.link(address).calling(  # type: ignore[misc]
                    "Snapshot", ps.FenceRequest(generation=generation)
                )
                for address, _ in layout
            ]
        )
    links.everywhere(
        [
            lambda piece=piece: links.link(piece.address).calling(  # type: ignore[misc]
                "Adopt",
                ps.AdoptRequest(
                    generation=generation,
                    start=piece.start,
                    stop=piece.stop,
                    size=model.size,
                    dtype=model.dtype,
                    lr=optimizer.lr,
                    momentum=optimizer.momentum,
                    step=cut,
                    from_snapshot=(piece.address, piece.start, piece.stop) not in keep,
                    snapshot_every=snapshot_every,
                    tables=[
                        ps.Table(start=t.start, rows=t.rows, row_length=t.row_length)
                        for t in model.tables
                    ],
                ),
            )
            for piece in pieces
        ]
    )
    serving = {p.address for p in pieces}
    for address in statuses:
        if address not in serving:
            with contextlib.suppress(GroupChanged):  # gone already
                links.link(address).calling("Release", ps.FenceRequest(generation=generation))
    if directory.covers(cut, model.size):
        directory.pruning_before(cut)
    return Formation(generation, cut, tuple(pieces), rolled_back)


def reconciling_ledger(
    client: CoordinatorClient,
    worker_id: str,
    generation: int,
    plan: DatasetPlan,
    batch: int,
    cut: int,
) -> None:
    """Step 5: the ledger takes back the steps above the cut and commits those up to it."""
    committed = int(client.view_ledger().committed_step)
    windows = windows_between(plan, batch, committed, cut) if committed < cut else []
    client.reconcile(worker_id, generation, cut, windows)
