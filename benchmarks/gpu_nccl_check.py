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
  never builds its group, whose communicator the others set up as they build it; the check
  passes when w0 gets an error (not a hang) within its timeout and then finishes alone.
- `step_overhead`: the steady step time of our session against plain DDP, world size 1 (and
  2 with two ranks), an MLP of about 22M parameters and a GPT-style transformer of about
  124M in bfloat16 autocast (`gpt_model.py`), both sides alive at once and run in
  alternating blocks; `ratio` = median ours / median DDP.
- `resize_pause` (in the `ledger` line): `pauses_s`, from each event (join: the newcomer's
  registration; drain and SIGKILL: the driver's call; a failed member leaving) to w0's
  first step in the new group; `gaps_s`, the pause w0's training saw (its last step in the
  old group to its first in the new: after a join it trains on while the new group is
  built beside it, `trainer_runtime.torch.joining`); `reform_s`, w0's time inside
  re-formation (letting the old group go, meeting, building, the switch, the state
  broadcast, the DDP wrapper); `paths`, how each generation formed on w0 (`prepared`,
  `shrunk` or `formed`, and how rank 0's state reached the members: `held`, `sent`, or
  `streamed` over the first steps, `trainer_runtime.torch.streaming`).

The checks live in modules of their own: `gpu_check_jobs.py` (the job's processes),
`gpu_check_ledger.py` (`ledger`, `peer_never_initializes`), `gpu_check_overhead.py`
(`step_overhead`); this script is the driver, the two-ranks probe and every process's
entry point (`--role`).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from benchmarks.gpu_check_jobs import free_port, python_path, separate_hosts  # noqa: E402
from benchmarks.gpu_check_ledger import (  # noqa: E402
    ledger_check,
    ledger_worker,
    never_initializes_check,
)
from benchmarks.gpu_check_overhead import (  # noqa: E402
    MODELS,
    going_quick,
    overhead_check,
    overhead_worker,
)

RESULTS: list[dict[str, Any]] = []
CHECKS = ("ledger", "peer_never_initializes", "step_overhead")


def emit(check: str, ok: bool, **fields: Any) -> None:
    line = {"check": check, "ok": ok, **fields}
    RESULTS.append(line)
    print(json.dumps(line), flush=True)


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
    parser.add_argument("--model", choices=MODELS, default=MODELS[0], help=argparse.SUPPRESS)
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
    logs: Path = args.logs or Path(tempfile.mkdtemp(prefix="edl-gpu-check-"))
    logs.mkdir(parents=True, exist_ok=True)
    if args.quick:
        going_quick()
    platform(args.device)
    mode = two_ranks_check(args.device)
    if "ledger" in args.checks:
        checked("ledger", lambda: ledger_check(logs, args.device, mode))
    if "peer_never_initializes" in args.checks:
        checked("peer_never_initializes", lambda: never_initializes_check(logs, args.device, mode))
    for model in MODELS if "step_overhead" in args.checks else ():
        for world in (1, 2) if mode != "none" else (1,):
            checked(
                "step_overhead",
                lambda w=world, m=model: overhead_check(logs, args.device, mode, w, m),  # type: ignore[misc]
            )
    failed = [r["check"] for r in RESULTS if not r["ok"]]
    summary = {"summary": True, "ok": not failed, "failed": failed, "logs": str(logs)}
    print(json.dumps(summary), flush=True)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
