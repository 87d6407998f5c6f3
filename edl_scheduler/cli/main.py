"""edlctl: one CLI for elastic training jobs, on this machine or on Kubernetes.

``--backend local`` (the default) talks to the local service of ``--home``;
``--backend kube`` to the API server of the kubeconfig's context. Every verb goes through
the SDK (``edl_scheduler.sdk``), so a script can do what edlctl does.

What must stay true: every failure prints one message that names the problem and the fix,
and exits non-zero (the SDK error's ``exit_code``); nothing prints a traceback for bad input.
"""

from __future__ import annotations

import enum
import shlex
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, NoReturn

import typer
import yaml
from rich.console import Console
from rich.live import Live
from rich.markup import escape

from edl_scheduler.cli.rendering import cluster_panel, details_panel, jobs_table
from edl_scheduler.local.config import DEFAULT_HOME
from edl_scheduler.sdk import Client, EdlError, connect
from edl_scheduler.sdk.errors import Unreachable
from edl_scheduler.sdk.local import service_running, start_service, stop_service

app = typer.Typer(
    name="edlctl",
    add_completion=False,
    no_args_is_help=True,
    help="Elastic training jobs on this machine (local) or on Kubernetes (kube).",
)
local_app = typer.Typer(no_args_is_help=True, help="Start, stop and inspect the local service.")
app.add_typer(local_app, name="local")

# Lines are printed as long as they are: a terminal wraps them itself, and piped to a file
# (the demo's log, a script's capture) a hard wrap at 80 columns would split them.
out = Console(soft_wrap=True)
err = Console(stderr=True, soft_wrap=True)


class Backend(enum.StrEnum):
    LOCAL = "local"
    KUBE = "kube"


@dataclass(slots=True)
class Settings:
    backend: Backend
    home: Path
    context: str | None
    kubeconfig: Path | None
    namespace: str


def fail(error: EdlError | str, code: int = 1) -> NoReturn:
    message = str(error)
    if isinstance(error, EdlError):
        code = error.exit_code
    err.print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def client(ctx: typer.Context) -> Client:
    s: Settings = ctx.obj
    try:
        return connect(
            s.backend.value,
            home=s.home,
            context=s.context,
            kubeconfig=s.kubeconfig,
            namespace=s.namespace,
        )
    except EdlError as error:
        fail(error)


@app.callback()
def main(
    ctx: typer.Context,
    backend: Annotated[
        Backend, typer.Option(envvar="EDL_BACKEND", help="Where the jobs run.")
    ] = Backend.LOCAL,
    home: Annotated[
        Path, typer.Option(envvar="EDL_HOME", help="The local service's directory.")
    ] = DEFAULT_HOME,
    context: Annotated[str | None, typer.Option(help="kubeconfig context (kube).")] = None,
    kubeconfig: Annotated[Path | None, typer.Option(help="kubeconfig file (kube).")] = None,
    namespace: Annotated[
        str, typer.Option("--namespace", "-n", help="Namespace (queue) of the jobs.")
    ] = "default",
) -> None:
    ctx.obj = Settings(backend, home, context, kubeconfig, namespace)


# -- submit -----------------------------------------------------------------------------------


def manifest_from_options(
    name: str,
    command: str,
    image: str,
    min_replicas: int,
    max_replicas: int,
    priority: int,
    gpus: int,
    samples: int | None,
    epochs: int,
    framework: str,
    namespace: str,
) -> str:
    document: dict[str, object] = {
        "apiVersion": "edl.dev/v1alpha1",
        "kind": "TrainingJob",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "minReplicas": min_replicas,
            "maxReplicas": max_replicas,
            "priority": priority,
            "framework": framework,
            "resources": {"nvidia.com/gpu": gpus},
            "template": {
                "spec": {
                    "containers": [
                        {"name": "worker", "image": image, "command": shlex.split(command)}
                    ]
                }
            },
        },
    }
    if samples is not None:
        document["metadata"]["annotations"] = {  # type: ignore[index]
            "edl.dev/coordinator-args": f"--samples {samples} --epochs {epochs}"
        }
    return yaml.safe_dump(document, sort_keys=False)


@app.command()
def submit(
    ctx: typer.Context,
    file: Annotated[
        Path | None, typer.Option("--file", "-f", help="TrainingJob YAML ('-': stdin).")
    ] = None,
    name: Annotated[str | None, typer.Option(help="Job name (with --command).")] = None,
    command: Annotated[str | None, typer.Option(help="Worker command line.")] = None,
    image: Annotated[str, typer.Option(help="Worker image (Kubernetes).")] = "python:3.11",
    min_replicas: Annotated[int, typer.Option("--min", help="Fewest workers.")] = 1,
    max_replicas: Annotated[int, typer.Option("--max", help="Most workers.")] = 1,
    priority: Annotated[int, typer.Option(help="Higher runs first.")] = 0,
    gpus: Annotated[int, typer.Option(help="GPUs (slots) per worker.")] = 0,
    samples: Annotated[int | None, typer.Option(help="Dataset size, for the coordinator.")] = None,
    epochs: Annotated[int, typer.Option(help="Epochs, for the coordinator.")] = 1,
    framework: Annotated[str, typer.Option(help="torch, paddle or none.")] = "torch",
) -> None:
    """Submit a job: -f job.yaml, or --name and --command with --min/--max/--priority."""
    s: Settings = ctx.obj
    if file is not None and command is not None:
        fail("give either --file or --command, not both", 2)
    if file is not None:
        try:
            text = sys.stdin.read() if str(file) == "-" else file.read_text()
        except OSError as error:
            fail(f"cannot read {file}: {error.strerror}: check the path", 2)
        except UnicodeDecodeError:
            fail(f"{file} is not UTF-8 text: give the TrainingJob as a YAML file", 2)
        workdir = Path.cwd() if str(file) == "-" else file.resolve().parent
    elif command is not None:
        if name is None:
            fail("--command needs --name: give the job a name", 2)
        text = manifest_from_options(
            name,
            command,
            image,
            min_replicas,
            max_replicas,
            priority,
            gpus,
            samples,
            epochs,
            framework,
            s.namespace,
        )
        workdir = Path.cwd()
    else:
        fail("nothing to submit: give -f job.yaml, or --name and --command", 2)
    try:
        job = client(ctx).submit(text, workdir)
    except EdlError as error:
        fail(error)
    out.print(f"submitted {job.namespace}/{job.name} ({job.phase})")


# -- read ---------------------------------------------------------------------------------------


@app.command("ls")
def list_jobs(ctx: typer.Context) -> None:
    """List jobs: NAME QUEUE PRIO MIN/MAX REPLICAS PHASE AGE."""
    try:
        jobs = client(ctx).list()
    except EdlError as error:
        fail(error)
    out.print(jobs_table(jobs))


@app.command()
def describe(ctx: typer.Context, name: str) -> None:
    """A job's spec, status, workers, resize history and Events."""
    try:
        details = client(ctx).describe(name)
    except EdlError as error:
        fail(error)
    out.print(details_panel(details))


@app.command()
def why(ctx: typer.Context, name: str) -> None:
    """Why a job has the size it has: the planner's reason, resizes and recent Events."""
    try:
        details = client(ctx).describe(name)
    except EdlError as error:
        fail(error)
    out.print(details_panel(details, why_only=True))


# -- change -------------------------------------------------------------------------------------


@app.command()
def scale(
    ctx: typer.Context,
    name: str,
    min_replicas: Annotated[int | None, typer.Option("--min", help="New minimum.")] = None,
    max_replicas: Annotated[int | None, typer.Option("--max", help="New maximum.")] = None,
) -> None:
    """Change a job's minimum and/or maximum workers."""
    if min_replicas is None and max_replicas is None:
        fail("give --min and/or --max", 2)
    if min_replicas is not None and max_replicas is not None and min_replicas > max_replicas:
        fail(f"--min {min_replicas} is above --max {max_replicas}: lower --min or raise --max", 2)
    try:
        job = client(ctx).scale(name, min_replicas, max_replicas)
    except EdlError as error:
        fail(error)
    out.print(f"{job.namespace}/{job.name}: min {job.min_replicas}, max {job.max_replicas}")


@app.command()
def suspend(ctx: typer.Context, name: str) -> None:
    """Hold a job with no workers; its training state is kept."""
    try:
        job = client(ctx).suspend(name)
    except EdlError as error:
        fail(error)
    out.print(f"{job.namespace}/{job.name}: suspended")


@app.command()
def resume(ctx: typer.Context, name: str) -> None:
    """Let a suspended job run again."""
    try:
        job = client(ctx).resume(name)
    except EdlError as error:
        fail(error)
    out.print(f"{job.namespace}/{job.name}: resumed")


@app.command()
def delete(ctx: typer.Context, name: str) -> None:
    """Stop a job's processes and forget it."""
    try:
        client(ctx).delete(name)
    except EdlError as error:
        fail(error)
    out.print(f"deleted {name}")


@app.command()
def logs(
    ctx: typer.Context,
    name: str,
    worker: Annotated[
        str | None,
        typer.Option(
            help="A worker by number (1), short name (worker-1) or full name, or "
            "'coordinator' (default: the worker of rank 0)."
        ),
    ] = None,
    tail: Annotated[int, typer.Option(help="Last N lines (0: all that is kept).")] = 0,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Keep printing.")] = False,
) -> None:
    """Print a worker's (or the coordinator's) output."""
    c = client(ctx)
    try:
        chunk = c.logs(name, worker, tail)
        sys.stdout.write(chunk.text)
        while follow:
            time.sleep(0.5)
            chunk = c.logs(name, chunk.worker if worker is None else worker, 0, chunk.offset)
            sys.stdout.write(chunk.text)
            sys.stdout.flush()
    except EdlError as error:
        fail(error)
    except KeyboardInterrupt:
        pass


@app.command()
def top(
    ctx: typer.Context,
    once: Annotated[bool, typer.Option(help="Print one view and exit.")] = False,
    interval: Annotated[float, typer.Option(help="Seconds between refreshes.")] = 1.0,
) -> None:
    """A live view of the slots and the jobs: how far each job is and how fast it trains.
    Written to a pipe or a file (not a terminal), one view each interval, or one with
    --once."""
    c = client(ctx)
    try:
        if once or not out.is_terminal:
            while True:
                out.print(cluster_panel(c.top()))
                if once:
                    return
                time.sleep(interval)
        with Live(cluster_panel(c.top()), console=out, refresh_per_second=4) as live:
            while True:
                time.sleep(interval)
                live.update(cluster_panel(c.top()))
    except EdlError as error:
        fail(error)
    except KeyboardInterrupt:
        pass


# -- the local service --------------------------------------------------------------------------


@local_app.command("start")
def local_start(
    ctx: typer.Context,
    slots: Annotated[
        int | None, typer.Option(min=1, help="Slots (default: GPUs, else CPUs).")
    ] = None,
    policy: Annotated[Path | None, typer.Option(help="A policy YAML file.")] = None,
) -> None:
    """Start the local service in the background."""
    s: Settings = ctx.obj
    try:
        with start_service(s.home, slots, policy) as c:
            health = c.health()
    except EdlError as error:
        fail(error)
    out.print(f"local service running (pid {health['pid']}, {health['slots']} slots, {s.home})")


@local_app.command("stop")
def local_stop(
    ctx: typer.Context,
    keep_running: Annotated[
        bool, typer.Option(help="Leave the jobs' processes running for the next service.")
    ] = False,
) -> None:
    """Stop the local service (and, unless --keep-running, the jobs' processes)."""
    s: Settings = ctx.obj
    if not stop_service(s.home, keep_running):
        out.print("the local service was not running")
        return
    out.print("local service stopped")


@local_app.command("status")
def local_status(ctx: typer.Context) -> None:
    """Whether the local service runs."""
    s: Settings = ctx.obj
    if service_running(s.home):
        out.print(f"running ({s.home})")
    else:
        out.print(f"not running ({s.home})")
        raise typer.Exit(Unreachable.exit_code)


@app.command()
def demo(
    home: Annotated[
        Path | None, typer.Option(help="Directory for the demo's service (default: temporary).")
    ] = None,
) -> None:
    """The elastic demo: a 4-slot cluster, a high-priority job shrinks a low-priority one."""
    from edl_scheduler.cli.demo import run_demo

    code = run_demo(home, out)
    raise typer.Exit(code)


def run() -> None:
    app()


if __name__ == "__main__":
    run()
