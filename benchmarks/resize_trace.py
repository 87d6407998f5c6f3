"""The trace the resize benchmarks read (`resize_pause.py`, `suspend_cost.py`): every
training process appends `step TIME GROUP WORLD PID` after each step, `start TIME PID AGENT`
when torchrun starts it and `ready TIME NAME` once a worker of ours has warmed up; and how
one event is timed from it.
"""

from __future__ import annotations

import os
import signal
import socket
import statistics
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path

KEYS = ("graceful_shrink_s", "sigkill_s", "join_s", "join_pause_s")


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


def gaps(times: list[float]) -> list[float]:
    return [b - a for a, b in pairwise(times)]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port
