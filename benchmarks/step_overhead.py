"""Steady-state step time of the trainer runtime against plain DistributedDataParallel.

The same model, data, per-rank batch and optimizer, two processes on CPU (gloo), one thread
each; once as a plain DDP loop (`init_process_group` from MASTER_ADDR/PORT, a fixed slice of
a shuffled index per step), once inside `trainer_runtime.torch.session` with a coordinator.
Each rank times every step (top of one loop iteration to the top of the next, so it includes
fetching the batch and, for ours, the step-boundary check and the background commit); rank
0's step times after the warm-up steps, once the group has its final size, are kept, and
the median is reported. Two models: the tiny float64 MLP of the runtime tests, and an MLP of
about 25M float32 parameters. One JSON line per model:

`{"model": "tiny", "ddp_step_s": ..., "ours_step_s": ..., "ratio": ...}`

Run: `python benchmarks/step_overhead.py [--models tiny 25m] [--rounds 4]`. Each round runs
both sides once, alternating which side goes first; the reported medians are over all kept
steps of all rounds. Worker mode (`--role ddp|ours`) is internal.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TOKEN = "step-overhead"
WORKERS = 2
TIMEOUT_S = 600.0


@dataclass(frozen=True)
class Setting:
    """One model's run: steps measured, warm-up steps dropped, samples per rank a step."""

    name: str
    steps: int
    warmup: int
    per_rank: int


SETTINGS = {
    "tiny": Setting("tiny", steps=800, warmup=200, per_rank=16),
    "25m": Setting("25m", steps=25, warmup=5, per_rank=32),
}


def building(name: str):  # type: ignore[no-untyped-def]
    """(model, dataset tensors) of a setting, identical in every process."""
    import torch
    from torch import nn

    sys.path.insert(0, str(REPO))
    from tests.runtime.torch_job import mlp, mlp_data

    setting = SETTINGS[name]
    samples = setting.per_rank * WORKERS * (setting.steps + setting.warmup + 10)
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


def ddp_worker(name: str, out: Path) -> None:
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel

    torch.set_num_threads(1)
    setting = SETTINGS[name]
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    model, (inputs, targets) = building(name)
    ddp = DistributedDataParallel(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    order = torch.randperm(len(inputs), generator=torch.Generator().manual_seed(2))
    stamps: list[float] = []
    for step in range(setting.steps + setting.warmup):
        stamps.append(time.perf_counter())
        start = (step * world + rank) * setting.per_rank
        index = order[start : start + setting.per_rank]
        loss = nn.functional.cross_entropy(ddp(inputs[index]), targets[index])
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    stamps.append(time.perf_counter())
    steps = [b - a for a, b in itertools.pairwise(stamps)]
    if rank == 0:
        (out / "ddp.json").write_text(json.dumps(steps[setting.warmup :]))
    dist.destroy_process_group()


def ours_worker(name: str, out: Path) -> None:
    import torch
    from torch import nn
    from torch.utils.data import TensorDataset

    sys.path.insert(0, str(REPO))
    from trainer_runtime.torch import KeepGlobalBatch, session

    torch.set_num_threads(1)
    setting = SETTINGS[name]
    model, (inputs, targets) = building(name)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    dataset = TensorDataset(inputs, targets)
    stamps: list[tuple[float, int]] = []
    with session(model, optimizer, dataset, KeepGlobalBatch(setting.per_rank * WORKERS)) as s:
        for batch_inputs, batch_targets in s.batches():
            stamps.append((time.perf_counter(), s.generations_formed))
            loss = nn.functional.cross_entropy(s.model(batch_inputs), batch_targets)
            s.step(loss)
            rank, world = s.rank, s.world_size
    if rank != 0 or world != WORKERS:
        return
    # keep only steps of the last generation, after its warm-up
    last = stamps[-1][1]
    moments = [at for at, formed in stamps if formed == last]
    steps = [b - a for a, b in itertools.pairwise(moments)]
    (out / "ours.json").write_text(json.dumps(steps[setting.warmup :]))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def waiting_all(processes: list[subprocess.Popen[bytes]], what: str) -> None:
    deadline = time.monotonic() + TIMEOUT_S
    for process in processes:
        try:
            process.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired as error:
            raise TimeoutError(f"{what} did not finish within {TIMEOUT_S:.0f} s") from error
        if process.returncode != 0:
            raise RuntimeError(f"{what} failed with exit status {process.returncode}")


def running_ddp(name: str, out: Path, processes: list[subprocess.Popen[bytes]]) -> list[float]:
    port = free_port()
    workers = []
    for rank in range(WORKERS):
        env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
               "RANK": str(rank), "WORLD_SIZE": str(WORKERS), "OMP_NUM_THREADS": "1",
               "PYTHONPATH": str(REPO)}  # fmt: skip
        workers.append(
            subprocess.Popen(
                [sys.executable, __file__, "--role", "ddp", "--model", name, "--out", str(out)],
                env=env,
            )
        )
        processes.append(workers[-1])
    waiting_all(workers, "the DDP run")
    steps: list[float] = json.loads((out / "ddp.json").read_text())
    return steps


def running_ours(name: str, out: Path, processes: list[subprocess.Popen[bytes]]) -> list[float]:
    setting = SETTINGS[name]
    samples = setting.per_rank * WORKERS * (setting.steps + setting.warmup + 10)
    base = {**os.environ, "EDL_JOB_TOKEN": TOKEN, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    port_file = out / "port"
    coordinator = subprocess.Popen(
        [sys.executable, "-m", "trainer_runtime.coordinator", "--samples", str(samples),
         "--shard-size", str(setting.per_rank * WORKERS * 10), "--join-window-s", "5",
         "--port-file", str(port_file)],
        env=base, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    processes.append(coordinator)
    deadline = time.monotonic() + 60
    while not (port_file.exists() and port_file.read_text()):
        if time.monotonic() > deadline:
            raise TimeoutError("the coordinator did not start")
        time.sleep(0.05)
    address = f"127.0.0.1:{port_file.read_text()}"
    sys.path.insert(0, str(REPO))
    from trainer_runtime.client import CoordinatorClient

    CoordinatorClient(address, TOKEN).set_target(WORKERS)
    workers = []
    for rank in range(WORKERS):
        env = {**base, "EDL_COORDINATOR": address, "EDL_JOB_ID": "overhead",
               "EDL_WORKER_ID": f"w{rank}", "EDL_TIMEOUT_S": "60"}  # fmt: skip
        workers.append(
            subprocess.Popen(
                [sys.executable, __file__, "--role", "ours", "--model", name, "--out", str(out)],
                env=env,
            )
        )
        processes.append(workers[-1])
    waiting_all(workers, "the runtime's run")
    coordinator.terminate()
    coordinator.wait(timeout=30)
    steps: list[float] = json.loads((out / "ours.json").read_text())
    return steps


def measuring(name: str, rounds: int) -> dict[str, object]:
    ddp: list[float] = []
    ours: list[float] = []
    processes: list[subprocess.Popen[bytes]] = []
    try:
        for round_ in range(rounds):
            out = Path(tempfile.mkdtemp(prefix=f"edl-overhead-{name}-"))
            sides = [("ddp", running_ddp), ("ours", running_ours)]
            for side, running in sides if round_ % 2 == 0 else sides[::-1]:
                (ddp if side == "ddp" else ours).extend(running(name, out, processes))
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait(timeout=10)
    ddp_s, ours_s = statistics.median(ddp), statistics.median(ours)
    return {
        "model": name,
        "ddp_step_s": round(ddp_s, 6),
        "ours_step_s": round(ours_s, 6),
        "ratio": round(ours_s / ddp_s, 3),
        "steps": [len(ddp), len(ours)],
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", nargs="+", choices=sorted(SETTINGS), default=["tiny", "25m"])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--role", choices=["ddp", "ours"], help=argparse.SUPPRESS)
    parser.add_argument("--model", choices=sorted(SETTINGS), help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.role == "ddp":
        ddp_worker(args.model, args.out)
        return
    if args.role == "ours":
        ours_worker(args.model, args.out)
        return
    for name in args.models:
        print(json.dumps(measuring(name, args.rounds)), flush=True)


if __name__ == "__main__":
    main()
