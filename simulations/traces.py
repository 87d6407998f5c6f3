"""Loaders: cluster traces and cluster specs into ``Workload`` and ``ClusterSpec`` values.

Formats (see ``../shared/traces/README.md`` for where each comes from and its licence):

- ``philly``: the Microsoft Philly trace as the Pollux artifact ships it
  (``timestamp,duration,num_gpus,gpu_time,cluster``); submit times become seconds from the
  earliest timestamp in the file, the virtual cluster becomes the job's group.
- ``tiresias``: the Tiresias simulator's job format
  (``job_id,num_gpu,submit_time,iterations,model_name,duration,interval``).
- ``pollux``: the Pollux workloads (``name,time,application,num_replicas,batch_size``),
  with each job's speed from its application's measured profile (``profiles``).
- cluster specs: ``NxG`` (N nodes of G GPUs) or a Tiresias ``n*g*.csv`` file
  (``num_switch,num_node_p_switch,num_gpu_p_node,...``).

What must stay true: a malformed row (a missing column, a value that is not a number, a
duration or submit time that is negative, not finite or beyond ten years, more GPUs than
the cluster has) is never silently dropped. It raises a ``TraceError`` naming the file and
line, or, with ``skip_bad_rows``, is skipped and counted in ``Workload.skipped_rows`` (the
CLI prints the count as a warning). A trace with no job, or two jobs of one id, is a
``TraceError`` too.
"""

from __future__ import annotations

import csv
import os
import re
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path

from simulations.profiles import Application, ProfileSpeed, load_application
from simulations.workload import ClusterSpec, SimJob, Workload

#: Set to the folder of the shared traces where they are not beside the checkout.
TRACES_ENV = "EDL_TRACES"


def default_traces() -> Path:
    """The shared traces' folder: ``$EDL_TRACES``, else ``shared/traces`` beside the checkout
    (the one place that knows this layout; the CLI, the benchmarks and the tests ask here)."""
    return Path(
        os.environ.get(TRACES_ENV) or Path(__file__).resolve().parents[2] / "shared" / "traces"
    )


class TraceError(ValueError):
    """A malformed trace or cluster spec; the message names the file and line."""


_EPOCH = datetime(1970, 1, 1)
_NXG = re.compile(r"^(\d+)x(\d+)$")


def load_cluster(spec: str) -> ClusterSpec:
    """``16x4``, or the path of a Tiresias cluster-spec CSV."""
    match = _NXG.match(spec.strip())
    if match:
        nodes, gpus = int(match.group(1)), int(match.group(2))
        if nodes < 1 or gpus < 1:
            raise TraceError(f"cluster {spec!r}: need at least 1 node and 1 GPU per node")
        return ClusterSpec(nodes, gpus)
    path = Path(spec)
    if not path.exists():
        raise TraceError(f"cluster {spec!r}: neither NxG nor an existing spec file")
    rows = list(_rows(path, ("num_switch", "num_node_p_switch", "num_gpu_p_node")))
    if len(rows) != 1:
        raise TraceError(f"{path}: expected one cluster row, found {len(rows)}")
    line, row = rows[0]
    try:
        nodes = int(row["num_switch"]) * int(row["num_node_p_switch"])
        gpus = int(row["num_gpu_p_node"])
    except ValueError as exc:
        raise TraceError(f"{path}:{line}: {exc}") from None
    if nodes < 1 or gpus < 1:
        raise TraceError(f"{path}:{line}: need at least 1 node and 1 GPU per node")
    return ClusterSpec(nodes, gpus)


def _rows(path: Path, required: tuple[str, ...]) -> Iterator[tuple[int, dict[str, str]]]:
    """(line number, row) for every data row; the header must name ``required``. A file
    that cannot be read (missing, a folder, not text) is a TraceError that says so; a
    byte-order mark before the header is not part of its first column's name."""
    try:
        handle = path.open(newline="", encoding="utf-8-sig")
    except FileNotFoundError:
        raise TraceError(f"{path}: no such file: give the path of a trace file") from None
    except IsADirectoryError:
        raise TraceError(f"{path} is a folder: give one trace file in it") from None
    except OSError as exc:
        raise TraceError(f"{path}: cannot be read ({exc.strerror}): check it") from None
    with handle:
        try:
            reader = csv.DictReader(handle)
            missing = [c for c in required if c not in (reader.fieldnames or ())]
            if missing:
                raise TraceError(f"{path}:1: missing column(s) {', '.join(missing)}")
            for row in reader:
                yield reader.line_num, row
        except UnicodeDecodeError:
            raise TraceError(f"{path}: not a UTF-8 text file: give a CSV trace") from None
        except csv.Error as exc:
            raise TraceError(f"{path}:{reader.line_num}: {exc}") from None


def _collect(
    path: Path,
    required: tuple[str, ...],
    parse: Callable[[int, dict[str, str]], SimJob | None],
    skip_bad_rows: bool,
) -> tuple[list[SimJob], int]:
    jobs: list[SimJob] = []
    skipped = 0
    for line, row in _rows(path, required):
        try:
            if any(row.get(c) in (None, "") for c in required):
                absent = [c for c in required if row.get(c) in (None, "")]
                raise ValueError(f"empty value in column(s) {', '.join(absent)}")
            job = parse(line, row)
        except ValueError as exc:
            if not skip_bad_rows:
                raise TraceError(f"{path}:{line}: {exc}") from None
            skipped += 1
            continue
        if job is not None:
            jobs.append(job)
    return jobs, skipped


#: The longest duration and the latest submit time a trace may give, in seconds (ten
#: years): beyond it a number is a unit mistake or junk, and one never-ending job would keep
#: the simulation from finishing.
MAX_SECONDS = 10 * 365 * 86400.0


def seconds(text: str, what: str) -> float:
    """A finite number of seconds in [0, ``MAX_SECONDS``] from a trace's text, or a
    ValueError naming ``what`` and the bound."""
    value = float(text)
    if not 0.0 <= value <= MAX_SECONDS:  # (nan fails too)
        raise ValueError(
            f"{what} {text!r} is not a number of seconds in [0, {MAX_SECONDS:.0f}] (ten years)"
        )
    return value


def _check(duration: float, gpus: int, cluster: ClusterSpec | None) -> None:
    if gpus < 1:
        raise ValueError(f"a job needs at least 1 GPU, not {gpus}")
    if cluster is not None and gpus > cluster.gpus:
        raise ValueError(f"{gpus} GPUs requested, the cluster has {cluster.gpus}")


def _job(name: str, submit: float, gpus: int, duration: float, group: str) -> SimJob:
    return SimJob(name, submit, gpus, duration, gpus, gpus, group=group)


def _finish(jobs: list[SimJob], source: Path, skipped: int) -> Workload:
    """The workload of ``jobs``, by submit time; a trace with no job (a header alone, or
    only rows skipped) or with two jobs of one id is a TraceError."""
    if not jobs:
        why = f"all {skipped} rows were malformed" if skipped else "it has a header alone"
        raise TraceError(f"{source}: no job to simulate ({why}): give a trace with job rows")
    seen: set[str] = set()
    for job in jobs:
        if job.name in seen:
            raise TraceError(f"{source}: job {job.name!r} appears twice: give each job its own id")
        seen.add(job.name)
    jobs.sort(key=lambda j: (j.submit_time, j.name))
    return Workload(tuple(jobs), str(source), skipped)


def load_tiresias(
    path: Path, cluster: ClusterSpec | None = None, *, skip_bad_rows: bool = False
) -> Workload:
    """A trace in the Tiresias simulator's format."""
    required = ("job_id", "num_gpu", "submit_time", "duration")

    def parse(line: int, row: dict[str, str]) -> SimJob:
        gpus, duration = int(row["num_gpu"]), seconds(row["duration"], "duration")
        _check(duration, gpus, cluster)
        submit = seconds(row["submit_time"], "submit time")
        return _job(f"job-{row['job_id']}", submit, gpus, duration, row.get("model_name") or "")

    jobs, skipped = _collect(path, required, parse, skip_bad_rows)
    return _finish(jobs, path, skipped)


def load_philly(
    path: Path,
    cluster: ClusterSpec | None = None,
    *,
    skip_bad_rows: bool = False,
    limit: int | None = None,
) -> Workload:
    """The Philly trace (Pollux artifact format). Jobs are named by their line number;
    ``limit`` keeps the first jobs by submit time."""
    required = ("timestamp", "duration", "num_gpus", "cluster")
    stamps: list[float] = []

    def parse(line: int, row: dict[str, str]) -> SimJob:
        gpus, duration = int(row["num_gpus"]), seconds(row["duration"], "duration")
        _check(duration, gpus, cluster)
        # Naive local times, read as they are: no time zone, so no daylight-saving jumps.
        stamp = (datetime.fromisoformat(row["timestamp"]) - _EPOCH).total_seconds()
        stamps.append(stamp)
        return _job(f"philly-{line}", stamp, gpus, duration, row["cluster"])

    jobs, skipped = _collect(path, required, parse, skip_bad_rows)
    origin = min(stamps, default=0.0)
    shifted = [
        SimJob(
            j.name,
            j.submit_time - origin,
            j.requested,
            j.duration,
            j.requested,
            j.requested,
            group=j.group,
        )
        for j in jobs
    ]
    workload = _finish(shifted, path, skipped)
    if limit is not None:
        workload = Workload(workload.jobs[:limit], workload.source, skipped)
    return workload


def pollux_bounds(app: Application) -> tuple[int, int]:
    """Elastic bounds of a Pollux-workload job: min 1, max = min(64, the application's
    maximum batch / its minimum local batch); ncf stays at 1 (as in the Pollux artifact)."""
    if app.name == "ncf":
        return 1, 1
    return 1, max(1, min(64, app.max_batch // app.min_local))


def load_pollux(
    path: Path,
    profiles: Path,
    cluster: ClusterSpec | None = None,
    *,
    adapt_batch: bool = False,
    skip_bad_rows: bool = False,
) -> Workload:
    """A Pollux workload (``name,time,application,num_replicas,batch_size``), each job's
    speed from its application's measured profile under ``profiles`` (``pollux/traces``).
    Jobs carry their elastic bounds; ``shape`` makes them rigid where asked."""
    required = ("name", "time", "application", "num_replicas", "batch_size")

    def parse(line: int, row: dict[str, str]) -> SimJob:
        replicas, batch = int(row["num_replicas"]), int(row["batch_size"])
        submit = seconds(row["time"], "submit time")
        _check(0.0, replicas, cluster)
        if batch < 1:
            raise ValueError(f"batch size {batch} < 1")
        name = row["application"]
        if not (profiles / name / "placements.csv").exists():
            raise ValueError(
                f"no profile for application {name!r} under {profiles}: point --profiles at "
                "the folder of the Pollux application profiles (pollux/traces)"
            )
        app = load_application(profiles, name)
        lo, hi = pollux_bounds(app)
        speed = ProfileSpeed(app, batch, adapt_batch)
        return SimJob(
            row["name"],
            submit,
            replicas,
            0.0,
            replicas,
            replicas,
            group=name,
            profile=speed,
            elastic_bounds=(lo, hi),
        )

    jobs, skipped = _collect(path, required, parse, skip_bad_rows)
    return _finish(jobs, path, skipped)
