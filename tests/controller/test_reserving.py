"""The reservations' stored form: what is written reads back the same, and hand-edited
content that is wrong is reported with the entry and field at fault."""

from __future__ import annotations

import json

import pytest

from edl_scheduler.controller.reserving import ReservationFormatError, decode, encode
from edl_scheduler.core import Reservation, Role

HOLDS = (
    Reservation("ml/high", "node-b", Role.WORKER, 2, 1_800_000_600.25),
    Reservation("ml/high", "node-a", Role.PSERVER, 1, 1_800_000_600.0),
    Reservation("ml/other", "node-a", Role.WORKER, 1, 1_800_000_900.0),
)


def test_round_trip_and_a_stable_text() -> None:
    text = encode(HOLDS)
    assert set(decode(text)) == set(HOLDS)
    assert encode(reversed(HOLDS)) == text  # the order does not make a new write
    assert decode(encode(())) == ()


@pytest.mark.parametrize(
    ("content", "field"),
    [
        ("{", "not JSON"),
        ('{"job": "a/b"}', "expected a list"),
        ("[1]", "[0]: expected an object"),
        ('[{"job": "a/b", "node": "n", "role": "chief", "count": 1, "expiresAt": 1}]', "[0].role"),
        ('[{"job": "b", "node": "n", "role": "worker", "count": 1, "expiresAt": 1}]', "[0].job"),
        ('[{"job": "a/b", "node": "", "role": "worker", "count": 1, "expiresAt": 1}]', "[0].node"),
        ('[{"job": "a/b", "node": "n", "role": "worker", "count": 0, "expiresAt": 1}]', "count"),
        (
            '[{"job": "a/b", "node": "n", "role": "worker", "count": 1, "expiresAt": "x"}]',
            "expiresAt",
        ),
    ],
)
def test_bad_content_names_the_field(content: str, field: str) -> None:
    with pytest.raises(ReservationFormatError, match=field.replace("[", r"\[").replace("]", r"\]")):
        decode(content)


def test_the_text_is_the_documented_shape() -> None:
    (item,) = json.loads(encode(HOLDS[:1]))
    assert item == {
        "job": "ml/high",
        "node": "node-b",
        "role": "worker",
        "count": 2,
        "expiresAt": 1_800_000_600.25,
    }
