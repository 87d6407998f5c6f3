"""Which file a job's log is, by the names a person uses for it.

Every process of a job writes ``DIR/logs/<namespace>.<job>.<process>.log``, where the
process is ``worker-<n>``, ``pserver-<n>`` (a ``ps`` job's parameter server) or
``coordinator``; the files stay after the process (and the job) ended. A person names a log
by the process's full name, its short name (``worker-1``, ``pserver-0``, ``coordinator``)
or a worker's number (``1``); with no name, the worker of
rank 0 (the one whose output a training script prints), else the oldest live worker, else
the last worker's log kept.

What must stay true: only a file of that job, inside the log folder, is ever returned.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

_WORKER = "worker-"
_SERVER = "pserver-"
_COORDINATOR = "coordinator"
_SUFFIX = ".log"


class LogNotFound(LookupError):
    """No log of the job by that name; the message lists those there are."""


def _stem(key: str) -> str:
    return key.replace("/", ".")


def log_names(log_dir: Path, key: str) -> list[str]:
    """The short names of job ``key``'s logs on disk: workers by number, then parameter
    servers by number, then the coordinator."""
    prefix = _stem(key) + "."
    found = [p.name[len(prefix) : -len(_SUFFIX)] for p in log_dir.glob(f"{prefix}*{_SUFFIX}")]
    coordinator = [_COORDINATOR] if _COORDINATOR in found else []
    return _numbered(found, _WORKER) + _numbered(found, _SERVER) + coordinator


def _numbered(names: list[str], kind: str) -> list[str]:
    """The names ``<kind><n>`` among ``names``, by number."""
    mine = [n for n in names if n.startswith(kind) and n[len(kind) :].isdigit()]
    return sorted(mine, key=lambda n: int(n[len(kind) :]))


def find_log(
    log_dir: Path,
    key: str,
    worker: str | None,
    ranks: Mapping[str, int],
    live: Sequence[str],
) -> Path:
    """The log file ``worker`` names for job ``key``. ``ranks``: the rank of each member
    of the job's current group, by process name; ``live``: its live workers' process
    names, oldest first."""
    stem = _stem(key)
    if worker is None:
        if ranks:
            worker = min(ranks, key=lambda name: ranks[name])
        elif live:
            worker = live[0]
        else:
            kept = [n for n in log_names(log_dir, key) if n.startswith(_WORKER)]
            worker = kept[-1] if kept else _COORDINATOR
    if worker.isdigit():
        worker = _WORKER + worker
    if worker == _COORDINATOR or worker.startswith((_WORKER, _SERVER)):
        worker = f"{stem}.{worker}"
    path = (log_dir / f"{worker}{_SUFFIX}").resolve()
    inside = path.parent == log_dir.resolve() and path.name.startswith(stem + ".")
    if not inside or not path.is_file():
        names = ", ".join(log_names(log_dir, key)) or "none yet"
        raise LogNotFound(
            f"no log {worker!r} for job {key}: name one of its logs ({names}), by name or by number"
        )
    return path
