"""Time to a target validation loss: the adaptive batch against a fixed batch, real training.

The job (`tests/runtime/adaptive_job.py`): a float32 MLP classifier on a synthetic 8-class
problem with 30% label noise, made locally from the seed; SGD with momentum. Both policies
start at the same global batch `--batch` and base rate `--lr`: `fixed` is
`KeepGlobalBatch(batch)` at that rate, `adaptive` is `AdaptiveBatch(initial_batch=batch,
max_batch, max_local, base_lr=lr)` with the policy's defaults (`--decide-every-s` only
overrides when given). Real processes: a coordinator and `torch_job`-style workers
started through the runtime tests' harness (`tests/runtime/harness.py`), gloo on CPU, one
thread each.

Rank 0 evaluates the validation loss every `--eval-every` samples trained; its clock is
training time from its first step, evaluation excluded (and the evaluation is not charged to
the step the policy measures). A run's time to target is that clock when the loss first
reaches `--target-loss` (the same for both policies; by default 1.45, the loss the fixed batch
reaches after about one epoch at 1 worker and 20-27 s at 4 workers on this machine); then the
driver drains every worker. A run that does not reach it within `--cap-s` of wall time
counts as its clock then (and says so: `"reached": false`).

Configurations: `4w` (four workers from the first step: the coordinator waits for all four),
`1w` (one worker), `resize` (1 -> 4 -> 2: workers 2-4 are started beforehand and held until
`--grow-at-s` of rank 0's wall clock, then join; at `--shrink-at-s` the two youngest are
drained). Every run prints one JSON line (its decisions: time, world, global batch,
accumulation, lr factor, noise estimate; mean step time at each world x batch); the last
line is the summary: `time_to_target_ratio_4w`, `ratio_1w`, `ratio_resize` (fixed time /
adaptive time, median over seeds) and the adaptive runs' batches.

Run: `python benchmarks/adaptive_batch.py [--seeds 3] [--configs 4w 1w resize]`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.runtime.harness import Cluster  # noqa: E402

JOB = str(REPO / "tests" / "runtime" / "adaptive_job.py")
WORKERS = ("w0", "w1", "w2", "w3")
POLL_S = 0.05


def trace_events(path: Path) -> list[dict[str, Any]]:
    """The whole JSON lines of a trace (a line being written may be torn)."""
    if not path.exists():
        return []
    events = []
    for line in path.read_text().splitlines():
        try:
            events.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return events


def job_argv(args: argparse.Namespace, policy: str, seed: int, out: Path) -> list[str]:
    argv = [
        JOB, "--kind", "mlp", "--samples", str(args.samples), "--global-batch",
        str(args.batch), "--out", str(out), "--trace", str(out / "trace"), "--policy", policy,
        "--lr", str(args.lr), "--max-batch", str(args.max_batch), "--max-local",
        str(args.max_local), "--seed", str(seed), "--eval-every", str(args.eval_every),
        "--target-loss", str(args.target_loss),
    ]  # fmt: skip
    if args.decide_every_s is not None:
        argv += ["--decide-every-s", str(args.decide_every_s)]
    return argv


def running(args: argparse.Namespace, config: str, policy: str, seed: int) -> dict[str, Any]:
    """One run of `policy` on `config`; what it measured."""
    root = Path(tempfile.mkdtemp(prefix=f"edl-adaptive-{config}-{policy}-"))
    cluster = Cluster(root)
    out = root / "out"
    trace = out / "trace"
    window = "60" if config == "4w" else "0.3"
    try:
        cluster.starting_coordinator(
            "--samples", str(args.samples), "--shard-size", "256", "--epochs",
            str(args.epochs), "--seed", str(seed), "--join-window-s", window,
            "--lease-timeout-s", "30",
        )  # fmt: skip
        client = cluster.client()
        argv = job_argv(args, policy, seed, out)
        go = root / "go"
        if config == "4w":
            client.set_target(4)
            for name in WORKERS:
                cluster.starting_worker(name, argv)
        else:
            cluster.starting_worker("w0", argv)
        if config == "resize":
            for name in WORKERS[1:]:
                cluster.starting_worker(name, [*argv, "--start-file", str(go)])
        began: float | None = None
        grown = shrunk = False
        deadline = time.monotonic() + args.cap_s + 120  # start-up included
        while time.monotonic() < deadline:
            events = trace_events(trace)
            if began is None and events:
                began = time.monotonic()
                deadline = began + args.cap_s
            if any(e["event"] in ("reached", "end") for e in events):
                break
            if began is not None and config == "resize":
                if not grown and time.monotonic() - began >= args.grow_at_s:
                    go.touch()
                    grown = True
                if not shrunk and time.monotonic() - began >= args.shrink_at_s:
                    for name in ("w3", "w2"):
                        client.drain(name)
                    shrunk = True
            if cluster.processes["w0"].poll() is not None:
                break
            time.sleep(POLL_S)
        members = [m.worker_id for m in client.progress().members]
        for name in members:
            client.drain(name)
        for name in members:
            if name in cluster.processes:
                cluster.processes[name].wait(timeout=60)
    finally:
        cluster.stopping_all()
    return summarizing(trace_events(trace), config, policy, seed)


def summarizing(
    events: list[dict[str, Any]], config: str, policy: str, seed: int
) -> dict[str, Any]:
    reached = next((e for e in events if e["event"] == "reached"), None)
    evals = [e for e in events if e["event"] == "eval"]
    end = next((e for e in events if e["event"] == "end"), None)
    decisions = [
        {
            "t": round(e["t"], 2), "world": e["world"], "global_batch": e["global_batch"],
            "accumulation": e["accumulation"], "lr_factor": round(e["lr_factor"], 3),
            "noise": None if e["noise"] is None else {
                "sqr": round(e["noise"]["grad_sqr"], 5), "var": round(e["noise"]["grad_var"], 5),
                "steps": e["noise"]["steps"]},
        }
        for e in events if e["event"] == "decision"
    ]  # fmt: skip
    last = evals[-1] if evals else {"t": float("nan"), "val_loss": float("nan")}
    return {
        "config": config,
        "policy": policy,
        "seed": seed,
        "reached": reached is not None,
        "time_to_target_s": round((reached or last)["t"], 3),
        "samples_to_target": (reached or last).get("samples"),
        "final_val_loss": round(last["val_loss"], 4),
        "decisions": decisions,
        "step_s": {k: round(v, 5) for k, v in (end or {}).get("step_s", {}).items()},
        "steps": (end or {}).get("steps", {}),
    }


def ratio(runs: list[dict[str, Any]], config: str) -> float | None:
    """Median over seeds of fixed time / adaptive time on `config`."""
    by_seed: dict[int, dict[str, float]] = {}
    for run in runs:
        if run["config"] == config:
            by_seed.setdefault(run["seed"], {})[run["policy"]] = run["time_to_target_s"]
    ratios = [t["fixed"] / t["adaptive"] for t in by_seed.values() if len(t) == 2]
    return round(statistics.median(ratios), 3) if ratios else None


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--configs", nargs="+", default=["4w", "1w", "resize"],
                        choices=["4w", "1w", "resize"])  # fmt: skip
    parser.add_argument("--policies", nargs="+", default=["fixed", "adaptive"],
                        choices=["fixed", "adaptive"])  # fmt: skip
    parser.add_argument("--samples", type=int, default=32768)
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--max-batch", type=int, default=1024)
    parser.add_argument("--max-local", type=int, default=256)
    parser.add_argument("--eval-every", type=int, default=4096)
    parser.add_argument("--target-loss", type=float, default=1.45)
    parser.add_argument("--decide-every-s", type=float, default=None)
    parser.add_argument("--cap-s", type=float, default=40.0)
    parser.add_argument("--grow-at-s", type=float, default=0.0)
    parser.add_argument("--shrink-at-s", type=float, default=6.0)
    args = parser.parse_args()
    runs = []
    for seed in range(args.seeds):
        for config in args.configs:
            for policy in args.policies:
                run = running(args, config, policy, seed)
                runs.append(run)
                print(json.dumps(run), flush=True)
    adaptive = [r for r in runs if r["policy"] == "adaptive"]
    summary = {
        "time_to_target_ratio_4w": ratio(runs, "4w"),
        "ratio_1w": ratio(runs, "1w"),
        "ratio_resize": ratio(runs, "resize"),
        "target_loss": args.target_loss,
        "batches": {
            f"{r['config']}/seed{r['seed']}": [
                [d["t"], d["world"], d["global_batch"], d["accumulation"], d["lr_factor"]]
                for d in r["decisions"]
            ]
            for r in adaptive
        },
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
