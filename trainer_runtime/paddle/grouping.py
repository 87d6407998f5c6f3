"""Forming a PaddlePaddle process group for each generation, inside the running process.

Paddle's default group cannot be re-initialized in a process (a second
`init_parallel_env` fails in C++: "unique key 0 already exists"), so the adapter never
uses it. Instead every generation builds a group of its own, `ProcessGroupGloo` (CPU) or
`ProcessGroupNCCL` (GPU), with a fresh group id (`GROUP_ID_BASE + generation`), meeting
in a TCPStore server of its own that its rank 0 starts for it (the port is published in
the store that worker has hosted since it started, whose address it registered): Paddle
does not namespace all of a group's rendezvous keys by its id, so groups never share a
store. A Paddle group cannot be torn down (its connections stay open),
and freeing one while newer ones form was measured to break their rendezvous, so the
session keeps every old group for the life of the process. No process restart, no
re-import, no checkpoint reload.

Collectives go straight to the group object: gradients are averaged in flat buckets, one
allreduce per bucket, the last one carrying a stop flag so that all ranks leave a
generation at the same step boundary; rank 0's model, optimizer accumulators and a small
picklable header (the ledger view, the policy state) are broadcast at every generation.

A generation may take several attempts to form (a member that failed to form it, or whose
step failed, while the coordinator saw nobody leave, forms the same generation again): each
attempt meets under keys and a group id of its own (`GROUP_ID_BASE + generation *
ATTEMPTS_PER_GENERATION + attempt`), so a late member of a given-up attempt never mixes
with the next one.

What must stay true: no member builds a group another member gave up on (the roll call's
one verdict per attempt, `trainer_runtime.rollcall`); every wait is bounded (the store
connections, the roll call and the group constructor by the contract's timeout or a newer
generation; gloo connects every pair of members, so a collective whose peer died raises at
once in every member, and one whose peer went silent after gloo's own 30 s); after
`broadcasting_state` returns, all members hold rank 0's state.
"""

from __future__ import annotations

import os
import pickle
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import paddle
from paddle.base import core
from paddle.distributed import collective

from trainer_runtime.agent import Assignment
from trainer_runtime.generations import holding_state
from trainer_runtime.noise import NoiseSample
from trainer_runtime.paddle.stores import StoreHost, connecting, helping
from trainer_runtime.rollcall import calling_roll

# Far above the ids Paddle hands out itself (0 for the default group, then 1, 2, ...).
GROUP_ID_BASE = 1_000_000
# Attempts at forming one generation that get group ids of their own (the session gives up
# on a generation well before: see MAX_FAILED_FORMATIONS in session.py).
ATTEMPTS_PER_GENERATION = 16
BUCKET_BYTES = 16 * 1024 * 1024


def backend_for(place: str) -> str:
    return "nccl" if place.startswith("gpu") else "gloo"


@dataclass(frozen=True, slots=True)
class Group:
    """One generation's process group, and this worker's place in it."""

    process_group: Any
    rank: int
    world_size: int
    generation: int
    store: Any = None  # the generation's own store, alive as long as its group

    def all_reduce(self, tensor: paddle.Tensor) -> None:
        self.process_group.all_reduce(tensor, core.ReduceOp.SUM, True).wait()

    def broadcast(self, tensor: paddle.Tensor) -> None:
        self.process_group.broadcast(tensor, 0, True).wait()

    def agreeing(self, ready: bool) -> bool:
        """Whether every member is `ready` (a barrier that carries a vote, so that a member
        that cannot go on never leaves its peers waiting in a collective)."""
        votes = paddle.to_tensor([1.0 if ready else 0.0], dtype="float32")
        self.all_reduce(votes)
        return bool(votes.numpy()[0] >= self.world_size)


def forming(
    assignment: Assignment,
    attempt: int,
    stores: StoreHost,
    given_up: Callable[[], bool],
    timeout_s: float,
) -> Group:
    """Join attempt `attempt` at this generation's group (the caller keeps the previous
    group alive).

    Two Paddle facts shape this. The group constructor writes rendezvous keys that are not
    all namespaced by the group id, so two groups built on one store can read each other's
    peer addresses (seen as torn addresses and refused connections): every attempt
    therefore meets in a store of its own, a new server that rank 0 starts and whose port
    it publishes in the store it registered. And the constructor waits without a bound for
    every member (measured: blocked in the store's wait for a member that never came, far
    past the store's timeout): so the roll call (`trainer_runtime.rollcall`) comes first,
    with counters only, in the registered store, and the constructor then runs in a helper
    thread that the caller stops waiting for after `timeout_s`, or as soon as a newer
    generation opened. The store connections are bounded alike (`connecting`).
    """
    if not 0 <= attempt < ATTEMPTS_PER_GENERATION:
        raise RuntimeError(
            f"generation {assignment.generation} failed to form {attempt} times while its "
            "membership stayed the same; this worker stops"
        )
    leader = next(p for p in assignment.peers if p.rank == 0)
    place = str(paddle.device.get_device())
    backend = backend_for(place)
    # Paddle's C++ reads the process's global rank from here when it builds a group.
    os.environ["PADDLE_TRAINER_ID"] = str(assignment.rank)
    if backend == "nccl":
        core.CommContextManager.set_device_id(int(place.split(":")[1]))
    tag = f"g{assignment.generation}a{attempt}"
    port_key = f"edl/{tag}/port"
    try:
        deadline = time.monotonic() + timeout_s
        registered = stores.store_of(leader.store_address, given_up, deadline)
        own: Any = None
        if assignment.rank == 0:
            own, port = stores.hosting()
            registered.add(port_key, port)
        calling_roll(
            registered,
            f"edl/{tag}/",
            assignment.rank,
            assignment.world_size,
            given_up,
            deadline,
        )
        if own is None:
            port = int(registered.add(port_key, 0))
            host = leader.store_address.rsplit(":", 1)[0]
            own = connecting(host, port, stores.timeout_s, given_up, deadline)
        make: Any = collective._new_process_group_impl  # no public API takes a group id
        process_group = building(
            lambda: make(
                backend,
                own,
                assignment.rank,
                assignment.world_size,
                f"edl_{tag}",
                pg_options=None,
                group_id=GROUP_ID_BASE + assignment.generation * ATTEMPTS_PER_GENERATION + attempt,
            ),
            given_up,
            time.monotonic() + timeout_s,
            f"generation {assignment.generation} (attempt {attempt})",
        )
    except ValueError as error:  # Paddle's store reports a lost connection so
        stores.forgetting(leader.store_address)
        raise RuntimeError(f"generation {assignment.generation} did not form: {error}") from error
    return Group(process_group, assignment.rank, assignment.world_size, assignment.generation, own)


def building(
    make: Callable[[], Any], given_up: Callable[[], bool], deadline: float, what: str
) -> Any:
    """Run Paddle's group constructor in a helper thread (`helping`); its group, or
    `RuntimeError` at `deadline` or once `given_up()`.

    The constructor has no bound of its own: it waits for every member's address, and a
    member that died after the roll call never writes one. A constructor given up on
    stays blocked in its thread, holding that attempt's store connection and half-made
    group; nothing else uses them, and the attempt's keys and group id are never reused.
    """
    return helping(
        make,
        given_up,
        deadline,
        f"the group of {what} was not built: a member that answered the roll call never "
        "joined it (it left, died or failed since)",
    )


def buckets(tensors: Sequence[paddle.Tensor]) -> Iterator[list[paddle.Tensor]]:
    """Consecutive tensors of one dtype, up to BUCKET_BYTES each (one allreduce apiece)."""
    bucket: list[paddle.Tensor] = []
    size = 0
    for tensor in tensors:
        nbytes = int(tensor.numel()) * tensor.element_size()
        if bucket and (tensor.dtype != bucket[0].dtype or size + nbytes > BUCKET_BYTES):
            yield bucket
            bucket, size = [], 0
        bucket.append(tensor)
        size += nbytes
    if bucket:
        yield bucket


@dataclass(slots=True)
class NoiseProbe:
    """Asks `averaging_gradients` to measure the gradient noise on the way (see
    `trainer_runtime/noise.py`): this rank's samples and loss scale in, the step's
    `NoiseSample` out (None when nothing could be measured)."""

    local_samples: int
    loss_scale: float
    batch: int  # the step's samples, over all ranks
    sample: NoiseSample | None = None


MEASURED_DTYPES = (paddle.float32, paddle.float64)


def averaging_gradients(
    group: Group,
    parameters: Sequence[paddle.Tensor],
    news: Sequence[float],
    probe: NoiseProbe | None = None,
) -> list[float]:
    """Replace every gradient by its mean over the group, and return the sum over the
    group of each rank's `news` (whether it asks to stop at this step boundary, then rank
    0's re-decision of an adaptive batch: `generations.proposing_batch`).

    The news rides in the last bucket's allreduce as extra elements, so every rank of a
    generation leaves, or changes its batch, at the same step boundary: the members learn
    of a new generation at different moments, and a rank that left alone would leave its
    peers waiting in the next collective. (Gradients in a half precision would round a
    batch size: the news then takes an allreduce of its own, in float32, on every rank
    alike.) A parameter without a gradient this step contributes zeros, so every rank runs
    the same collectives. With a `probe` (every rank of the group alike), the last bucket
    carries three more elements (this rank's |g_i|^2, 1/b_i and 1), and each bucket's
    squared norm is taken before and after its allreduce.
    """
    grads: list[paddle.Tensor] = []
    summed = list(news)
    with paddle.no_grad():
        for parameter in parameters:
            if parameter.grad is None:
                parameter.grad = paddle.zeros_like(parameter)
            grads.append(parameter.grad)
        scale = 1.0 / group.world_size
        cut = list(buckets(grads))
        measuring = (
            probe is not None and bool(cut) and all(b[0].dtype in MEASURED_DTYPES for b in cut)
        )
        local_sqr: list[paddle.Tensor] = []
        global_sqr: list[paddle.Tensor] = []
        riding = bool(cut) and cut[-1][0].dtype in MEASURED_DTYPES
        extra = (len(news) if riding else 0) + (3 if measuring else 0)
        if not riding:
            alone = paddle.to_tensor(list(news), dtype=paddle.float32)
            group.all_reduce(alone)
            summed = [float(v) for v in alone.numpy()]
        for position, bucket in enumerate(cut):
            pieces = [g.reshape([-1]) for g in bucket]
            last = position == len(cut) - 1
            if measuring:
                body = paddle.concat(pieces)
                local_sqr.append(paddle.dot(body, body))
                pieces = [body]
            if last:
                if riding:
                    pieces.append(paddle.to_tensor(list(news), dtype=bucket[0].dtype))
                if measuring:
                    assert probe is not None
                    pieces.append(carried_scalars(probe, local_sqr, bucket[0].dtype))
            flat = pieces[0] if len(pieces) == 1 and measuring else paddle.concat(pieces)
            group.all_reduce(flat)
            if last and extra:
                carried = [float(v) for v in flat[-extra:].numpy()]
                if riding:
                    summed = carried[: len(news)]
                flat = flat[:-extra]
            flat.scale_(scale)
            if measuring:
                global_sqr.append(paddle.dot(flat, flat))
            parts = paddle.split(flat, [int(g.numel()) for g in bucket])
            for grad, part in zip(bucket, parts, strict=True):
                grad.set_value(part.reshape(grad.shape))
        if measuring and probe is not None:
            scalars = carried[-3:]
            probe.sample = NoiseSample(
                local_sqr=scalars[0],
                inverse_batch=scalars[1],
                ranks=round(scalars[2]),
                global_sqr=float(paddle.add_n(global_sqr).numpy().sum()),
                batch=probe.batch,
            )
    return summed


def carried_scalars(probe: NoiseProbe, local_sqr: list[paddle.Tensor], dtype: Any) -> paddle.Tensor:
    """This rank's |g_i|^2 (the loss scale divided out), 1/b_i and 1; zeros for a rank
    whose slice is a stand-in sample."""
    if probe.loss_scale <= 0 or probe.local_samples <= 0:
        return paddle.zeros([3], dtype=dtype)
    local = paddle.add_n(local_sqr).reshape([1]) / (probe.loss_scale * probe.loss_scale)
    rest = paddle.to_tensor([1.0 / probe.local_samples, 1.0], dtype=dtype)
    return paddle.concat([local.astype(dtype), rest])


def broadcasting_object(group: Group, value: Any) -> Any:
    """Rank 0's `value` on every member (pickled: the members of a job trust each other)."""
    payload = pickle.dumps(value) if group.rank == 0 else b""
    length = paddle.to_tensor([len(payload)], dtype="int64")
    group.broadcast(length)
    size = int(length.numpy()[0])
    buffer = (
        paddle.to_tensor(list(payload), dtype="uint8")
        if group.rank == 0
        else paddle.zeros([size], dtype="uint8")
    )
    group.broadcast(buffer)
    return value if group.rank == 0 else pickle.loads(bytes(buffer.numpy().tobytes()))


def trainable(model: paddle.nn.Layer) -> list[paddle.Tensor]:
    return [p for p in model.parameters() if not p.stop_gradient]


def optimizer_tensors(optimizer: Any, parameters: Sequence[paddle.Tensor]) -> list[Any]:
    """The optimizer's state tensors in an order every process agrees on (accumulator
    kind, then parameter order), created first if the optimizer has not stepped yet.

    Paddle names accumulators with per-process counters, so two processes holding the
    same model may disagree on names: the state is matched by position, never by name.
    """
    program: Any = paddle.static.default_main_program()
    block = program.global_block()
    optimizer._create_accumulators(block, list(parameters))
    tensors: list[Any] = []
    for kind in sorted(optimizer._accumulators):
        by_name = optimizer._accumulators[kind]
        tensors.extend(by_name[p.name] for p in parameters if p.name in by_name)
    masters = getattr(optimizer, "_master_weights", None) or {}
    tensors.extend(masters[p.name] for p in parameters if p.name in masters)
    return tensors


def layout(tensors: Sequence[Any]) -> list[tuple[tuple[int, ...], str]]:
    return [(tuple(t.shape), str(t.dtype)) for t in tensors]


def broadcasting_state(
    group: Group,
    model: paddle.nn.Layer,
    optimizer: Any,
    extra: dict[str, Any] | None,
    mark: tuple[int, ...] | None = None,
) -> tuple[dict[str, Any] | None, bool]:
    """Make every member hold rank 0's parameters, buffers, optimizer state, learning
    rate and `extra`; returns `extra` as rank 0 sent it, and whether the parameters and
    optimizer state were sent. Rank 0 sends None to abandon the generation: then nothing
    else is sent, and every member gets None.

    `mark`: this member's `Member.state_mark`. When every member's equals rank 0's (one
    flag's allreduce says so), all hold its parameters and optimizer state already, and
    only the buffers are sent."""
    state = list(model.state_dict().values())
    accumulators = optimizer_tensors(optimizer, trainable(model))
    header = {
        "extra": extra,
        "model": layout(state),
        "optimizer": layout(accumulators),
        "lr": optimizer._learning_rate
        if isinstance(optimizer._learning_rate, float | int)
        else optimizer._learning_rate.state_dict(),
        "mark": mark,
    }
    sent = broadcasting_object(group, header)
    if sent["extra"] is None:
        return None, False
    for what, mine in (("model", layout(state)), ("optimizer", layout(accumulators))):
        if sent[what] != mine:
            raise ValueError(
                f"this worker's {what} state differs from rank 0's ({len(mine)} tensors "
                f"against {len(sent[what])}): every worker of a job must build the same "
                "model and optimizer"
            )
    holding = paddle.to_tensor([float(holding_state(mark, sent["mark"]))], dtype="float32")
    group.all_reduce(holding)  # (a sum: Paddle's groups here reduce by sum only)
    whole = round(float(holding.numpy()[0])) == group.world_size
    with paddle.no_grad():
        for tensor in model.buffers() if whole else state + accumulators:
            group.broadcast(tensor)
    if group.rank != 0:
        if isinstance(sent["lr"], dict):
            optimizer._learning_rate.set_state_dict(sent["lr"])
        else:
            optimizer.set_lr(float(sent["lr"]))
    result: dict[str, Any] | None = sent["extra"]
    return result, not whole
