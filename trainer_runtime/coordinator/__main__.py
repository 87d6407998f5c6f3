"""Run one job's coordinator: `python -m trainer_runtime.coordinator --samples N ...`.

Callers' credentials are checked with EDL_TRUSTED_KEY for the job EDL_JOB_IDENTITY names
(``environment.verifier_from``; never the command line, where `ps` shows it). With
`--state-file`, a restarted coordinator loads the state a killed one saved and continues;
the dataset options must then match the saved ones, and a file that is not a coordinator
state is refused with its name (exit 2). A state that can no longer be saved (a full disk)
stops the coordinator with exit 3, to be restarted from the state last saved. The bound
port is printed as `listening on HOST:PORT` and, with `--port-file`, written to that file
(for `--port 0`).
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
import time

from trainer_runtime.coordinator.serving import CoordinatorServer, CoordinatorService
from trainer_runtime.coordinator.state import CoordinatorState
from trainer_runtime.coordinator.storing import FileStore, MemoryStore, StateStore
from trainer_runtime.environment import ContractError, verifier_from
from trainer_runtime.protocol.options import ConsumptionMode, parser
from trainer_runtime.protocol.tls import from_environ as tls_from_environ
from trainer_runtime.sharding import DatasetPlan


def parsing(argv: list[str] | None) -> argparse.Namespace:
    return parser().parse_args(argv)


def loading(args: argparse.Namespace, store: StateStore) -> CoordinatorState:
    plan = DatasetPlan(args.samples, args.shard_size, args.epochs, args.seed)
    saved = store.load()
    if saved is None:
        return CoordinatorState.starting(
            plan, ConsumptionMode(args.mode), args.join_window_s, args.lease_timeout_s
        )
    where = args.state_file or "the state store"
    try:
        state = CoordinatorState.from_json(saved, now=time.monotonic())
    except (ValueError, KeyError, TypeError, IndexError, AttributeError) as error:
        raise ValueError(
            f"{where} is not a coordinator state ({type(error).__name__}: {error}): move it "
            "away to start the job afresh, or restore the state saved before"
        ) from None
    if state.ledger.plan != plan:
        raise SystemExit(f"the saved state is of another dataset plan: {state.ledger.plan}")
    return state


def main(argv: list[str] | None = None) -> int:
    args = parsing(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s coordinator %(message)s")
    try:
        verifier = verifier_from()
    except ContractError as error:
        print(f"cannot start the coordinator: {error}", file=sys.stderr)
        return 2
    store: StateStore = FileStore(args.state_file) if args.state_file else MemoryStore()
    try:
        state = loading(args, store)
        service = CoordinatorService(state, store, verifier)
    except (ValueError, OSError) as error:
        print(f"cannot start the coordinator: {error}", file=sys.stderr)
        return 2
    try:
        server = CoordinatorServer(service, args.host, args.port, tls_from_environ(os.environ))
    except (ValueError, OSError, RuntimeError) as error:
        print(f"cannot start the coordinator: {error}", file=sys.stderr)
        return 2
    server.start()
    if args.port_file:
        args.port_file.write_text(str(server.port))
    print(f"listening on {server.address}", flush=True)
    stopped = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stopped.set())
    while not stopped.wait(0.2):
        if service.failure is not None:
            # Memory may be ahead of what was saved: exit, to be restarted from the saved
            # state (the local service and the controller restart a failed coordinator).
            server.stop()
            print(f"stopped: the state could not be saved ({service.failure})", file=sys.stderr)
            return 3
        if args.exit_when_finished and state.ledger.finished:
            time.sleep(1.0)
            break
    server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
