"""Pause per resize of the trainer runtime: event -> first step of the new group.

Runs the tiny MLP job of the runtime tests with three local workers on CPU (gloo) and
measures, `--repeats` times each: a graceful shrink (drain), a SIGKILL, and a join (from the
newcomer being ready to the first step of the group it enters). Prints one JSON line:
`{"ours": {"graceful_shrink_s": ..., "sigkill_s": ..., "join_s": ...}}` (medians).

The torchrun peer of issue 4 is not measured here yet (see docs/runtime.md).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
JOB = REPO / "tests" / "runtime" / "torch_job.py"
TOKEN = "bench"


def reading_trace(trace: Path) -> list[tuple[str, float, str]]:
    lines = []
    for line in trace.read_text().splitlines():
        kind, moment, what = line.split()
        lines.append((kind, float(moment), what))
    return lines


def first_step_after(trace: Path, moment: float, generation: int, timeout_s: float) -> float:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for kind, at, what in reading_trace(trace):
            if kind == "step" and at > moment and int(what) > generation:
                return at - moment
        time.sleep(0.01)
    raise TimeoutError("no step of a new generation")


def current_generation(trace: Path) -> int:
    steps = [int(what) for kind, _, what in reading_trace(trace) if kind == "step"]
    return max(steps, default=0)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="edl-resize-"))
    trace = root / "trace"
    trace.touch()
    env = {**os.environ, "EDL_JOB_TOKEN": TOKEN, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    port_file = root / "port"
    coordinator = subprocess.Popen(
        [sys.executable, "-m", "trainer_runtime.coordinator", "--samples", "200000",
         "--shard-size", "1000", "--join-window-s", "0.05", "--port-file", str(port_file)],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    processes: dict[str, subprocess.Popen[bytes]] = {"coordinator": coordinator}
    try:
        while not port_file.exists() or not port_file.read_text():
            time.sleep(0.05)
        address = f"127.0.0.1:{port_file.read_text()}"
        sys.path.insert(0, str(REPO))
        from trainer_runtime.client import CoordinatorClient

        client = CoordinatorClient(address, TOKEN)
        serial = 0

        def starting(name: str) -> None:
            worker_env = {**env, "EDL_COORDINATOR": address, "EDL_JOB_ID": "bench",
                          "EDL_WORKER_ID": name, "EDL_TIMEOUT_S": "30"}  # fmt: skip
            processes[name] = subprocess.Popen(
                [sys.executable, str(JOB), "--kind", "mlp", "--samples", "200000",
                 "--global-batch", "32", "--step-sleep-s", "0.01", "--out", str(root / "out"),
                 "--trace", str(trace)],
                env=worker_env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )  # fmt: skip

        def joining() -> float:
            nonlocal serial
            serial += 1
            name = f"j{serial}"
            generation = current_generation(trace)
            starting(name)
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                ready = [at for kind, at, what in reading_trace(trace) if kind == "ready"
                         and what == name]  # fmt: skip
                if ready:
                    return first_step_after(trace, ready[0], generation, 30)
                time.sleep(0.01)
            raise TimeoutError(f"{name} never became ready")

        for name in ("a", "b", "c"):
            starting(name)
        while current_generation(trace) == 0 or len(client.progress().members) < 3:
            time.sleep(0.1)
        time.sleep(1.0)
        results: dict[str, list[float]] = {"graceful_shrink_s": [], "sigkill_s": [], "join_s": []}
        for _ in range(args.repeats):
            victim = client.progress().members[-1].worker_id
            generation = current_generation(trace)
            moment = time.time()
            client.drain(victim)
            results["graceful_shrink_s"].append(first_step_after(trace, moment, generation, 30))
            processes[victim].wait(timeout=30)
            results["join_s"].append(joining())
            time.sleep(0.5)
            victim = client.progress().members[-1].worker_id
            generation = current_generation(trace)
            moment = time.time()
            os.kill(processes[victim].pid, signal.SIGKILL)
            results["sigkill_s"].append(first_step_after(trace, moment, generation, 30))
            processes[victim].wait(timeout=30)
            results["join_s"].append(joining())
            time.sleep(0.5)
        medians = {key: round(statistics.median(values), 4) for key, values in results.items()}
        print(json.dumps({"ours": medians, "samples": results}))
    finally:
        for process in processes.values():
            if process.poll() is None:
                process.kill()
                process.wait(timeout=10)


if __name__ == "__main__":
    main()
