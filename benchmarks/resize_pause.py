"""Pause per resize: event -> first step of the new group, our runtime (PyTorch and
PaddlePaddle adapters) against torchrun.

The same job everywhere: the tiny float64 MLP of the runtime tests (`tests/runtime/
torch_job.py`), a global batch of 32 split among the workers, SGD with momentum, 10 ms of
sleep after each step, one thread per process, gloo on CPU, three workers (`--worker-args`
passes more arguments to our PyTorch workers: `--width 1000000` for an 11M-parameter model,
`--plain-joins` to turn off prepared joins). Measured in one run, `--repeats` times each
(medians reported):

- `ours`: a coordinator and three `torch_job.py` workers; graceful shrink = `drain` of the
  youngest member (3 -> 2), sigkill = SIGKILL of the youngest member (3 -> 2), join = a new
  worker process started (2 -> 3).
- `paddle`: the same, with `paddle_job.py` workers (the same MLP, data and optimizer in
  PaddlePaddle, gloo on CPU; the group re-forms in-process under a fresh group id).
- `torchrun` and `torchrun_tuned`: three single-process agents, each its own
  `torchrun --nnodes=1:3 --nproc-per-node=1 --rdzv-backend=c10d --max-restarts=100 ...`
  with `TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1` (which torch 2.13 needs to recover at all);
  `_tuned` adds `--rdzv-conf last_call_timeout=1,keep_alive_interval=1,keep_alive_max_attempt=2`.
  Agent `a` is told `is_host=1` (the others `is_host=0`): on one machine every agent would
  otherwise bind the endpoint's port and form a job of its own.
  The training script (this file, `--torchrun-worker`) saves a checkpoint every 20 steps
  and restores it whenever torchrun restarts it. Graceful shrink = SIGTERM to an agent
  (3 -> 2; never the first agent, which hosts the rendezvous store), sigkill = SIGKILL of a
  worker process (its agent restarts everyone: 3 -> 3), join = a new agent started (2 -> 3).

Every training process appends `step TIME GROUP WORLD PID` to a trace after each step
(GROUP: our generation, or torchrun's worker process id, since torchrun restarts every
process on a change) and `ready TIME NAME` once a worker of ours has warmed up. The event
time is taken by this script just before it acts; "the new group" is a group not seen in
the trace at that time, with the expected world size. `join_s` runs from the new process's
start, import of torch included, for both systems; `join_pause_s` is the gap the running
group sees (its last step before the new group -> the new group's first step).

An event that does not complete within `--event-timeout-s` is recorded as that value (and
listed under `timeouts`); the torchrun job is then restarted, so a hang of torchrun never
hangs the benchmark. Prints one JSON line:
`{"ours": {...}, "paddle": {...}, "torchrun": {...}, "torchrun_tuned": {...},
"tuned_over_ours": {...}, ...}` with the same keys in each entry; `--systems` runs only some
of them.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from trainer_runtime.environment import trust_environ  # noqa: E402
from trainer_runtime.protocol.credentials import Issuer, JobCredentials  # noqa: E402

JOB = REPO / "tests" / "runtime" / "torch_job.py"
PADDLE_JOB = REPO / "tests" / "runtime" / "paddle_job.py"
#: The run's own launcher key: the coordinator gets its public half, each worker its
#: credential, the driver the controller's.
CREDENTIALS = JobCredentials(Issuer.generate(), "bench")
SAMPLES = 200_000
GLOBAL_BATCH = 32
STEP_SLEEP_S = 0.01
CHECKPOINT_EVERY = 20
TUNED = "last_call_timeout=1,keep_alive_interval=1,keep_alive_max_attempt=2"
KEYS = ("graceful_shrink_s", "sigkill_s", "join_s", "join_pause_s")


# ----- the trace -----


@dataclass(frozen=True)
class Step:
    at: float
    group: str
    world: int
    pid: int


@dataclass
class Trace:
    path: Path

    def lines(self) -> list[list[str]]:
        """Whole lines only (a process killed mid-write may leave a torn one)."""
        shapes = {"step": 5, "start": 4, "ready": 3}
        lines = [line.split() for line in self.path.read_text().splitlines()]
        return [p for p in lines if p and shapes.get(p[0]) == len(p)]

    def steps(self) -> list[Step]:
        return [
            Step(float(p[1]), p[2], int(p[3]), int(p[4])) for p in self.lines() if p[0] == "step"
        ]

    def groups(self) -> set[str]:
        return {step.group for step in self.steps()}

    def ready_at(self, name: str) -> float | None:
        return next((float(p[1]) for p in self.lines() if p[0] == "ready" and p[2] == name), None)

    def starts_of(self, agent: str) -> list[int]:
        return [int(p[2]) for p in self.lines() if p[0] == "start" and p[3] == agent]


@dataclass
class Results:
    """Samples of each event; a timed-out event counts as its timeout."""

    samples: dict[str, list[float]] = field(default_factory=lambda: {k: [] for k in KEYS})
    timeouts: list[str] = field(default_factory=list)
    extra: dict[str, list[float]] = field(default_factory=dict)

    def medians(self) -> dict[str, float | None]:
        return {k: round(statistics.median(v), 3) if v else None for k, v in self.samples.items()}


def new_group_step(
    trace: Trace, moment: float, old: set[str], world: int, timeout_s: float
) -> tuple[Step, float] | None:
    """The first step of a group not in `old` with `world` members, and the last step of
    an old group before it; None after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        steps = trace.steps()
        fresh = [s for s in steps if s.at > moment and s.group not in old and s.world == world]
        if fresh:
            first = min(fresh, key=lambda s: s.at)
            before = [s.at for s in steps if s.group in old and s.at <= first.at]
            return first, max(before, default=moment)
        time.sleep(0.02)
    return None


def measuring(
    results: Results,
    trace: Trace,
    acting: Callable[[], float],
    world: int,
    keys: tuple[str, ...],
    timeout_s: float,
) -> bool:
    """Run one event (`acting` returns its moment) and record event -> first new step
    under `keys[0]` (and the running group's pause under `keys[1]`, if given)."""
    old = trace.groups()
    moment = acting()
    found = new_group_step(trace, moment, old, world, timeout_s)
    if found is None:
        for key in keys:
            results.samples[key].append(timeout_s)
        results.timeouts.append(keys[0])
        return False
    first, last_old = found
    results.samples[keys[0]].append(first.at - moment)
    if len(keys) > 1:
        results.samples[keys[1]].append(first.at - max(last_old, moment))
    return True


def waiting_steady(trace: Trace, world: int, timeout_s: float, calm_s: float = 1.0) -> bool:
    """Whether the job steps at `world` members, in one group, for `calm_s` in a row."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        now = time.time()
        recent = [s for s in trace.steps() if s.at > now - calm_s]
        if recent and all(s.world == world for s in recent):
            groups = {s.group for s in recent}
            earliest = min(s.at for s in trace.steps() if s.group in groups)
            if len(recent) >= 5 and earliest < now - calm_s:
                return True
        time.sleep(0.1)
    return False


def stopping(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.kill()
        process.wait(timeout=10)


def killing_pid(pid: int) -> None:
    """SIGKILL a training process we started (through torchrun), if it is still ours."""
    try:
        if "resize_pause.py" in Path(f"/proc/{pid}/cmdline").read_text():
            os.kill(pid, signal.SIGKILL)
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        pass


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


# ----- ours -----


def environment() -> dict[str, str]:
    """The environment of our coordinator and workers: the run's trust, one thread each."""
    return {**os.environ, **trust_environ(CREDENTIALS), "PYTHONPATH": str(REPO),
            "OMP_NUM_THREADS": "1"}  # fmt: skip


def starting_coordinator(
    root: Path, env: dict[str, str], samples: int, processes: dict[str, subprocess.Popen[bytes]]
) -> str:
    """Start a coordinator of `samples` samples (kept in `processes`); its address once it
    listens."""
    port_file = root / "port"
    processes["coordinator"] = subprocess.Popen(
        [sys.executable, "-m", "trainer_runtime.coordinator", "--samples", str(samples),
         "--shard-size", "1000", "--join-window-s", "0.05", "--port-file", str(port_file)],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    deadline = time.monotonic() + 60
    while not (port_file.exists() and port_file.read_text()):
        if time.monotonic() > deadline:
            raise TimeoutError("the coordinator did not start")
        time.sleep(0.05)
    return f"127.0.0.1:{port_file.read_text()}"


def running_ours(
    root: Path, repeats: int, timeout_s: float, job: Path = JOB, extra: tuple[str, ...] = ()
) -> Results:
    results = Results(extra={"join_from_ready_s": []})
    trace = Trace(root / "trace")
    trace.path.touch()
    env = environment()
    processes: dict[str, subprocess.Popen[bytes]] = {}
    try:
        address = starting_coordinator(root, env, SAMPLES, processes)
        from trainer_runtime.client import CoordinatorClient

        client = CoordinatorClient(address, CREDENTIALS.controller())

        def starting(name: str) -> float:
            worker_env = {**env, "EDL_COORDINATOR": address, "EDL_JOB_ID": "bench",
                          "EDL_JOB_TOKEN": CREDENTIALS.worker(name),
                          "EDL_WORKER_ID": name, "EDL_TIMEOUT_S": "30"}  # fmt: skip
            moment = time.time()
            processes[name] = subprocess.Popen(
                [sys.executable, str(job), "--kind", "mlp", "--samples", str(SAMPLES),
                 "--global-batch", str(GLOBAL_BATCH), "--step-sleep-s", str(STEP_SLEEP_S),
                 "--out", str(root / "out"), "--trace", str(trace.path), *extra],
                env=worker_env, stdout=(root / f"{name}.log").open("ab"),
                stderr=subprocess.STDOUT,
            )  # fmt: skip
            return moment

        def youngest() -> str:
            return str(client.progress().members[-1].worker_id)

        def draining() -> float:
            victim = youngest()
            moment = time.time()
            client.drain(victim)
            return moment

        def killing() -> float:
            victim = youngest()
            moment = time.time()
            os.kill(processes[victim].pid, signal.SIGKILL)
            return moment

        serial = 0

        def joining() -> None:
            nonlocal serial
            serial += 1
            name = f"j{serial}"
            if measuring(results, trace, lambda: starting(name), 3, KEYS[2:], timeout_s):
                ready = trace.ready_at(name)
                first = max(s.at for s in trace.steps() if s.world == 3)
                if ready is not None:
                    joined = [s.at for s in trace.steps() if s.world == 3 and s.at > ready]
                    results.extra["join_from_ready_s"].append(min(joined, default=first) - ready)

        for name in ("a", "b", "c"):
            starting(name)
        if not waiting_steady(trace, 3, 120):
            raise TimeoutError("our job never reached three workers")
        for _ in range(repeats):
            measuring(results, trace, draining, 2, ("graceful_shrink_s",), timeout_s)
            time.sleep(0.5)
            joining()
            waiting_steady(trace, 3, timeout_s)
            measuring(results, trace, killing, 2, ("sigkill_s",), timeout_s)
            time.sleep(0.5)
            joining()
            waiting_steady(trace, 3, timeout_s)
    finally:
        for process in processes.values():
            stopping(process)
    return results


# ----- torchrun -----


@dataclass
class TorchrunJob:
    """Agents of one torchrun job; agent `a` starts first and hosts the rendezvous store."""

    root: Path
    tuned: bool
    trace: Trace
    serial: int = 0
    run: int = 0
    port: int = 0
    agents: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def command(self, name: str) -> list[str]:
        launcher = Path(sys.executable).with_name("torchrun")
        head = (
            [str(launcher)]
            if launcher.exists()
            else [sys.executable, "-m", "torch.distributed.run"]
        )
        # One host of the rendezvous store: on one machine every agent would otherwise bind
        # the endpoint's port (the store sets SO_REUSEPORT) and form a job of its own.
        host = f"is_host={int(name == 'a')}"
        conf = ["--rdzv-conf", f"{TUNED},{host}" if self.tuned else host]
        return [
            *head, "--nnodes=1:3", "--nproc-per-node=1", "--rdzv-backend=c10d",
            f"--rdzv-endpoint=127.0.0.1:{self.port}", f"--rdzv-id=bench-{self.run}",
            "--max-restarts=100", "--local-addr=127.0.0.1", *conf,
            str(Path(__file__).resolve()), "--torchrun-worker", "--trace", str(self.trace.path),
            "--checkpoint", str(self.root / "checkpoint.pt"),
        ]  # fmt: skip

    def starting(self, name: str) -> float:
        env = {**os.environ, "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1", "OMP_NUM_THREADS": "1",
               "PYTHONPATH": str(REPO), "EDL_BENCH_AGENT": name, "LOGLEVEL": "INFO"}  # fmt: skip
        log = (self.root / f"agent-{name}.log").open("ab")
        moment = time.time()
        self.agents[name] = subprocess.Popen(
            self.command(name), env=env, stdout=log, stderr=subprocess.STDOUT
        )
        return moment

    def launching(self, timeout_s: float) -> bool:
        """A fresh job (new run id and port) of three agents, stepping at world 3."""
        self.stopping_all()
        self.run += 1
        self.port = free_port()
        self.starting("a")
        self.starting("b")
        self.starting("c")
        return waiting_steady(self.trace, 3, timeout_s, calm_s=2.0)

    def newest_agent(self) -> str:
        alive = [n for n, p in self.agents.items() if p.poll() is None and n != "a"]
        return alive[-1]

    def terminating_agent(self) -> float:
        victim = self.newest_agent()
        moment = time.time()
        self.agents[victim].send_signal(signal.SIGTERM)
        return moment

    def killing_worker(self) -> float:
        victim = self.newest_agent()
        pid = self.trace.starts_of(victim)[-1]
        moment = time.time()
        killing_pid(pid)
        return moment

    def joining(self) -> float:
        self.serial += 1
        return self.starting(f"j{self.serial}")

    def stopping_all(self) -> None:
        for process in self.agents.values():
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in self.agents.values():
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                stopping(process)
        for line in self.trace.lines():
            if line[0] == "start":
                killing_pid(int(line[2]))
        self.agents.clear()


def running_torchrun(root: Path, tuned: bool, repeats: int, timeout_s: float) -> Results:
    results = Results()
    trace = Trace(root / "trace")
    trace.path.touch()
    job = TorchrunJob(root, tuned, trace)
    events: list[tuple[str, Callable[[], float], int, tuple[str, ...]]] = [
        ("graceful_shrink_s", job.terminating_agent, 2, ("graceful_shrink_s",)),
        ("join_s", job.joining, 3, ("join_s", "join_pause_s")),
        ("sigkill_s", job.killing_worker, 3, ("sigkill_s",)),
    ]
    try:
        healthy = job.launching(timeout_s)
        for _ in range(repeats):
            for _name, acting, world, keys in events:
                if not healthy:  # the job could not be brought back: count as timeouts
                    for key in keys:
                        results.samples[key].append(timeout_s)
                    results.timeouts.append(keys[0])
                    continue
                if not measuring(results, trace, acting, world, keys, timeout_s):
                    healthy = job.launching(timeout_s)
                    if world == 3 or not healthy:
                        continue
                    # the shrink did not complete; the next event is a join: shrink first
                    job.terminating_agent()
                    healthy = waiting_steady(trace, 2, timeout_s)
                    continue
                healthy = waiting_steady(trace, world, timeout_s, calm_s=1.0)
                for name, process in list(job.agents.items()):
                    if process.poll() is not None:
                        del job.agents[name]
    finally:
        job.stopping_all()
    return results


def torchrun_worker(trace_path: Path, checkpoint: Path) -> None:
    """The training script torchrun runs: restore the last checkpoint, train, save one
    every CHECKPOINT_EVERY steps (rank 0, atomically), trace every step."""
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel

    sys.path.insert(0, str(REPO))
    from tests.runtime.torch_job import mlp, mlp_data

    torch.set_num_threads(1)
    trace = trace_path.open("a", buffering=1)
    agent = os.environ.get("EDL_BENCH_AGENT", "?")
    trace.write(f"start {time.time()} {os.getpid()} {agent}\n")
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    model = mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    step = 0
    if checkpoint.exists():
        saved = torch.load(checkpoint)
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        step = int(saved["step"])
    ddp = DistributedDataParallel(model)
    inputs, targets = mlp_data(SAMPLES).tensors
    share = GLOBAL_BATCH // world
    while True:
        start = (step * GLOBAL_BATCH + rank * share) % (SAMPLES - GLOBAL_BATCH)
        loss = nn.functional.cross_entropy(
            ddp(inputs[start : start + share]), targets[start : start + share]
        )
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        step += 1
        trace.write(f"step {time.time()} p{os.getpid()} {world} {os.getpid()}\n")
        if rank == 0 and step % CHECKPOINT_EVERY == 0:
            state = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
            partial = checkpoint.with_suffix(f".{os.getpid()}.tmp")
            torch.save({**state, "step": step}, partial)
            os.replace(partial, checkpoint)
        time.sleep(STEP_SLEEP_S)


# ----- report -----


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--event-timeout-s", type=float, default=90.0)
    parser.add_argument(
        "--systems", nargs="+", default=["ours", "paddle", "torchrun", "torchrun_tuned"],
        choices=["ours", "paddle", "torchrun", "torchrun_tuned"],
    )  # fmt: skip
    parser.add_argument(
        "--worker-args", default="",
        help="more arguments for our PyTorch workers (torch_job.py), e.g. '--width 200000'",
    )  # fmt: skip
    parser.add_argument("--torchrun-worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--trace", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--checkpoint", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.torchrun_worker:
        torchrun_worker(args.trace, args.checkpoint)
        return
    report: dict[str, object] = {}
    details: dict[str, object] = {}
    for system in args.systems:
        root = Path(tempfile.mkdtemp(prefix=f"edl-resize-{system}-"))
        if system == "ours":
            extra = tuple(args.worker_args.split())
            results = running_ours(root, args.repeats, args.event_timeout_s, JOB, extra)
        elif system == "paddle":
            results = running_ours(root, args.repeats, args.event_timeout_s, PADDLE_JOB)
        else:
            tuned = system == "torchrun_tuned"
            results = running_torchrun(root, tuned, args.repeats, args.event_timeout_s)
        report[system] = results.medians()
        entry: dict[str, object] = {
            "samples": {k: [round(x, 3) for x in v] for k, v in results.samples.items()},
            "timeouts": results.timeouts,
            **{k: [round(x, 3) for x in v] for k, v in results.extra.items()},
        }
        if results.timeouts:  # keep the workers' logs of a run that went wrong
            entry["kept"] = str(root)
        else:
            shutil.rmtree(root, ignore_errors=True)
        details[system] = entry
    ours, tuned_entry = report.get("ours"), report.get("torchrun_tuned")
    if isinstance(ours, dict) and isinstance(tuned_entry, dict):
        report["tuned_over_ours"] = {
            k: round(tuned_entry[k] / ours[k], 1) if ours[k] and tuned_entry[k] else None
            for k in KEYS
        }
    report["details"] = details
    print(json.dumps(report))


if __name__ == "__main__":
    main()
