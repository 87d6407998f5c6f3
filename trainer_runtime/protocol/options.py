"""The coordinator's command line: the one definition that the coordinator parses and that
drivers check a job's ``edl.dev/coordinator-args`` annotation against before they accept
the job.

Why here: the annotation is part of the protocol between the drivers and the runtime (the
drivers pass it to the coordinator as they found it), and a job whose annotation the
coordinator would refuse must be refused when it is submitted, with the reason, not fail
at every start of its coordinator. The drivers may import the protocol, not the
coordinator (a checked contract), so the parser lives with the protocol.

What must stay true: ``options_problem(args)`` is None exactly when the coordinator would
start on those options (with what the driver adds: host, port, state file).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from enum import Enum
from pathlib import Path
from typing import NoReturn


class ConsumptionMode(Enum):
    """How a job's workers consume the ledger; fixed for the job's life (no transitions).

    GROUP: an allreduce group walks step windows; its rank 0 commits them.
    INDEPENDENT: each worker leases and commits whole shards on its own.
    """

    GROUP = "group"
    INDEPENDENT = "independent"


class OptionsError(ValueError):
    """Options the coordinator refuses; the message says which and why."""


class _Parser(argparse.ArgumentParser):
    """Raises instead of printing and exiting, so a driver can say why."""

    def error(self, message: str) -> NoReturn:
        raise OptionsError(message)


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of at least 1")
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not 0 < value < 1e6:  # (inf and nan fail too)
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds in (0, 1e6)")
    return value


def parser(exit_on_error: bool = True) -> argparse.ArgumentParser:
    """The coordinator's parser; ``exit_on_error=False`` raises ``OptionsError``."""
    make = argparse.ArgumentParser if exit_on_error else _Parser
    p = make(prog="python -m trainer_runtime.coordinator")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--port-file", type=Path)
    p.add_argument("--samples", type=_positive_int, required=True, help="samples in the dataset")
    p.add_argument("--shard-size", type=_positive_int, default=64)
    p.add_argument("--epochs", type=_positive_int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--mode", choices=[m.value for m in ConsumptionMode], default=ConsumptionMode.GROUP.value
    )
    p.add_argument("--state-file", type=Path, help="persist here (default: memory only)")
    p.add_argument("--join-window-s", type=_seconds, default=0.2)
    p.add_argument("--lease-timeout-s", type=_seconds, default=10.0)
    p.add_argument(
        "--exit-when-finished", action="store_true", help="stop once the last epoch is committed"
    )
    return p


def options_problem(args: Sequence[str]) -> str | None:
    """Why the coordinator would refuse ``args`` (a job's dataset options), or None."""
    try:
        parser(exit_on_error=False).parse_args(list(args))
    except OptionsError as error:
        return str(error)
    return None
