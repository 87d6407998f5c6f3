"""The GPU check's `step_overhead`: the steady step time of our session against plain DDP.

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
PER_RANK, WARMUP, BLOCKS, BLOCK, SKIP = 32, 30, 8, 60, 5
QUICK = (3, 2, 4, 1)
if os.environ.get(QUICK_ENV) == "1":
    WARMUP, BLOCKS, BLOCK, SKIP = QUICK


def going_quick() -> None:
    """`--quick`: few, short blocks, here and in every worker started from now on."""
    global WARMUP, BLOCKS, BLOCK, SKIP
    os.environ[QUICK_ENV] = "1"
    WARMUP, BLOCKS, BLOCK, SKIP = QUICK


def model_25m(samples: int) -> tuple[Any, Any, Any]:
    """The MLP of about 22M parameters and its data, as the CPU benchmark
    (`step_overhead.py`, setting "25m") builds them."""
    from benchmarks.step_overhead import building

    model, (inputs, targets) = building("25m", samples)
    return model, inputs, targets


def blocks_served(stepping: Callable[[], None], synchronizing: Callable[[], None]) -> None:
    """Warm up, answer 'ready', then one timed block per 'run' line on stdin."""
    for _ in range(WARMUP):
        stepping()
    synchronizing()
    print("@ready", flush=True)
    for line in sys.stdin:
        if line.strip() != "run":
            return
        started = 0.0
        for index in range(BLOCK):
            if index == SKIP:
                synchronizing()
                started = time.perf_counter()
            stepping()
        synchronizing()
        print(f"@block {(time.perf_counter() - started) / (BLOCK - SKIP)}", flush=True)


def overhead_worker(args: argparse.Namespace) -> None:
    import datetime

    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data import TensorDataset

    device = torch.device(args.device)
    world = args.world
    samples = PER_RANK * world * (WARMUP + BLOCKS * BLOCK)
    model, inputs, targets = model_25m(samples)
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
            start = (step * world + args.rank) * PER_RANK
            step += 1
            batch = inputs[start : start + PER_RANK].to(device, non_blocking=True)
            target = targets[start : start + PER_RANK].to(device, non_blocking=True)
            nn.functional.cross_entropy(ddp(batch), target).backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

        blocks_served(stepping, synchronizing)
        dist.destroy_process_group()
        return
    from trainer_runtime.torch import KeepGlobalBatch, session

    with session(
        model, optimizer, TensorDataset(inputs, targets), KeepGlobalBatch(PER_RANK * world)
    ) as s:
        batches = s.batches()

        def stepping() -> None:
            batch, target = next(batches)
            batch = batch.to(device, non_blocking=True)
            target = target.to(device, non_blocking=True)
            s.step(nn.functional.cross_entropy(s.model(batch), target))

        blocks_served(stepping, synchronizing)
        for _ in batches:  # the walk's end: the session ends the job
            raise RuntimeError("steps left over after the timed blocks")


def overhead_check(logs: Path, device: str, mode: str, world: int) -> dict[str, Any]:
    samples = PER_RANK * world * (WARMUP + BLOCKS * BLOCK)
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
                         "--port", str(port)],
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
            order = ["ddp", "ours", "ours", "ddp"] * (BLOCKS // 2)
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
        "model": "25m", "world": world, "per_rank_batch": PER_RANK,
        "ddp_step_s": round(ddp, 6), "ours_step_s": round(ours, 6), "ratio": round(ours / ddp, 4),
        "blocks": len(times["ddp"]), "exit_codes": codes,
    }  # fmt: skip
