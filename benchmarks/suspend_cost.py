"""What suspending a PyTorch allreduce job to zero workers and resuming it costs, measured
on our runtime: the default of the simulator's ``suspend_cost`` and the planner's estimate
(``docs/simulator.md``, "What a change costs").

The job: `tests/runtime/torch_job.py --kind mlp` (a float64 MLP, SGD with momentum, a
global batch of 32, 10 ms of sleep after each step, one thread per process, gloo on CPU)
at two workers, with `EDL_CHECKPOINT_DIR` set, at each hidden width of `--widths` (the
checkpoint holds the parameters and the momentum: about 176 bytes per unit of width). For
each width, in one run:

- `start_s`: a cold start, from the workers' processes started (import of torch included)
  to the first step of their group, with nothing to restore: what any restart costs;
- `suspend_s` (`--repeats` times, median): every worker drained at once -> every worker
  exited; rank 0 writes its checkpoint (model, optimizer, the windows it applied) before it
  exits, so this is what the job's GPUs stay held for;
- `resume_s` (median): two fresh worker processes started -> the first step of their
  group, after rank 0 loaded the checkpoint and broadcast it;
- `checkpoint_bytes`: the newest checkpoint file's size.

One JSON line per width, then a last line with the least-squares fit of
`suspend_s + resume_s` against the checkpoint's size: `fixed_s` and `s_per_gib`, and
`suspend_cost_s` at `--reference-gib` (default 1 GiB: a 124M-parameter model in fp32 with
Adam's two moments is 1.5 GB, in bf16 with fp32 moments 1.2 GB).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from resize_pause import CREDENTIALS, JOB, environment, starting_coordinator  # noqa: E402
from resize_trace import Trace, new_group_step, stopping  # noqa: E402

SAMPLES = 10_000_000  # never reached: the job is stopped, not finished
GLOBAL_BATCH = 32
STEP_SLEEP_S = 0.01  # as in resize_pause.py: a step of at least 10 ms, as real steps are
WORKERS = ("a", "b")
GIB = float(1 << 30)


def measuring_width(root: Path, width: int, repeats: int, timeout_s: float) -> dict[str, object]:
    from trainer_runtime.client import CoordinatorClient
    from trainer_runtime.torch.checkpointing import file_name, stored_steps

    root.mkdir(parents=True)
    trace = Trace(root / "trace")
    trace.path.touch()
    checkpoints = root / "checkpoints"
    env = environment()
    processes: dict[str, subprocess.Popen[bytes]] = {}
    try:
        address = starting_coordinator(root, env, SAMPLES, processes)
        client = CoordinatorClient(address, CREDENTIALS.controller())
        serial = 0

        def starting_group() -> float:
            """Start two fresh workers; the seconds to their group's first step."""
            nonlocal serial
            old = trace.groups()
            moment = time.time()
            for name in WORKERS:
                serial += 1
                worker = f"{name}{serial}"
                worker_env = {**env, "EDL_COORDINATOR": address, "EDL_JOB_ID": "bench",
                              "EDL_JOB_TOKEN": CREDENTIALS.worker(worker),
                              "EDL_WORKER_ID": worker, "EDL_TIMEOUT_S": "60",
                              "EDL_CHECKPOINT_DIR": str(checkpoints)}  # fmt: skip
                processes[worker] = subprocess.Popen(
                    [sys.executable, str(JOB), "--kind", "mlp", "--width", str(width),
                     "--samples", str(SAMPLES), "--global-batch", str(GLOBAL_BATCH),
                     "--step-sleep-s", str(STEP_SLEEP_S), "--out", str(root / "out"),
                     "--trace", str(trace.path)],
                    env=worker_env, stdout=(root / f"{worker}.log").open("ab"),
                    stderr=subprocess.STDOUT,
                )  # fmt: skip
            found = new_group_step(trace, moment, old, len(WORKERS), timeout_s)
            if found is None:
                raise TimeoutError(f"width {width}: no group of two formed in {timeout_s} s")
            return found[0].at - moment

        def suspending() -> float:
            """Let the group take a few steps, drain every worker; seconds to all exited."""
            done = client.progress().committed_step
            deadline = time.monotonic() + timeout_s
            while client.progress().committed_step < done + 5:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"width {width}: the job does not step")
                time.sleep(0.05)
            members = [str(m.worker_id) for m in client.progress().members]
            moment = time.time()
            for name in members:
                client.drain(name)
            for name in members:
                code = processes[name].wait(timeout=timeout_s)
                if code != 0:
                    raise RuntimeError(f"{name} exited {code}: see {root / (name + '.log')}")
            return time.time() - moment

        start_s = starting_group()
        suspends: list[float] = []
        resumes: list[float] = []
        for _ in range(repeats):
            suspends.append(suspending())
            resumes.append(starting_group())
        newest = stored_steps(checkpoints)[0]
        size = (checkpoints / file_name(newest)).stat().st_size
    finally:
        for process in processes.values():
            stopping(process)
    return {
        "width": width,
        "checkpoint_bytes": size,
        "start_s": round(start_s, 3),
        "suspend_s": round(statistics.median(suspends), 3),
        "resume_s": round(statistics.median(resumes), 3),
        "suspend_all_s": [round(s, 3) for s in suspends],
        "resume_all_s": [round(s, 3) for s in resumes],
    }


def fitting(rows: list[dict[str, object]], reference_gib: float) -> dict[str, float]:
    """Least squares of suspend_s + resume_s = fixed_s + s_per_gib * size."""
    xs = [float(r["checkpoint_bytes"]) / GIB for r in rows]  # type: ignore[arg-type]
    ys = [float(r["suspend_s"]) + float(r["resume_s"]) for r in rows]  # type: ignore[arg-type]
    mean_x, mean_y = statistics.fmean(xs), statistics.fmean(ys)
    spread = sum((x - mean_x) ** 2 for x in xs)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True)) / spread
    fixed = mean_y - slope * mean_x
    return {
        "fixed_s": round(fixed, 3),
        "s_per_gib": round(slope, 3),
        "reference_gib": reference_gib,
        "suspend_cost_s": round(fixed + slope * reference_gib, 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--widths", default="16,1048576,4194304",
                        help="hidden widths, comma-separated (two or more)")  # fmt: skip
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--timeout-s", type=float, default=180.0)
    parser.add_argument("--reference-gib", type=float, default=1.0)
    parser.add_argument(
        "--workdir", type=Path, help="keep the processes' logs here (default: a temporary folder)"
    )
    args = parser.parse_args()
    widths = [int(w) for w in args.widths.split(",")]
    if len(set(widths)) < 2:
        parser.error("--widths: give two or more different widths, for the fit")
    rows = []
    with tempfile.TemporaryDirectory(prefix="edl-suspend-") as tmp:
        root = args.workdir or Path(tmp)
        for width in widths:
            row = measuring_width(root / f"w{width}", width, args.repeats, args.timeout_s)
            print(json.dumps(row), flush=True)
            rows.append(row)
    print(json.dumps({"fit": fitting(rows, args.reference_gib), "workers": len(WORKERS)}))


if __name__ == "__main__":
    main()
