"""The GPU check's `step_overhead`: the steady step time of our session against plain DDP,
for two models: the MLP of about 22M parameters ("mlp25m", float32, 32 samples a rank) and
a GPT-style transformer of about 124M parameters in bfloat16 autocast ("gpt124m", 8
sequences of 1,024 tokens a rank; `gpt_model.py`, built here, no download).

Both sides run at once, each rank a process of its own (`--role overhead`), and are timed
in alternating blocks (ddp, ours, ours, ddp, ...) so that a drift of the machine weighs on
both alike; `ratio` is the median of ours over the median of DDP. `--quick` (inherited by
the workers through QUICK_ENV) runs few, short blocks: a dry run of the script itself.
What must stay true: both sides train the same model on the same samples at the same
per-rank batch.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.gpu_check_jobs import (
    SCRIPT,
    free_port,
    python_path,
    running_job,
    separate_hosts,
)
from trainer_runtime.environment import TIMEOUT_S

# `--quick` (inherited by the workers through QUICK_ENV): a dry run of the script itself
QUICK_ENV = "EDL_GPU_CHECK_QUICK"
#: Samples a rank steps on, per model.
PER_RANK = {"mlp25m": 32, "gpt124m": 8}
MODELS = tuple(PER_RANK)
#: Per model: warm-up steps, blocks per side, steps per block, steps dropped at a block's
#: start. The transformer's steps at world 2 move 0.5 GB of gradients over sockets each
#: (two "hosts" on one GPU): fewer of them keep the whole check within its minutes.
SCHEDULE = {"mlp25m": (30, 8, 60, 5), "gpt124m": (10, 4, 20, 3)}
QUICK = (3, 2, 4, 1)


def schedule(model: str) -> tuple[int, int, int, int]:
    """`model`'s (warm-up, blocks, block, skip); the dry run's under `--quick`."""
    return QUICK if os.environ.get(QUICK_ENV) == "1" else SCHEDULE[model]


def going_quick() -> None:
    """`--quick`: few, short blocks, here and in every worker started from now on."""
    os.environ[QUICK_ENV] = "1"


def built(name: str, samples: int) -> tuple[Any, tuple[Any, ...], Callable[..., Any]]:
    """(model, dataset tensors, loss of the model on one batch of them) of `name`; the
    transformer at its dry-run size under `--quick`."""
    import torch

    from benchmarks.gpt_model import GPT_124M, GPT_DRY_RUN, building_gpt, gpt_loss
    from benchmarks.step_overhead import building

    if name == "mlp25m":  # as the CPU benchmark (`step_overhead.py`, "25m") builds it
        model, tensors = building("25m", samples)
        return model, tensors, lambda m, x, y: torch.nn.functional.cross_entropy(m(x), y)
    config = GPT_DRY_RUN if os.environ.get(QUICK_ENV) == "1" else GPT_124M
    model, tokens = building_gpt(config, samples)
    return model, (tokens,), gpt_loss


def blocks_served(
    stepping: Callable[[], None], synchronizing: Callable[[], None], model: str
) -> None:
    """Warm up, answer 'ready', then one timed block per 'run' line on stdin."""
    warmup, _, block, skip = schedule(model)
    for _ in range(warmup):
        stepping()
    synchronizing()
    print("@ready", flush=True)
    for line in sys.stdin:
        if line.strip() != "run":
            return
        started = 0.0
        for index in range(block):
            if index == skip:
                synchronizing()
                started = time.perf_counter()
            stepping()
        synchronizing()
        print(f"@block {(time.perf_counter() - started) / (block - skip)}", flush=True)


def overhead_worker(args: argparse.Namespace) -> None:
    import datetime

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data import TensorDataset

    device = torch.device(args.device)
    world, per_rank = args.world, PER_RANK[args.model]
    warmup, blocks, block, _ = schedule(args.model)
    samples = per_rank * world * (warmup + blocks * block)
    model, tensors, loss_of = built(args.model, samples)
    model = model.to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    def synchronizing() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize()

    if args.side == "ddp":
        dist.init_process_group(
            "nccl" if device.type == "cuda" else "gloo",
            init_method=f"tcp://127.0.0.1:{args.port}", rank=args.rank, world_size=world,
            timeout=datetime.timedelta(seconds=120),
        )  # fmt: skip
        ddp = DistributedDataParallel(model)
        step = 0

        def stepping() -> None:
            nonlocal step
            start = (step * world + args.rank) * per_rank
            step += 1
            batch = [t[start : start + per_rank].to(device, non_blocking=True) for t in tensors]
            loss_of(ddp, *batch).backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

        blocks_served(stepping, synchronizing, args.model)
        dist.destroy_process_group()
        return
    from trainer_runtime.torch import KeepGlobalBatch, session

    with session(model, optimizer, TensorDataset(*tensors), KeepGlobalBatch(per_rank * world)) as s:
        batches = s.batches()

        def stepping() -> None:
            batch = [t.to(device, non_blocking=True) for t in next(batches)]
            s.step(loss_of(s.model, *batch))

        blocks_served(stepping, synchronizing, args.model)
        for _ in batches:  # the walk's end: the session ends the job
            raise RuntimeError("steps left over after the timed blocks")


def overhead_check(
    logs: Path, device: str, mode: str, world: int, model: str = "mlp25m"
) -> dict[str, Any]:
    warmup, blocks, block, _ = schedule(model)
    samples = PER_RANK[model] * world * (warmup + blocks * block)
    # a long join window, closed by the target: every rank is in the first generation
    with running_job(logs, device, mode, samples, 1, window_s=120) as job:
        job.client.set_target(world)
        port = free_port()
        sides: dict[str, list[subprocess.Popen[str]]] = {"ddp": [], "ours": []}
        for rank in range(world):
            for side in ("ddp", "ours"):
                name = f"{side}{rank}"
                env = {**os.environ, **job.contract(name).to_environ(), "PYTHONPATH": python_path()}
                env[TIMEOUT_S] = "120"  # the other side's blocks run between this one's
                if mode == "hosts":
                    env.update(separate_hosts(name))
                sides[side].append(
                    subprocess.Popen(
                        [sys.executable, str(SCRIPT), "--role", "overhead", "--side", side,
                         "--device", device, "--world", str(world), "--rank", str(rank),
                         "--port", str(port), "--model", model],
                        env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                        stderr=(job.root / f"{name}.log").open("ab"), text=True,
                    )
                )  # fmt: skip

        def reply(process: subprocess.Popen[str]) -> str:
            assert process.stdout is not None
            for line in process.stdout:
                if line.startswith("@"):
                    return line.strip()
            raise RuntimeError(f"a worker ended early: {job.log('ours0')}")

        try:
            for processes in sides.values():
                for process in processes:
                    reply(process)  # @ready
            times: dict[str, list[float]] = {"ddp": [], "ours": []}
            order = ["ddp", "ours", "ours", "ddp"] * (blocks // 2)
            for side in order:
                for process in sides[side]:
                    assert process.stdin is not None
                    process.stdin.write("run\n")
                    process.stdin.flush()
                times[side].append(float(reply(sides[side][0]).split()[1]))
                for process in sides[side][1:]:
                    reply(process)
            for processes in sides.values():
                for process in processes:
                    assert process.stdin is not None
                    process.stdin.close()
            codes = [p.wait(timeout=120) for ps in sides.values() for p in ps]
        finally:
            for processes in sides.values():
                for process in processes:
                    if process.poll() is None:
                        os.kill(process.pid, signal.SIGKILL)
                        process.wait(timeout=10)
    ddp, ours = statistics.median(times["ddp"]), statistics.median(times["ours"])
    return {
        "ok": all(code == 0 for code in codes),
        "model": model, "world": world, "per_rank_batch": PER_RANK[model],
        "ddp_step_s": round(ddp, 6), "ours_step_s": round(ours, 6), "ratio": round(ours / ddp, 4),
        "blocks": len(times["ddp"]), "exit_codes": codes,
    }  # fmt: skip
