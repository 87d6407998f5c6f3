"""The framework-free worker (`framework: none`): the machinery around training, no torch.

`python -m trainer_runtime.plain_worker --step-time-s 0.01` registers with the coordinator
named by the environment contract, leases one shard at a time, "trains" on it by sleeping,
commits it with its step time (the coordinator turns that into throughput), and honours
drains. It serves tests and benchmarks of membership, the ledger and the controller without
the cost of a framework. It needs a coordinator in `independent` mode.

With `--ledger-file`, it appends what it trained to a file the tests read, to check the
coordinator's own count: `intent LEASE EPOCH START STOP` before each commit and
`done LEASE` after the coordinator accepted it. `--ledger-dir DIR` does the same in
`DIR/<worker id>.ledger`, for a command shared by every worker of a job (a pod template).

What must stay true: a drained worker commits the shard it holds, leaves, and exits 0, and
so does one sent SIGTERM (a pod deleted or evicted: see `agent.py`); a fenced worker exits
non-zero; a finished job exits 0. A worker whose coordinator was replaced is not fenced: it
registers again and reports what it trained (``agent.committing_leases``), and a shard
whose commit the replacement refused counts as committed once reported (its `done` line).
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path
from typing import TextIO

from trainer_runtime.agent import Outcome, WorkerAgent
from trainer_runtime.client import CoordinatorError, Fenced
from trainer_runtime.environment import ContractError, WorkerContract

LOG = logging.getLogger("trainer_runtime.plain_worker")
IDLE_PAUSE_S = 0.02
EXIT_FENCED = 3
EXIT_UNREACHABLE = 4


class PlainWorker:
    """One framework-free worker: lease, sleep, commit, until the job ends or it is drained."""

    def __init__(
        self, agent: WorkerAgent, step_time_s: float, ledger: TextIO | None = None
    ) -> None:
        self.agent = agent
        self.step_time_s = step_time_s
        self.ledger = ledger
        self.committed = 0

    def recording(self, line: str) -> None:
        if self.ledger is not None:
            self.ledger.write(line + "\n")
            self.ledger.flush()

    def running(self) -> Outcome:
        self.agent.starting(store_address="")
        assignment = self.agent.awaiting_assignment()
        deadline_idle: float | None = None
        while True:
            if assignment.outcome is not Outcome.MEMBER:
                return assignment.outcome
            if self.agent.changed():
                assignment = self.agent.awaiting_assignment()
                continue
            try:
                reply = self.agent.client.lease_shard(self.agent.worker_id, assignment.generation)
            except Fenced:  # a new generation opened since `changed()`: ask which
                assignment = self.agent.awaiting_assignment()
                continue
            if reply.finished:
                return Outcome.FINISHED
            if not reply.leases:
                # the others hold the epoch's last shards: wait, boundedly, for them
                deadline_idle = deadline_idle or time.monotonic() + self.agent.contract.timeout_s
                if time.monotonic() > deadline_idle:
                    raise TimeoutError("no shard became free within the timeout")
                time.sleep(IDLE_PAUSE_S)
                continue
            deadline_idle = None
            started = time.monotonic()
            time.sleep(self.step_time_s)
            ids = [lease.lease_id for lease in reply.leases]
            for lease in reply.leases:
                self.recording(
                    f"intent {lease.lease_id} {lease.epoch} {lease.range.start} {lease.range.stop}"
                )
            # answered by this coordinator, or by the one that replaced it (``agent``)
            self.agent.committing_leases(reply.leases, step_time_s=time.monotonic() - started)
            for lease_id in ids:
                self.recording(f"done {lease_id}")
            self.committed += 1


def parsing(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m trainer_runtime.plain_worker")
    parser.add_argument("--step-time-s", type=float, default=0.01, help="simulated step time")
    ledger = parser.add_mutually_exclusive_group()
    ledger.add_argument("--ledger-file", type=Path, help="append trained shards here (tests)")
    ledger.add_argument(
        "--ledger-dir", type=Path, help="append trained shards to DIR/<worker id>.ledger"
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parsing(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    try:
        contract = WorkerContract.from_environ()
    except ContractError as error:
        print(error, file=sys.stderr)
        return 2
    agent = WorkerAgent(contract)
    path = args.ledger_file
    if args.ledger_dir is not None:
        args.ledger_dir.mkdir(parents=True, exist_ok=True)
        path = args.ledger_dir / f"{contract.worker_id}.ledger"
    ledger = path.open("a", encoding="utf-8") if path is not None else None
    try:
        outcome = PlainWorker(agent, args.step_time_s, ledger).running()
        agent.leaving()
        LOG.info("%s: %s", contract.worker_id, outcome.value)
        return 0
    except CoordinatorError as error:
        LOG.error("%s stops: %s", contract.worker_id, error)
        return EXIT_FENCED if isinstance(error, Fenced) else EXIT_UNREACHABLE
    finally:
        agent.closing()
        if ledger is not None:
            ledger.close()


if __name__ == "__main__":
    sys.exit(main())
