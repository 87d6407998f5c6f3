"""Checks of the PyTorch runtime on a GPU with NCCL: generations in one process, the ledger,
failures, the abort path, step time against plain DDP and the resize pause.

Run on a GPU machine: `python benchmarks/gpu_nccl_check.py` (an estimated 5 minutes;
`--logs DIR` keeps every job's logs and traces there). With
`--device cpu` the same checks run on gloo, which checks this script where no GPU is.
One JSON line per check, `{"check": NAME, "ok": true|false, ...}`, then a summary line;
the exit status is 1 when any check failed.

Checks:
- `platform`: torch, CUDA and NCCL versions, the device.
- `two_ranks_one_gpu`: whether two processes on one GPU form an NCCL group, as they are
  (recent NCCL refuses: "Duplicate GPU detected") and with a distinct `NCCL_HOSTID` each
  (NCCL then takes them for two hosts and connects them by sockets over loopback). Neither
  result is a failure; `mode` says how the next checks start a second rank, if at all.
- `ledger`: an elastic job (our coordinator; workers running `trainer_runtime.torch.session`
  on the device, the model holding a per-sample counter) through generations. With two
  ranks: w0 alone, w1 joins, w1 is drained, w2 joins, w2 is SIGKILLed mid-step. Always: a
  member that registers and never arrives (so w0's forming fails within the timeout and the
  old group was aborted and destroyed in-process), then leaves; w0 re-forms alone and ends
  the job. Passes when every counter equals the number of epochs, w0 kept its PID, the
  workers saw `TORCH_NCCL_ASYNC_ERROR_HANDLING=2`, and the survivors' GPU optimizer state
  (momentum buffers, broadcast to each newcomer) is bitwise equal.
- `peer_never_initializes`: a member arrives at the generation's meeting point and then
  never builds its group. NCCL sets its communicator up at the first collective; the check
  passes when w0 gets an error (not a hang) within its timeout and then finishes alone.
- `step_overhead`: the steady step time of our session against plain DDP, world size 1 (and
  2 with two ranks), an MLP of about 22M parameters, both sides alive at once and run in
  alternating blocks; `ratio` = median ours / median DDP.
- `resize_pause`: from each event (join: the newcomer's registration; drain and SIGKILL:
  the driver's call; a failed member leaving) to w0's first step in the new group, and
  `reform_s`: w0's time inside re-formation (abort and destroy of the old group, meeting,
  init, state broadcast, DDP wrapper), from the ledger job's traces.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from trainer_runtime.environment import TIMEOUT_S  # noqa: E402

TOKEN = "gpu-check"
ERROR_HANDLING = "TORCH_NCCL_ASYNC_ERROR_HANDLING"
WORKER_TIMEOUT_S = 8.0  # EDL_TIMEOUT_S of the ledger workers: every bounded wait
RESULTS: list[dict[str, Any]] = []
LOGS = Path(tempfile.gettempdir())  # set by --logs: each job's folder (logs, traces) is kept
CHECKS = ("ledger", "peer_never_initializes", "step_overhead")


def emit(check: str, ok: bool, **fields: Any) -> None:
    line = {"check": check, "ok": ok, **fields}
    RESULTS.append(line)
    print(json.dumps(line), flush=True)


def python_path() -> str:
    return os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)


def waiting_for(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.02)
    raise TimeoutError(f"timed out after {timeout_s} s waiting for {what}")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


# ----- two ranks on one GPU -----


def pair_rank(rank: int, port: int, device: str) -> None:
    """Rank `rank` of a two-process group on device 0: one allreduce, its result printed."""
    import datetime

    import torch
    import torch.distributed as dist

    backend = "nccl" if device == "cuda" else "gloo"
    store = dist.TCPStore("127.0.0.1", port, 2, rank == 0, timeout=datetime.timedelta(seconds=30))
    try:
        dist.init_process_group(
            backend, store=store, rank=rank, world_size=2, timeout=datetime.timedelta(seconds=20)
        )
        value = torch.ones(1 << 20, device=device)
        dist.all_reduce(value)
        if device == "cuda":
            torch.cuda.synchronize()
        print(json.dumps({"rank": rank, "sum": float(value[0])}), flush=True)
        dist.destroy_process_group()
    except Exception as error:
        print(json.dumps({"rank": rank, "error": f"{type(error).__name__}: {error}"[:600]}))
        sys.exit(3)


def separate_hosts(name: str) -> dict[str, str]:
    """Environment that makes NCCL take this process for a host of its own."""
    return {"NCCL_HOSTID": f"edl-check-{name}", "NCCL_SOCKET_IFNAME": "lo", "NCCL_IB_DISABLE": "1"}


def trying_pair(device: str, hosts: bool) -> dict[str, Any]:
    port = free_port()
    processes = []
    for rank in range(2):
        env = {
            **os.environ,
            "PYTHONPATH": python_path(),
            **(separate_hosts(str(rank)) if hosts else {}),
        }
        processes.append(
            subprocess.Popen(
                [sys.executable, __file__, "--role", "pair", "--rank", str(rank),
                 "--port", str(port), "--device", device],
                env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            )
        )  # fmt: skip
    outputs = []
    for process in processes:
        try:
            output, _ = process.communicate(timeout=90)
        except subprocess.TimeoutExpired:
            process.kill()
            output, _ = process.communicate()
            output += "\n(hung: killed after 90 s)"
        outputs.append(output)
    formed = all(p.returncode == 0 for p in processes) and all('"sum": 2.0' in o for o in outputs)
    errors = [line for o in outputs for line in o.splitlines() if "error" in line.lower()]
    return {"formed": formed, "errors": errors[:4]}


def two_ranks_check(device: str) -> str:
    """'plain', 'hosts' (distinct NCCL_HOSTID) or 'none': how a second rank can run here."""
    if device == "cpu":
        emit("two_ranks_one_gpu", True, mode="plain", note="gloo: not a GPU question")
        return "plain"
    plain = trying_pair(device, hosts=False)
    hosts = trying_pair(device, hosts=True) if not plain["formed"] else None
    mode = "plain" if plain["formed"] else "hosts" if hosts and hosts["formed"] else "none"
    emit("two_ranks_one_gpu", True, mode=mode, plain=plain, separate_hosts=hosts)
    return mode


# ----- the elastic job -----


class Job:
    """One job: our coordinator and worker processes, every PID ours, stopped by PID."""

    def __init__(
        self, root: Path, device: str, mode: str, samples: int, epochs: int, window_s: float
    ) -> None:
        self.root, self.device, self.mode = root, device, mode
        self.processes: dict[str, subprocess.Popen[bytes]] = {}
        port_file = root / "port"
        self.processes["coordinator"] = subprocess.Popen(
            [sys.executable, "-m", "trainer_runtime.coordinator", "--port-file", str(port_file),
             "--samples", str(samples), "--shard-size", "10", "--epochs", str(epochs),
             "--join-window-s", str(window_s), "--lease-timeout-s", "15"],
            env={**os.environ, "EDL_JOB_TOKEN": TOKEN, "PYTHONPATH": python_path()},
            stdout=(root / "coordinator.log").open("ab"), stderr=subprocess.STDOUT,
        )  # fmt: skip
        waiting_for(lambda: port_file.exists() and port_file.read_text() != "", 60, "coordinator")
        self.address = f"127.0.0.1:{int(port_file.read_text())}"
        from trainer_runtime.client import CoordinatorClient

        self.client = CoordinatorClient(self.address, TOKEN, timeout_s=5.0, retry_s=20.0)

    def contract(self, worker: str) -> Any:
        from trainer_runtime.environment import WorkerContract

        return WorkerContract(
            self.address, TOKEN, "gpu-check", worker, f"node-{worker}", timeout_s=WORKER_TIMEOUT_S
        )

    def starting(self, worker: str, argv: list[str]) -> None:
        env = {**os.environ, **self.contract(worker).to_environ(), "PYTHONPATH": python_path()}
        if self.mode == "hosts":
            env.update(separate_hosts(worker))
        self.processes[worker] = subprocess.Popen(
            [sys.executable, __file__, *argv],
            env=env,
            stdout=(self.root / f"{worker}.log").open("ab"),
            stderr=subprocess.STDOUT,
        )

    def members(self) -> list[str]:
        return [m.worker_id for m in self.client.progress().members]

    def step(self) -> int:
        return int(self.client.progress().committed_step)

    def advancing(self, by: int) -> None:
        target = self.step() + by
        waiting_for(lambda: self.step() >= target, 120, f"committed step {target}")

    def exit_code(self, worker: str, timeout_s: float) -> int:
        try:
            return self.processes[worker].wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return -999

    def log(self, worker: str) -> str:
        return (self.root / f"{worker}.log").read_text(errors="replace")[-2000:]

    def stopping(self) -> None:
        self.client.close()
        for process in self.processes.values():
            if process.poll() is None:
                os.kill(process.pid, signal.SIGKILL)
                process.wait(timeout=10)


@contextmanager
def running_job(
    device: str, mode: str, samples: int, epochs: int, window_s: float = 0.3
) -> Iterator[Job]:
    folder = tempfile.mkdtemp(prefix="job-", dir=LOGS)
    job = Job(Path(folder), device, mode, samples, epochs, window_s)
    try:
        yield job
    finally:
        job.stopping()


def ledger_worker(args: argparse.Namespace) -> None:
    """A worker of the ledger job: counter (SGD, rate 1) and a small layer with momentum."""
    import torch
    from torch import nn
    from torch.utils.data import TensorDataset

    from trainer_runtime.torch import KeepGlobalBatch, session

    device = torch.device(args.device)
    if device.type == "cuda":
        torch.cuda.set_device(0)

    class Ledger(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.counts = nn.Parameter(torch.zeros(args.samples, dtype=torch.float64))
            self.layer = nn.Linear(16, 16)

        def forward(self, index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            features = torch.sin(index.float()[:, None] * torch.arange(1, 17, device=index.device))
            return self.counts[index], self.layer(features)

    torch.manual_seed(0)
    model = Ledger().to(device)
    optimizer = torch.optim.SGD(
        [
            {"params": [model.counts], "lr": 1.0, "momentum": 0.0},
            {"params": model.layer.parameters(), "lr": 0.01, "momentum": 0.9},
        ],
        lr=0.01,
    )
    dataset = TensorDataset(torch.arange(args.samples))
    worker = os.environ["EDL_WORKER_ID"]
    steps, worlds = 0, set()
    with (
        Path(args.trace).open("a", buffering=1) as trace,
        session(model, optimizer, dataset, KeepGlobalBatch(args.global_batch)) as s,
    ):
        trace.write(f"ready {time.time()} {worker}\n")
        forming = s.forming_generation

        def timed_forming(assignment: Any, *attempt: Any) -> None:
            started = time.time()
            forming(assignment, *attempt)
            trace.write(f"formed {time.time()} {worker} {time.time() - started}\n")

        s.forming_generation = timed_forming  # type: ignore[method-assign]
        for (index,) in s.batches():
            counted, out = s.model(index.to(device, non_blocking=True))
            loss = (-float(s.window_size) * counted).mean() + 1e-3 * out.pow(2).mean()
            s.step(loss)
            steps += 1
            worlds.add(s.world_size)
            trace.write(f"step {time.time()} {worker} g{s.generation} {s.world_size}\n")
            if args.step_sleep_s:
                time.sleep(args.step_sleep_s)
        summary = {"steps": steps, "step": s.step_count, "generations": s.generations_formed}
    torch.save({"counts": model.counts.detach().cpu()}, Path(args.out) / f"{worker}.pt")
    summary.update(
        pid=os.getpid(), worlds=sorted(worlds), error_handling=os.environ.get(ERROR_HANDLING)
    )
    (Path(args.out) / f"{worker}.json").write_text(json.dumps(summary))


class Phantom:
    """A member that registers (its watch stream keeps it alive) but never trains: it stops
    after `arriving` (never comes to the meeting point) or after checking in there
    (`arriving=True`: never builds its group); `leaving` ends it."""

    def __init__(self, job: Job, name: str, arriving: bool) -> None:
        from trainer_runtime.agent import WorkerAgent
        from trainer_runtime.torch.grouping import StoreHost

        self.agent = WorkerAgent(job.contract(name))
        self.stores = StoreHost("127.0.0.1", WORKER_TIMEOUT_S * 4)
        self.arriving, self.job_id = arriving, "gpu-check"
        self.registered_at = time.time()
        self.agent.starting(self.stores.address)
        self.thread = threading.Thread(target=self.checking_in, daemon=True)
        self.thread.start()

    def checking_in(self) -> None:
        from torch._C._distributed_c10d import PrefixStore

        from trainer_runtime.torch.grouping import meeting

        assignment = self.agent.awaiting_assignment()
        if not self.arriving or assignment.world_size < 2:
            return
        leader = next(p for p in assignment.peers if p.rank == 0)
        store = PrefixStore(
            f"{self.job_id}/g{assignment.generation}/", self.stores.store_of(leader.store_address)
        )
        meeting(store, assignment.rank, assignment.world_size)

    def leaving(self) -> float:
        left_at = time.time()
        self.agent.leaving()
        self.agent.closing()
        return left_at


def first_step_after(trace: Path, worker: str, at: float, world: int | None) -> float | None:
    """Seconds from `at` to `worker`'s first step at a later generation than it had at `at`
    (and at world size `world`, if given)."""
    before, after = None, None
    for line in trace.read_text().splitlines():
        kind, when, who, *rest = line.split()
        if kind != "step" or who != worker:
            continue
        generation, size = int(rest[0][1:]), int(rest[1])
        if float(when) <= at:
            before = generation
        elif before is not None and generation > before and (world is None or size == world):
            after = float(when)
            break
    return None if after is None else after - at


def steps_since(trace: Path, worker: str, since: float, world: int) -> int:
    """`worker`'s steps at world size `world` after time `since`."""
    count = 0
    for line in trace.read_text().splitlines():
        kind, when, who, *rest = line.split()
        if kind == "step" and who == worker and float(when) > since and int(rest[1]) == world:
            count += 1
    return count


def ready_time(trace: Path, worker: str) -> float:
    """When `worker` registered (it writes 'ready' once its session is entered)."""
    for line in trace.read_text().splitlines():
        kind, when, who, *_ = line.split()
        if kind == "ready" and who == worker:
            return float(when)
    raise ValueError(f"{worker} never wrote 'ready'")


def reform_times(trace: Path, worker: str) -> list[float]:
    return [
        float(line.split()[3])
        for line in trace.read_text().splitlines()
        if line.startswith("formed ") and line.split()[2] == worker
    ]


def ledger_check(device: str, mode: str) -> dict[str, Any]:
    import torch

    # 2,000 steps of at least 0.05 s: the job outlasts its resizes, even where a newcomer
    # takes seconds to start (CUDA's initialization, a loaded machine)
    samples, epochs, batch = 8000, 2, 8
    failures: list[str] = []
    with running_job(device, mode, samples, epochs) as job:
        out, trace = job.root / "out", job.root / "trace"
        out.mkdir()
        argv = ["--role", "ledger", "--device", device, "--samples", str(samples),
                "--global-batch", str(batch), "--step-sleep-s", "0.05",
                "--out", str(out), "--trace", str(trace)]  # fmt: skip
        events: dict[str, tuple[float, int]] = {}  # pause name: (event time, world after)

        def training(world: int, steps: int = 5) -> None:
            """Wait until w0 took `steps` steps at `world` since the last event."""
            since = max((at for at, _ in events.values()), default=0.0)
            waiting_for(
                lambda: steps_since(trace, "w0", since, world) >= steps, 120, f"steps at {world}"
            )

        job.starting("w0", argv)
        waiting_for(lambda: job.members() == ["w0"], 120, "w0")
        training(1)
        pid0 = job.processes["w0"].pid
        if mode != "none":
            job.starting("w1", argv)
            waiting_for(lambda: len(job.members()) == 2, 120, "w1 to join")
            events["join_s"] = (ready_time(trace, "w1"), 2)
            training(2)
            events["graceful_shrink_s"] = (time.time(), 1)
            job.client.drain("w1")
            if job.exit_code("w1", 60) != 0:
                failures.append("w1 did not leave cleanly when drained: " + job.log("w1"))
            training(1)
            job.starting("w2", argv)
            waiting_for(lambda: len(job.members()) == 2, 120, "w2 to join")
            events["join_again_s"] = (ready_time(trace, "w2"), 2)
            training(2)
            events["sigkill_s"] = (time.time(), 1)
            os.kill(job.processes["w2"].pid, signal.SIGKILL)
            job.processes["w2"].wait(timeout=10)
            training(1)
        phantom = Phantom(job, "ghost", arriving=False)  # registers, never comes to meet
        waiting_for(lambda: "ghost" in job.members(), 30, "the phantom to be a member")
        time.sleep(WORKER_TIMEOUT_S + 3)  # w0's meeting times out meanwhile
        events["member_left_after_failed_forming_s"] = (phantom.leaving(), 1)
        training(1)
        code = job.exit_code("w0", 300)
        if code != 0:
            failures.append(f"w0 exited {code}: " + job.log("w0"))
            return {"ok": False, "failures": failures}
        summary = json.loads((out / "w0.json").read_text())
        state = torch.load(out / "w0.pt")
        expected = torch.full((samples,), float(epochs), dtype=torch.float64)
        wrong = int((state["counts"] != expected).sum())
        if wrong:
            failures.append(f"{wrong} of {samples} counters are not {epochs}")
        if summary["pid"] != pid0:
            failures.append("w0 changed PID")
        if device == "cuda" and summary["error_handling"] != "2":
            failures.append(f"{ERROR_HANDLING}={summary['error_handling']} in the worker")
        needed = 6 if mode != "none" else 2  # generations w0 must have formed in-process
        if summary["generations"] < needed:
            failures.append(f"w0 formed {summary['generations']} generations, fewer than {needed}")
        if mode != "none":  # w1 joined w0: it took w0's counters (the broadcast) and trained on
            drained = json.loads((out / "w1.json").read_text())
            counts = torch.load(out / "w1.pt")["counts"]
            if float(counts.sum()) != drained["step"] * batch or float(counts.max()) > epochs:
                failures.append(
                    f"w1 left at step {drained['step']} with {float(counts.sum())} counted"
                )
        pauses = {k: first_step_after(trace, "w0", at, world) for k, (at, world) in events.items()}
        missing = [k for k, v in pauses.items() if v is None]
        if missing:
            failures.append(f"no first step found after {missing}")
        return {
            "ok": not failures, "failures": failures, "samples": samples, "epochs": epochs,
            "wrong_counters": wrong, "w0": summary, "pauses_s": pauses,
            "reform_s": [round(t, 4) for t in reform_times(trace, "w0")],
        }  # fmt: skip


def never_initializes_check(device: str, mode: str) -> dict[str, Any]:
    """A member checks in at the meeting point and never builds its group."""
    import torch

    samples = 4000  # the job must still run when the phantom registers
    with running_job(device, mode, samples, 1) as job:
        out, trace = job.root / "out", job.root / "trace"
        out.mkdir()
        argv = ["--role", "ledger", "--device", device, "--samples", str(samples),
                "--global-batch", "8", "--step-sleep-s", "0.02",
                "--out", str(out), "--trace", str(trace)]  # fmt: skip
        job.starting("w0", argv)
        waiting_for(lambda: job.members() == ["w0"], 120, "w0")
        job.advancing(3)
        phantom = Phantom(job, "mute", arriving=True)
        waiting_for(lambda: "mute" in job.members(), 30, "the phantom to be a member")
        # w0 is given its timeout (and 3 s) to fail the generation; a hang shows as no
        # further step once the phantom has left
        time.sleep(WORKER_TIMEOUT_S + 3)
        left_at = phantom.leaving()
        code = job.exit_code("w0", 4 * WORKER_TIMEOUT_S + 60)
        if code != 0:
            reason = "hung (killed)" if code == -999 else f"exited {code}"
            return {"ok": False, "failures": [f"w0 {reason}: " + job.log("w0")]}
        counts = torch.load(out / "w0.pt")["counts"]
        wrong = int((counts != 1.0).sum())
        return {
            "ok": wrong == 0,
            "wrong_counters": wrong,
            "first_step_after_leave_s": first_step_after(trace, "w0", left_at, 1),
            "w0": json.loads((out / "w0.json").read_text()),
        }


# ----- step time against plain DDP -----

# `--quick` (inherited by the workers through QUICK_ENV): a dry run of the script itself
QUICK_ENV = "EDL_GPU_CHECK_QUICK"
PER_RANK, WARMUP, BLOCKS, BLOCK, SKIP = 32, 30, 8, 60, 5
QUICK = (3, 2, 4, 1)
if os.environ.get(QUICK_ENV) == "1":
    WARMUP, BLOCKS, BLOCK, SKIP = QUICK


def model_25m(samples: int) -> tuple[Any, Any, Any]:
    import torch
    from torch import nn

    torch.manual_seed(0)
    width = 2048
    layers: list[nn.Module] = [nn.Linear(512, width)]
    for _ in range(5):
        layers += [nn.ReLU(), nn.Linear(width, width)]
    layers += [nn.ReLU(), nn.Linear(width, 10)]
    generator = torch.Generator().manual_seed(1)
    inputs = torch.randn(samples, 512, generator=generator)
    targets = torch.randint(0, 10, (samples,), generator=generator)
    return nn.Sequential(*layers), inputs, targets


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


def overhead_check(device: str, mode: str, world: int) -> dict[str, Any]:
    samples = PER_RANK * world * (WARMUP + BLOCKS * BLOCK)
    # a long join window, closed by the target: every rank is in the first generation
    with running_job(device, mode, samples, 1, window_s=120) as job:
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
                        [sys.executable, __file__, "--role", "overhead", "--side", side,
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


# ----- driver -----


def platform(device: str) -> None:
    import torch

    fields: dict[str, Any] = {"torch": torch.__version__, "device": device}
    if device == "cuda":
        nccl = torch.cuda.nccl.version()
        fields.update(
            cuda=torch.version.cuda,
            nccl=".".join(map(str, nccl)) if isinstance(nccl, tuple) else str(nccl),
            gpu=torch.cuda.get_device_name(0),
        )
    emit("platform", device == "cpu" or torch.cuda.is_available(), **fields)


def checked(name: str, run: Callable[[], dict[str, Any]]) -> None:
    started = time.monotonic()
    try:
        result = run()
    except Exception as error:
        result = {"ok": False, "failures": [f"{type(error).__name__}: {error}"[:2000]]}
    ok = bool(result.pop("ok"))
    emit(name, ok, **result, seconds=round(time.monotonic() - started, 1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--quick", action="store_true", help="few, short blocks (a dry run)")
    parser.add_argument("--checks", nargs="+", choices=CHECKS, default=list(CHECKS))
    parser.add_argument(
        "--logs", type=Path, help="keep the jobs' logs here (default: a new temp dir)"
    )
    parser.add_argument("--role", default="driver", help=argparse.SUPPRESS)
    for option in ("--rank", "--port", "--world", "--samples", "--global-batch"):
        parser.add_argument(option, type=int, default=0, help=argparse.SUPPRESS)
    for option in ("--side", "--out", "--trace"):
        parser.add_argument(option, default="", help=argparse.SUPPRESS)
    parser.add_argument("--step-sleep-s", type=float, default=0.0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.role == "pair":
        return pair_rank(args.rank, args.port, args.device)
    if args.role == "ledger":
        return ledger_worker(args)
    if args.role == "overhead":
        return overhead_worker(args)
    if args.device == "cpu":
        os.environ.setdefault("OMP_NUM_THREADS", "1")
    global LOGS, WARMUP, BLOCKS, BLOCK, SKIP
    LOGS = args.logs or Path(tempfile.mkdtemp(prefix="edl-gpu-check-"))
    LOGS.mkdir(parents=True, exist_ok=True)
    if args.quick:
        os.environ[QUICK_ENV] = "1"
        WARMUP, BLOCKS, BLOCK, SKIP = QUICK
    platform(args.device)
    mode = two_ranks_check(args.device)
    if "ledger" in args.checks:
        checked("ledger", lambda: ledger_check(args.device, mode))
    if "peer_never_initializes" in args.checks:
        checked("peer_never_initializes", lambda: never_initializes_check(args.device, mode))
    if "step_overhead" in args.checks:
        checked("step_overhead", lambda: overhead_check(args.device, mode, 1))
        if mode != "none":
            checked("step_overhead", lambda: overhead_check(args.device, mode, 2))
    failed = [r["check"] for r in RESULTS if not r["ok"]]
    summary = {"summary": True, "ok": not failed, "failed": failed, "logs": str(LOGS)}
    print(json.dumps(summary), flush=True)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
