"""The SDK's errors: each says what went wrong and how to fix it, and carries an exit code.

``edlctl`` prints the message and exits with ``exit_code``; scripts catch ``EdlError``.
"""

from __future__ import annotations


class EdlError(Exception):
    """A request failed; ``str()`` names the problem and the fix."""

    exit_code = 1


class InvalidRequest(EdlError):
    """The job or the request is malformed (bad YAML, min > max, too many slots, ...)."""

    exit_code = 2


class NotFound(EdlError):
    """The job (or the worker, or the log) does not exist."""

    exit_code = 3


class Conflict(EdlError):
    """The request clashes with the job's state (name taken, job already ended)."""

    exit_code = 4


class Unreachable(EdlError):
    """The backend did not answer (local service not started, API server down)."""

    exit_code = 5
