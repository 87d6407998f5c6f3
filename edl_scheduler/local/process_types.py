"""What the process supervisor (``processes``) deals in: a process to run
(``ProcessSpec``), one as last observed (``ProcessStatus``, ``ProcessState``), and the
errors its calls raise. Values only: nothing here starts or signals a process.

What must stay true: a ``ProcessSpec`` is valid once made (a name, a command), and a
``ProcessStatus`` is never changed in place (the supervisor replaces it).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path


class ProcessState(enum.Enum):
    """Where a supervised process is; the diagram is in ``processes``' module docstring."""

    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    EXITED = "Exited"
    """An adopted process is gone; it was not our child, so its exit code is unknown."""

    @property
    def finished(self) -> bool:
        return self is not ProcessState.RUNNING


@dataclass(frozen=True, slots=True)
class ProcessSpec:
    """What to run.

    ``env`` is laid over this process's environment when ``inherit_env`` is true (the
    default), and is the whole environment otherwise. Standard output and standard error both
    go to ``log_path`` (appended to, so a restarted process keeps its predecessor's log).
    """

    name: str
    argv: Sequence[str]
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: Path | None = None
    log_path: Path | None = None
    inherit_env: bool = True

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("ProcessSpec.name is empty: give every process a unique name")
        if not self.argv or not self.argv[0]:
            raise ValueError(
                f"ProcessSpec {self.name!r}: argv is empty: give the command to run, "
                "e.g. ['python', 'train.py']"
            )
        object.__setattr__(self, "argv", tuple(str(a) for a in self.argv))


@dataclass(frozen=True, slots=True)
class ProcessStatus:
    """One process as last observed. Times are seconds since the epoch."""

    name: str
    pid: int | None
    state: ProcessState
    exit_code: int | None
    started_at: float
    finished_at: float | None
    create_time: float | None
    """The operating system's start time of ``pid``: store it with the pid to adopt later."""
    adopted: bool = False
    message: str = ""
    """Why the process failed to start, or which signal ended it; empty otherwise."""

    @property
    def running(self) -> bool:
        return self.state is ProcessState.RUNNING


class UnknownProcess(KeyError):
    """No process of that name is supervised."""

    def __str__(self) -> str:
        return f"no supervised process is named {self.args[0]!r}"


class ProcessAlreadyRunning(ValueError):
    """A process of that name is still running: stop it first or pick another name."""


class AdoptionError(ValueError):
    """The pid to adopt is gone or now belongs to another process (pid reuse)."""
