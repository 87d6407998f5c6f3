"""Where a coordinator keeps its state between restarts: a small pluggable store.

A store holds one text document (the coordinator state as JSON) and is written after every
change. The file store writes atomically (a temporary file in the same directory, flushed,
then renamed over the old one), so a coordinator killed at any instant leaves either the old
or the new state, never a torn one. On Kubernetes the file lives on a volume the job names,
or the controller reads the same document through the coordinator's `GetSnapshot` call.

What must stay true: `load()` returns exactly the last document `save()` completed, or None
when nothing was ever saved, or (the file store) the document of a `save()` that raised
after its rename, when the directory's fsync failed: written, its durability unknown. The
coordinator refused the call that made that change, and the worker's retry of it is
idempotent (tested in `tests/runtime/test_coordinator_faults.py`).
"""

from __future__ import annotations

import os
import tempfile
import threading
from pathlib import Path
from typing import Protocol


class StateStore(Protocol):
    """The port a coordinator persists through."""

    def load(self) -> str | None: ...

    def save(self, document: str) -> None: ...


class MemoryStore:
    """A store in memory, for tests and for jobs that accept losing state with the process."""

    def __init__(self) -> None:
        self._document: str | None = None
        self._lock = threading.Lock()

    def load(self) -> str | None:
        with self._lock:
            return self._document

    def save(self, document: str) -> None:
        with self._lock:
            self._document = document


class FileStore:
    """A store in one file, replaced atomically on every save."""

    def __init__(self, path: Path | str, durable: bool = True) -> None:
        self.path = Path(path)
        self.durable = durable

    def load(self) -> str | None:
        try:
            return self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return None

    def save(self, document: str) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        descriptor, temporary = tempfile.mkstemp(
            prefix=f".{self.path.name}.", suffix=".tmp", dir=self.path.parent
        )
        try:
            with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
                handle.write(document)
                handle.flush()
                if self.durable:
                    os.fsync(handle.fileno())
            os.replace(temporary, self.path)
        except BaseException:
            Path(temporary).unlink(missing_ok=True)
            raise
        if self.durable:
            directory = os.open(self.path.parent, os.O_RDONLY)
            try:
                os.fsync(directory)
            finally:
                os.close(directory)
