"""Kubernetes quantities, parsed exactly.

Aspects tested:
- a table of accepted spellings with their exact value, millicores and whole units
  (every suffix, decimal exponents, fractions, leading +, plain integers);
- rounding: CPU up to whole millicores, memory up to whole bytes, never down;
- rejection of negatives, junk, fractional numbers, booleans, huge values, with a message
  that names the field and says what to write;
- `Quantity` keeps the spelling it was given and compares by value;
- `ReplicaResources` exposes `cpu_milli` and `memory_bytes` and writes quantities back as given;
- property: n<suffix> is exactly n times the suffix's multiplier.
"""

from __future__ import annotations

from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from edl_scheduler.api import Quantity, QuantityError, ReplicaResources, parse_quantity

KI = 1024

ACCEPTED: list[tuple[object, Decimal, int, int]] = [
    # (input, exact value, milli (rounded up), units (rounded up))
    ("0", Decimal(0), 0, 0),
    (0, Decimal(0), 0, 0),
    (3, Decimal(3), 3000, 3),
    ("2", Decimal(2), 2000, 2),
    ("+2", Decimal(2), 2000, 2),
    ("500m", Decimal("0.5"), 500, 1),
    ("1500m", Decimal("1.5"), 1500, 2),
    ("0.1", Decimal("0.1"), 100, 1),
    (".5", Decimal("0.5"), 500, 1),
    ("2.", Decimal(2), 2000, 2),
    ("0.0001", Decimal("0.0001"), 1, 1),  # CPU rounds up to one millicore, as in Kubernetes
    ("1.0005", Decimal("1.0005"), 1001, 2),
    ("100u", Decimal("0.0001"), 1, 1),
    ("5n", Decimal("5e-9"), 1, 1),
    ("1k", Decimal(1000), 1_000_000, 1000),
    ("1M", Decimal(10**6), 10**9, 10**6),
    ("1G", Decimal(10**9), 10**12, 10**9),
    ("1T", Decimal(10**12), 10**15, 10**12),
    ("1P", Decimal(10**15), 10**18, 10**15),
    ("1E", Decimal(10**18), 10**21, 10**18),
    ("1Ki", Decimal(KI), KI * 1000, KI),
    ("1Mi", Decimal(KI**2), KI**2 * 1000, KI**2),
    ("2Gi", Decimal(2 * KI**3), 2 * KI**3 * 1000, 2 * KI**3),
    ("1.5Gi", Decimal(3 * KI**3 // 2), 3 * KI**3 // 2 * 1000, 3 * KI**3 // 2),
    ("1Ti", Decimal(KI**4), KI**4 * 1000, KI**4),
    ("1Pi", Decimal(KI**5), KI**5 * 1000, KI**5),
    ("1Ei", Decimal(KI**6), KI**6 * 1000, KI**6),
    ("0.3Ki", Decimal("307.2"), 307_200, 308),  # memory rounds up to a whole byte
    ("1e3", Decimal(1000), 1_000_000, 1000),
    ("1E3", Decimal(1000), 1_000_000, 1000),
    ("1.5e3", Decimal(1500), 1_500_000, 1500),
    ("12e-3", Decimal("0.012"), 12, 1),
    ("1e+2", Decimal(100), 100_000, 100),
    ("128974848", Decimal(128974848), 128974848000, 128974848),
    ("129e6", Decimal(129_000_000), 129_000_000_000, 129_000_000),
    ("123Mi", Decimal(123 * KI**2), 123 * KI**2 * 1000, 123 * KI**2),
]


@pytest.mark.parametrize(("raw", "value", "milli", "units"), ACCEPTED)
def test_accepted_spellings_parse_exactly(
    raw: object, value: Decimal, milli: int, units: int
) -> None:
    quantity = Quantity.parse(raw)
    assert quantity.value == value
    assert quantity.milli == milli
    assert quantity.units == units
    assert quantity.raw == raw


REJECTED: list[tuple[object, str]] = [
    ("-1", "must not be negative"),
    (-5, "must not be negative"),
    ("-500m", "must not be negative"),
    ("abc", "is not a quantity"),
    ("", "is not a quantity"),
    ("1 Gi", "is not a quantity"),
    (" 1", "is not a quantity"),
    ("1gi", "is not a quantity"),
    ("1KiB", "is not a quantity"),
    ("1e", "is not a quantity"),
    ("1.2.3", "is not a quantity"),
    ("0x10", "is not a quantity"),
    ("1e3.5", "is not a quantity"),
    ("1Ki1", "is not a quantity"),
    ("Infinity", "is not a quantity"),
    ("NaN", "is not a quantity"),
    (0.5, "is a fractional number"),
    (True, "must be a quantity"),
    (None, "must be a quantity"),
    ([1], "must be a quantity"),
    ("10Ei", "is too large"),
    (2**63, "is too large"),
    ("1e200", "exponent out of range"),
    ("1" * 65, "too long"),
]


@pytest.mark.parametrize(("raw", "fragment"), REJECTED)
def test_rejected_values_name_the_field_and_the_fix(raw: object, fragment: str) -> None:
    with pytest.raises(QuantityError) as caught:
        parse_quantity(raw, "spec.resources.cpu")
    message = str(caught.value)
    assert message.startswith("spec.resources.cpu ")
    assert fragment in message


def test_junk_message_shows_how_to_write_a_quantity() -> None:
    with pytest.raises(QuantityError, match=r"write it for example 500m.*4Gi"):
        parse_quantity("four", "memory")


def test_fractional_number_message_says_to_quote_it() -> None:
    with pytest.raises(QuantityError, match=r"quote it, e\.g\. '0\.5'"):
        parse_quantity(0.5)


def test_largest_int64_is_accepted() -> None:
    assert parse_quantity(2**63 - 1) == Decimal(2**63 - 1)
    assert parse_quantity("7Ei") == Decimal(7 * KI**6)


def test_quantities_compare_by_value_and_keep_their_spelling() -> None:
    assert Quantity.parse("1Gi") == Quantity.parse("1024Mi")
    assert hash(Quantity.parse("1Gi")) == hash(Quantity.parse("1024Mi"))
    assert Quantity.parse("1") == Quantity.parse(1) == Quantity.parse("1000m")
    assert Quantity.parse("1G") != Quantity.parse("1Gi")
    assert str(Quantity.parse("1024Mi")) == "1024Mi"
    assert Quantity.parse(Quantity.parse("3")).raw == "3"


def test_replica_resources_expose_exact_integers() -> None:
    resources = ReplicaResources.model_validate(
        {"nvidia.com/gpu": 2, "cpu": "2500m", "memory": "1.5Gi"}
    )
    assert resources.gpu == 2
    assert resources.cpu_milli == 2500
    assert resources.memory_bytes == 1536 * KI**2
    assert type(resources.cpu_milli) is int
    assert type(resources.memory_bytes) is int


def test_replica_resources_default_to_nothing_requested() -> None:
    resources = ReplicaResources()
    assert (resources.gpu, resources.cpu_milli, resources.memory_bytes) == (0, 0, 0)


def test_replica_resources_write_quantities_back_as_given() -> None:
    given_ = {"nvidia.com/gpu": 1, "cpu": 4, "memory": "16Gi"}
    resources = ReplicaResources.model_validate(given_)
    assert resources.model_dump(mode="json", by_alias=True, exclude_none=True) == given_


def test_replica_resources_accept_python_names() -> None:
    resources = ReplicaResources(gpu=1, cpu=Quantity.parse("250m"))
    assert resources.gpu == 1
    assert resources.cpu_milli == 250


SUFFIXES = {
    "": Decimal(1),
    "k": Decimal(10**3),
    "M": Decimal(10**6),
    "G": Decimal(10**9),
    "m": Decimal("0.001"),
    "Ki": Decimal(2**10),
    "Mi": Decimal(2**20),
    "Gi": Decimal(2**30),
    "Ti": Decimal(2**40),
}


@given(number=st.integers(min_value=0, max_value=10**6), suffix=st.sampled_from(list(SUFFIXES)))
def test_integer_with_suffix_is_exact(number: int, suffix: str) -> None:
    assert parse_quantity(f"{number}{suffix}") == number * SUFFIXES[suffix]


@given(milli=st.integers(min_value=0, max_value=10**9), extra=st.integers(1, 999))
def test_cpu_rounds_up_to_the_next_millicore(milli: int, extra: int) -> None:
    exact = Quantity.parse(f"{milli}m")
    assert exact.milli == milli
    fraction = Decimal(milli) / 1000 + Decimal(extra) / 1_000_000
    assert Quantity.parse(str(fraction)).milli == milli + 1
