"""Fixtures of the runtime tests (defined in `harness.py`)."""

from .harness import cluster, coordinator

__all__ = ["cluster", "coordinator"]
