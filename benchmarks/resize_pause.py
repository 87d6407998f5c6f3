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
group sees (its last step before the new group -> the new group's first step), and
`join_slowest_step_s` the oldest member's slowest step among the grown group's first 12
(where rank 0's state streams to the newcomer: `trainer_runtime.torch.streaming`), beside
`steady_step_s`, its median step before the join.

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
sys.path.insert(0, str(REPO / "benchmarks"))

from resize_trace import (  # noqa: E402
    KEYS,
    Results,
    Trace,
    free_port,
    gaps,
    killing_pid,
    measuring,
    stopping,
    waiting_steady,
)

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
JOIN_STEPS = 12  # the grown group's first steps, where a streamed state rides (<= 8 of them)


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
    results = Results(
        extra={"join_from_ready_s": [], "join_slowest_step_s": [], "steady_step_s": []}
    )
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

        def settling_in(moment: float, pid: int) -> None:
            """Process `pid`'s slowest step among its first JOIN_STEPS in the grown group (a
            state streamed to the newcomer rides on those), and its median step before the
            join."""
            deadline = time.monotonic() + timeout_s
            while True:  # (a large model steps slowly: its first steps take seconds)
                mine = sorted((s.at, s.world) for s in trace.steps() if s.pid == pid)
                after = [t for t, world in mine if t > moment and world == 3][: JOIN_STEPS + 1]
                if len(after) > JOIN_STEPS or time.monotonic() > deadline:
                    break
                time.sleep(0.1)
            before = [t for t, _ in mine if t < moment][-21:]
            if len(before) > 2 and len(after) > 2:
                results.extra["join_slowest_step_s"].append(max(gaps(after)))
                results.extra["steady_step_s"].append(statistics.median(gaps(before)))

        def grown() -> None:
            oldest = str(client.progress().members[0].worker_id)  # in the group before and after
            moment = time.time()
            joining()
            waiting_steady(trace, 3, timeout_s)
            settling_in(moment, processes[oldest].pid)

        for name in ("a", "b", "c"):
            starting(name)
        if not waiting_steady(trace, 3, 120):
            raise TimeoutError("our job never reached three workers")
        for _ in range(repeats):
            measuring(results, trace, draining, 2, ("graceful_shrink_s",), timeout_s)
            time.sleep(0.5)
            grown()
            measuring(results, trace, killing, 2, ("sigkill_s",), timeout_s)
            time.sleep(0.5)
            grown()
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
