"""The GPU check's elastic ledger job: `ledger` and `peer_never_initializes` (see
`gpu_nccl_check.py` for what each checks and when it passes).

A ledger worker trains a model holding one counter per sample, so that every sample trained
exactly once per epoch, through joins, drains, a SIGKILL and failed formations, shows as
counters all equal to the number of epochs; it writes a trace (`ready`, `formed`, `step`
lines) from which the pauses are read. What must stay true: a check's result names every
failure it saw, and every wait is bounded.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

from benchmarks.gpu_check_jobs import (
    ERROR_HANDLING,
    WORKER_TIMEOUT_S,
    Job,
    running_job,
    waiting_for,
)


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
            how = s.reformations[-1]  # shrunk or formed, and whether the state was sent
            trace.write(
                f"formed {time.time()} {worker} {time.time() - started} {how.path.value} "
                f"{int(how.state_sent)}\n"
            )

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
        summary = {
            "steps": steps, "step": s.step_count, "generations": s.generations_formed,
            "reformations": [
                [r.generation, r.attempt, r.path.value, r.delivery.value]
                for r in s.reformations
            ],
        }  # fmt: skip
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


def gap_after(trace: Path, worker: str, at: float, world: int) -> float | None:
    """The pause `worker`'s training saw for the event at `at`: from its last step in the
    old group to its first at a later generation of world size `world` (a group that
    prepared a join trains on after the event; the 0.05 s sleep per step is included)."""
    before, last = None, None
    for line in trace.read_text().splitlines():
        kind, when, who, *rest = line.split()
        if kind != "step" or who != worker:
            continue
        generation, size, now = int(rest[0][1:]), int(rest[1]), float(when)
        if now > at and before is not None and last is not None:
            if generation > before and size == world:
                return now - last
        else:
            before = generation
        last = now
    return None


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


def ledger_check(logs: Path, device: str, mode: str) -> dict[str, Any]:
    import torch

    # 2,000 steps of at least 0.05 s: the job outlasts its resizes, even where a newcomer
    # takes seconds to start (CUDA's initialization, a loaded machine)
    samples, epochs, batch = 8000, 2, 8
    failures: list[str] = []
    with running_job(logs, device, mode, samples, epochs) as job:
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
            "gaps_s": {k: gap_after(trace, "w0", at, world) for k, (at, world) in events.items()},
            "reform_s": [round(t, 4) for t in reform_times(trace, "w0")],
            "paths": summary["reformations"],  # [generation, attempt, path, delivery]
        }  # fmt: skip


def never_initializes_check(logs: Path, device: str, mode: str) -> dict[str, Any]:
    """A member checks in at the meeting point and never builds its group."""
    import torch

    samples = 4000  # the job must still run when the phantom registers
    with running_job(logs, device, mode, samples, 1) as job:
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
