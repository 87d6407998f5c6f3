"""Steady-state step time of the trainer runtime against plain DistributedDataParallel.

Method (made to hold on a small machine shared with other work):
- Two sides, each two worker processes on CPU (gloo, one torch thread each), the same model,
  data, per-rank batch and optimizer: `ddp` is a plain DDP loop (`init_process_group` from
  MASTER_ADDR/PORT, a fixed slice of a shuffled index per step); `ours` is the same loop
  inside `trainer_runtime.torch.session`, with its coordinator running.
- All four workers and the coordinator live for the whole run. After its warm-up (imports,
  group formation, first steps) each worker waits on its stdin; the driver then runs the
  two sides in alternating blocks of a fixed number of steps (ddp, ours, ours, ddp, ddp, ...),
  so both sides see the same background load, drift included. The side that does not run
  sleeps on a pipe and takes no CPU; ours keeps its background threads (watch stream,
  commits) and its coordinator, as in a real job.
- A step is timed from before the batch is fetched (for ours: the step-boundary check and
  cutting the step window) to after the optimizer step, back to back; the first steps of
  each block are dropped (the two ranks resume from a pipe at slightly different moments).
- Each block gives its mean wall time per step (rank 0's) and its CPU time per step (process
  time of each worker, all its threads: gloo's, the runtime's background threads; summed
  over the two ranks). Means per block, so that periodic work (a batched commit) is charged
  to the steps; medians over blocks, so that a block hit by an outside burst of load does
  not move them. CPU time is much less inflated by other load than wall time, and shows
  where the runtime spends work of its own.
- The coordinator is part of ours' cost: its CPU time during ours' blocks (Linux
  per-thread schedstat, to the nanosecond) is added to `ours_cpu_s` and shown alone as
  `ours_coordinator_cpu_s`; what ours' idle processes (coordinator and sleeping workers)
  use while DDP runs is `ours_idle_cpu_share` (CPU seconds per second), a cost the DDP
  blocks bear too, so the wall ratio understates ours' cost by about that much.
- `ratio` is the median over pairs of neighbouring blocks of ours / DDP wall time (robust
  to slow drift of the outside load); `ratio_of_medians` divides the two block medians;
  `cpu_ratio` divides the CPU medians; `*_main_cpu_s` is the training thread alone.

Two models: the tiny float64 MLP of the runtime tests, and an MLP of about 22M float32
parameters ("25m"). One JSON line per model:

`{"model": "tiny", "ddp_step_s": ..., "ours_step_s": ..., "ratio": ..., ...}`

Run: `python benchmarks/step_overhead.py [--models tiny 25m] [--blocks N]`. Worker mode
(`--role ddp|ours`) is internal: it reads `run` / `stop` lines and answers JSON lines.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import queue
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from trainer_runtime.environment import trust_environ  # noqa: E402
from trainer_runtime.protocol.credentials import Issuer, JobCredentials  # noqa: E402

CREDENTIALS = JobCredentials(Issuer.generate(), "step-overhead")
WORKERS = 2
REPLY = "@edl "
START_TIMEOUT_S = 300.0
BLOCK_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class Setting:
    """One model's run: warm-up steps, blocks per side, steps per block (the first `skip`
    of each dropped), samples per rank and step."""

    name: str
    warmup: int
    blocks: int
    block: int
    skip: int
    per_rank: int

    def total_steps(self, blocks: int) -> int:
        return self.warmup + blocks * self.block

    def samples(self, blocks: int) -> int:
        return self.per_rank * WORKERS * self.total_steps(blocks)


SETTINGS = {
    "tiny": Setting("tiny", warmup=200, blocks=30, block=100, skip=5, per_rank=16),
    "25m": Setting("25m", warmup=4, blocks=8, block=5, skip=1, per_rank=32),
}


def building(name: str, samples: int):  # type: ignore[no-untyped-def]
    """(model, dataset tensors) of a setting, identical in every process."""
    import torch
    from torch import nn

    sys.path.insert(0, str(REPO))
    from tests.runtime.torch_job import mlp, mlp_data

    if name == "tiny":
        return mlp(), mlp_data(samples).tensors
    torch.manual_seed(0)
    width = 2048
    layers: list[nn.Module] = [nn.Linear(512, width)]
    for _ in range(5):
        layers += [nn.ReLU(), nn.Linear(width, width)]
    layers += [nn.ReLU(), nn.Linear(width, 10)]
    model = nn.Sequential(*layers)
    generator = torch.Generator().manual_seed(1)
    inputs = torch.randn(samples, 512, generator=generator)
    targets = torch.randint(0, 10, (samples,), generator=generator)
    return model, (inputs, targets)


# ----- worker side -----


def replying(message: object) -> None:
    sys.stdout.write(REPLY + json.dumps(message) + "\n")
    sys.stdout.flush()


def serving_blocks(stepping: Callable[[], None], setting: Setting) -> None:
    """Warm up, then run one timed block per `run` line until `stop`."""
    for _ in range(setting.warmup):
        stepping()
    replying({"ready": True})
    for line in sys.stdin:
        if line.strip() != "run":
            return
        wall0 = cpu0 = main0 = 0.0
        for index in range(setting.block):
            if index == setting.skip:
                wall0, cpu0, main0 = time.perf_counter(), time.process_time(), time.thread_time()
            stepping()
        measured = setting.block - setting.skip
        replying(
            {
                "wall_s": (time.perf_counter() - wall0) / measured,
                "cpu_s": (time.process_time() - cpu0) / measured,
                "main_cpu_s": (time.thread_time() - main0) / measured,
            }
        )


def ddp_worker(name: str, blocks: int) -> None:
    import datetime

    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel

    torch.set_num_threads(1)
    setting = SETTINGS[name]
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=BLOCK_TIMEOUT_S))
    rank, world = dist.get_rank(), dist.get_world_size()
    model, (inputs, targets) = building(name, setting.samples(blocks))
    ddp = DistributedDataParallel(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    order = torch.randperm(len(inputs), generator=torch.Generator().manual_seed(2))
    step = 0

    def stepping() -> None:
        nonlocal step
        start = (step * world + rank) * setting.per_rank
        step += 1
        index = order[start : start + setting.per_rank]
        loss = nn.functional.cross_entropy(ddp(inputs[index]), targets[index])
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    serving_blocks(stepping, setting)
    dist.destroy_process_group()


def ours_worker(name: str, blocks: int) -> None:
    import torch
    from torch import nn
    from torch.utils.data import TensorDataset

    sys.path.insert(0, str(REPO))
    from trainer_runtime.torch import KeepGlobalBatch, session

    torch.set_num_threads(1)
    setting = SETTINGS[name]
    model, (inputs, targets) = building(name, setting.samples(blocks))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    dataset = TensorDataset(inputs, targets)
    with session(model, optimizer, dataset, KeepGlobalBatch(setting.per_rank * WORKERS)) as s:
        batches = s.batches()

        def stepping() -> None:
            batch_inputs, batch_targets = next(batches)
            s.step(nn.functional.cross_entropy(s.model(batch_inputs), batch_targets))

        serving_blocks(stepping, setting)
        if s.world_size != WORKERS or s.generations_formed != 1:
            raise SystemExit(f"the group re-formed during the run: {s.generations_formed}")
        if next(batches, None) is not None:
            raise SystemExit("the dataset was not used up: blocks and samples disagree")


# ----- driver side -----


class Worker:
    """One worker process, driven through its stdin; its replies arrive on a queue."""

    def __init__(self, argv: list[str], env: dict[str, str], log: Path) -> None:
        self.log = log
        self.process = subprocess.Popen(
            argv, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            stderr=log.open("w"),
        )  # fmt: skip
        self.replies: queue.Queue[dict[str, Any] | None] = queue.Queue()
        threading.Thread(target=self.reading, daemon=True).start()

    def reading(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            if line.startswith(REPLY):
                self.replies.put(json.loads(line[len(REPLY) :]))
        self.replies.put(None)

    def telling(self, command: str) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(command + "\n")
        self.process.stdin.flush()

    def reply(self, timeout_s: float, what: str) -> dict[str, Any]:
        try:
            message = self.replies.get(timeout=timeout_s)
        except queue.Empty as error:
            raise TimeoutError(f"{what}: no answer within {timeout_s:.0f} s") from error
        if message is None:
            tail = self.log.read_text(errors="replace")[-3000:]
            raise RuntimeError(f"{what}: the worker exited ({self.process.wait()}):\n{tail}")
        return message


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def starting_coordinator(setting: Setting, blocks: int, root: Path) -> tuple[Any, str]:
    global_batch = setting.per_rank * WORKERS
    shard = global_batch * math.gcd(setting.total_steps(blocks), 10)
    port_file = root / "port"
    coordinator = subprocess.Popen(
        [sys.executable, "-m", "trainer_runtime.coordinator",
         "--samples", str(setting.samples(blocks)), "--shard-size", str(shard),
         "--join-window-s", "5", "--port-file", str(port_file)],
        env={**os.environ, **trust_environ(CREDENTIALS), "PYTHONPATH": str(REPO)},
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    deadline = time.monotonic() + 60
    while not (port_file.exists() and port_file.read_text()):
        if time.monotonic() > deadline or coordinator.poll() is not None:
            coordinator.kill()
            raise TimeoutError("the coordinator did not start")
        time.sleep(0.05)
    return coordinator, f"127.0.0.1:{port_file.read_text()}"


def starting_sides(name: str, blocks: int, address: str, root: Path) -> dict[str, list[Worker]]:
    sys.path.insert(0, str(REPO))
    from trainer_runtime.client import CoordinatorClient

    client = CoordinatorClient(address, CREDENTIALS.controller())
    client.set_target(WORKERS)
    client.close()
    base = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    argv = [sys.executable, __file__, "--model", name, "--blocks", str(blocks), "--role"]
    port = free_port()
    sides: dict[str, list[Worker]] = {"ddp": [], "ours": []}
    for rank in range(WORKERS):
        env = {**base, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
               "RANK": str(rank), "WORLD_SIZE": str(WORKERS)}  # fmt: skip
        sides["ddp"].append(Worker([*argv, "ddp"], env, root / f"ddp{rank}.log"))
        env = {**base, "EDL_JOB_TOKEN": CREDENTIALS.worker(f"w{rank}"),
               "EDL_COORDINATOR": address, "EDL_JOB_ID": "job",
               "EDL_WORKER_ID": f"w{rank}", "EDL_TIMEOUT_S": "60"}  # fmt: skip
        sides["ours"].append(Worker([*argv, "ours"], env, root / f"ours{rank}.log"))
    return sides


def cpu_of(processes: list[subprocess.Popen[Any]]) -> float:
    """CPU seconds the processes' live threads have run so far, to the nanosecond (Linux's
    per-thread schedstat; the tick-based counters are too coarse for one block)."""
    total = 0
    for process in processes:
        for task in Path(f"/proc/{process.pid}/task").iterdir():
            try:
                total += int((task / "schedstat").read_text().split()[0])
            except (FileNotFoundError, ProcessLookupError):  # the thread just ended
                continue
    return total / 1e9


def measuring(name: str, blocks: int) -> dict[str, object]:
    setting = SETTINGS[name]
    root = Path(tempfile.mkdtemp(prefix=f"edl-overhead-{name}-"))
    coordinator, address = starting_coordinator(setting, blocks, root)
    sides: dict[str, list[Worker]] = {}
    walls: dict[str, list[float]] = {"ddp": [], "ours": []}
    cpus: dict[str, list[float]] = {"ddp": [], "ours": []}
    mains: dict[str, list[float]] = {"ddp": [], "ours": []}
    coordinator_cpu = idle_cpu = ddp_wall = 0.0
    try:
        sides = starting_sides(name, blocks, address, root)
        for side, workers in sides.items():
            for worker in workers:
                worker.reply(START_TIMEOUT_S, f"{side} warm-up")
        idle_processes = [coordinator, *(w.process for w in sides["ours"])]
        for pair in range(blocks):
            for side in ("ddp", "ours") if pair % 2 == 0 else ("ours", "ddp"):
                watched = idle_processes if side == "ddp" else [coordinator]
                started, before = time.perf_counter(), cpu_of(watched)
                for worker in sides[side]:
                    worker.telling("run")
                answers = [w.reply(BLOCK_TIMEOUT_S, f"{side} block") for w in sides[side]]
                used = cpu_of(watched) - before
                if side == "ddp":  # what ours' idle processes cost the machine meanwhile
                    idle_cpu += used
                    ddp_wall += time.perf_counter() - started
                else:  # the coordinator's share of ours' steps
                    coordinator_cpu += used
                walls[side].append(answers[0]["wall_s"])
                cpus[side].append(sum(a["cpu_s"] for a in answers))
                mains[side].append(statistics.fmean(a["main_cpu_s"] for a in answers))
        for side, workers in sides.items():
            for worker in workers:
                worker.telling("stop")
            for worker in workers:
                if worker.process.wait(timeout=BLOCK_TIMEOUT_S) != 0:
                    raise RuntimeError(f"a {side} worker failed: {worker.process.returncode}")
    finally:
        for process in [coordinator, *(w.process for ws in sides.values() for w in ws)]:
            if process.poll() is None:
                process.kill()
                process.wait(timeout=10)
    ddp_s, ours_s = statistics.median(walls["ddp"]), statistics.median(walls["ours"])
    coordinator_step = coordinator_cpu / (blocks * setting.block)
    ddp_cpu = statistics.median(cpus["ddp"])
    ours_cpu = statistics.median(cpus["ours"]) + coordinator_step
    pairs = [o / d for o, d in zip(walls["ours"], walls["ddp"], strict=True)]
    return {
        "model": name,
        "ddp_step_s": round(ddp_s, 6),
        "ours_step_s": round(ours_s, 6),
        "ratio": round(statistics.median(pairs), 3),
        "ratio_of_medians": round(ours_s / ddp_s, 3),
        "ddp_cpu_s": round(ddp_cpu, 6),
        "ours_cpu_s": round(ours_cpu, 6),
        "cpu_ratio": round(ours_cpu / ddp_cpu, 3),
        "ours_coordinator_cpu_s": round(coordinator_step, 6),
        "ours_idle_cpu_share": round(idle_cpu / ddp_wall, 4),
        "ddp_main_cpu_s": round(statistics.median(mains["ddp"]), 6),
        "ours_main_cpu_s": round(statistics.median(mains["ours"]), 6),
        "blocks": blocks,
        "steps_per_block": setting.block - setting.skip,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", nargs="+", choices=sorted(SETTINGS), default=["tiny", "25m"])
    parser.add_argument("--blocks", type=int, help="blocks per side (default: per model)")
    parser.add_argument("--role", choices=["ddp", "ours"], help=argparse.SUPPRESS)
    parser.add_argument("--model", choices=sorted(SETTINGS), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.role:
        worker = ddp_worker if args.role == "ddp" else ours_worker
        worker(args.model, args.blocks)
        return
    for name in args.models:
        print(json.dumps(measuring(name, args.blocks or SETTINGS[name].blocks)), flush=True)


if __name__ == "__main__":
    main()
