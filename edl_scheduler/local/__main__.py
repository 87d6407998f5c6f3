"""Run the local service in the foreground: ``python -m edl_scheduler.local --home DIR``.

``edlctl local start`` runs this in the background; run it by hand to watch its log.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Annotated

import typer

from edl_scheduler.api import TrainingJobError
from edl_scheduler.local.config import DEFAULT_HOME, build_config
from edl_scheduler.local.serving import LocalService, ServiceBusy

app = typer.Typer(add_completion=False, help=__doc__)


@app.command()
def serve(
    home: Annotated[Path, typer.Option(help="Where the state, logs and socket live.")] = (
        DEFAULT_HOME
    ),
    slots: Annotated[
        int | None, typer.Option(min=1, help="Slots to offer (default: GPUs, else CPUs).")
    ] = None,
    policy: Annotated[
        Path | None, typer.Option(exists=True, dir_okay=False, help="A policy YAML file.")
    ] = None,
    period: Annotated[float, typer.Option(min=0.05, help="Seconds between cycles.")] = 0.5,
) -> None:
    """Serve the local backend until stopped."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    try:
        config = build_config(home, slots, policy, period)
        LocalService(config).serve()
    except (ServiceBusy, TrainingJobError, ValueError) as error:
        print(f"edl local service: {error}", file=sys.stderr)
        raise typer.Exit(2) from None


if __name__ == "__main__":
    app()
