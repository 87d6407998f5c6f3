"""Resource vectors: GPUs, CPU in millicores and memory in bytes, all exact integers.

Every fit decision in the planner goes through these three numbers, so they are integers
(never floats): a quantity parsed from Kubernetes ("500m", "1.5Gi") is exact here, and two
placements that fit on paper cannot over-commit a node through rounding.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final


@dataclass(slots=True, init=False, eq=False)
class Resources:
    """What one replica asks for, or what a node offers. All fields are >= 0 in valid input.

    Nothing changes one once made (``Final``: compiled, assigning a field raises). A
    dataclass for ``replace``, ``fields`` and its repr, with ``__init__``, ``__eq__`` and
    ``__hash__`` written out: compiled, those are C, where the ones a dataclass generates are
    Python code (every ``+``, ``-`` and ``times`` makes one). They are the frozen
    dataclass's: equal when of the same class with equal fields, hashed as their tuple."""

    gpu: Final[int]
    cpu_milli: Final[int]
    memory_bytes: Final[int]

    def __init__(self, gpu: int = 0, cpu_milli: int = 0, memory_bytes: int = 0) -> None:
        self.gpu = gpu
        self.cpu_milli = cpu_milli
        self.memory_bytes = memory_bytes

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Resources):  # no class derives from it
            return NotImplemented
        return (
            self.gpu == other.gpu
            and self.cpu_milli == other.cpu_milli
            and self.memory_bytes == other.memory_bytes
        )

    def __hash__(self) -> int:
        return hash((self.gpu, self.cpu_milli, self.memory_bytes))

    def __add__(self, other: Resources) -> Resources:
        return Resources(
            self.gpu + other.gpu,
            self.cpu_milli + other.cpu_milli,
            self.memory_bytes + other.memory_bytes,
        )

    def __sub__(self, other: Resources) -> Resources:
        return Resources(
            self.gpu - other.gpu,
            self.cpu_milli - other.cpu_milli,
            self.memory_bytes - other.memory_bytes,
        )

    def times(self, count: int) -> Resources:
        return Resources(self.gpu * count, self.cpu_milli * count, self.memory_bytes * count)

    def fits_in(self, available: Resources) -> bool:
        return (
            self.gpu <= available.gpu
            and self.cpu_milli <= available.cpu_milli
            and self.memory_bytes <= available.memory_bytes
        )

    def is_negative(self) -> bool:
        return self.gpu < 0 or self.cpu_milli < 0 or self.memory_bytes < 0

    def __str__(self) -> str:
        gib = self.memory_bytes / 2**30
        return f"{self.gpu} GPU, {self.cpu_milli}m CPU, {gib:.3g}Gi memory"


NO_RESOURCES: Final = Resources()
