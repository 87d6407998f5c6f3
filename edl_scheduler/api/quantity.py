"""Kubernetes resource quantities ("500m", "2Gi", "1e3"), parsed exactly.

Why this exists: the planner compares per-replica requests against node capacity, and any
rounding error there over-commits nodes (invariant 1 of the design). So quantities are parsed
with `Decimal`, never `float`, and rounded the way the Kubernetes scheduler rounds them:
CPU up to whole millicores, memory (and any other integer resource) up to whole units.

What must stay true:
- `Quantity` keeps the value exactly as the user wrote it (`raw`), so a job written back to
  YAML reads as it was submitted; equality and hashing go by the numeric value only.
- Parsing accepts exactly the Kubernetes grammar: an optional sign, a decimal number, and one
  suffix (binary `Ki`..`Ei`, decimal `n u m k M G T P E`, or an exponent `e3` / `E-2`).
  Negative values, junk, and values beyond 2**63-1 are rejected with a message that names
  the field and says how to fix it.
- Nothing here does I/O or imports anything above `edl_scheduler.api`.
"""

from __future__ import annotations

import decimal
import re
from dataclasses import dataclass
from decimal import ROUND_CEILING, Decimal
from typing import Any, Final

from pydantic import GetCoreSchemaHandler, GetJsonSchemaHandler
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import core_schema

__all__ = [
    "QUANTITY_PATTERN",
    "Quantity",
    "QuantityError",
    "parse_quantity",
]

# Enough digits that no quantity accepted below is ever rounded while it is scaled.
_CONTEXT: Final = decimal.Context(prec=120, rounding=ROUND_CEILING, Emax=10_000, Emin=-10_000)
_MAX_TEXT: Final = 64
_INT64_MAX: Final = Decimal(2**63 - 1)

_BINARY: Final[dict[str, int]] = {
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
    "Pi": 2**50,
    "Ei": 2**60,
}
_DECIMAL: Final[dict[str, int]] = {
    "n": -9,
    "u": -6,
    "m": -3,
    "": 0,
    "k": 3,
    "M": 6,
    "G": 9,
    "T": 12,
    "P": 15,
    "E": 18,
}

#: The grammar of a non-negative quantity; also written into the CRD as the string pattern.
QUANTITY_PATTERN: Final = (
    r"^\+?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))"
    r"(([KMGTPE]i)|[numkMGTPE]|([eE][+-]?[0-9]+))?$"
)
# The same grammar with a sign, so that "-1" is reported as negative rather than as junk.
_GRAMMAR: Final = re.compile(
    r"(?P<number>[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))"
    r"(?P<suffix>[KMGTPE]i|[numkMGTPE]|[eE][+-]?[0-9]+)?"
)

_EXAMPLES: Final = "for example 500m, 2, 1.5, 4Gi, 512Mi, 1G or 1e3"


class QuantityError(ValueError):
    """A value is not a valid non-negative Kubernetes quantity; the message says why."""


def _where(field: str | None) -> str:
    return f"{field} " if field else ""


def parse_quantity(value: object, field: str | None = None) -> Decimal:
    """Return the exact value of a Kubernetes quantity given as text or as a number.

    `field` names the field in error messages ("spec.resources.cpu"). Raises `QuantityError`.
    """
    where = _where(field)
    if isinstance(value, bool) or not isinstance(value, int | float | str | Decimal):
        raise QuantityError(
            f"{where}must be a quantity such as 500m or 4Gi, not {type(value).__name__}"
        )
    if isinstance(value, float):
        # A CRD's int-or-string field takes no fractional numbers, so neither do we: a job
        # that loads here must also be accepted by the API server.
        raise QuantityError(
            f"{where}is a fractional number ({value!r}): quote it, e.g. '{value!r}', "
            "or write it with a suffix such as 500m"
        )
    amount = Decimal(value) if isinstance(value, int | Decimal) else _parse_text(value, where)
    if amount < 0:
        raise QuantityError(
            f"{where}must not be negative (got {value!r}): give a value of 0 or more"
        )
    if amount > _INT64_MAX:
        raise QuantityError(f"{where}is too large (got {value!r}): the limit is 2**63-1")
    return amount


def _parse_text(text: str, where: str) -> Decimal:
    if len(text) > _MAX_TEXT:
        raise QuantityError(f"{where}is too long to be a quantity ({len(text)} characters)")
    match = _GRAMMAR.fullmatch(text)
    if match is None:
        raise QuantityError(f"{where}is not a quantity (got {text!r}): write it {_EXAMPLES}")
    number = Decimal(match["number"])
    suffix = match["suffix"] or ""
    with decimal.localcontext(_CONTEXT):
        if suffix in _BINARY:
            return number * _BINARY[suffix]
        if suffix in _DECIMAL:
            return number.scaleb(_DECIMAL[suffix])
        exponent = int(suffix[1:])
        if abs(exponent) > 100:
            raise QuantityError(f"{where}has an exponent out of range (got {text!r})")
        return number.scaleb(exponent)


def _ceil(amount: Decimal) -> int:
    return int(amount.to_integral_value(rounding=ROUND_CEILING))


@dataclass(frozen=True, eq=False, slots=True)
class Quantity:
    """A non-negative Kubernetes quantity: the text as written, and its exact value.

    Build one with `Quantity.parse(...)`. Two quantities are equal when their values are,
    whatever their spelling ("1Gi" == "1024Mi"), as with Kubernetes' `Quantity.Cmp`.
    """

    raw: int | str
    value: Decimal

    @classmethod
    def parse(cls, raw: object, field: str | None = None) -> Quantity:
        """Parse `raw` (text or number); raises `QuantityError` naming `field`."""
        if isinstance(raw, Quantity):
            return raw
        amount = parse_quantity(raw, field)
        kept: int | str = raw if isinstance(raw, int | str) else str(raw)
        return cls(raw=kept, value=amount)

    @property
    def milli(self) -> int:
        """The value in thousandths, rounded up (CPU: whole millicores)."""
        return _ceil(self.value * 1000)

    @property
    def units(self) -> int:
        """The value rounded up to a whole unit (memory: whole bytes)."""
        return _ceil(self.value)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Quantity):
            return self.value == other.value
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self.value)

    def __str__(self) -> str:
        return str(self.raw)

    def __repr__(self) -> str:
        return f"Quantity({self.raw!r})"

    @classmethod
    def __get_pydantic_core_schema__(
        cls, source: type[Any], handler: GetCoreSchemaHandler
    ) -> core_schema.CoreSchema:
        return core_schema.no_info_plain_validator_function(
            cls.parse,
            serialization=core_schema.plain_serializer_function_ser_schema(
                _serialize, when_used="always"
            ),
        )

    @classmethod
    def __get_pydantic_json_schema__(
        cls, schema: core_schema.CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        # The form Kubernetes itself uses for resource.Quantity in structural schemas.
        return {
            "anyOf": [{"type": "integer"}, {"type": "string"}],
            "pattern": QUANTITY_PATTERN,
            "x-kubernetes-int-or-string": True,
        }


def _serialize(quantity: Quantity) -> int | str:
    return quantity.raw
