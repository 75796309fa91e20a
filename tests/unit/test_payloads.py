from __future__ import annotations

import datetime
import decimal
import uuid

import pytest

from django_jobs.exceptions import InvalidJobInput
from django_jobs.payloads import normalize


def test_django_types_become_json_once() -> None:
    value = {
        "when": datetime.datetime(2026, 1, 2, 3, 4, 5, tzinfo=datetime.UTC),
        "amount": decimal.Decimal("12.50"),
        "id": uuid.UUID(int=1),
        "pair": (1, 2),
        1: "int key",
    }
    assert normalize(value, what="input") == {
        "when": "2026-01-02T03:04:05Z",
        "amount": "12.50",
        "id": "00000000-0000-0000-0000-000000000001",
        "pair": [1, 2],
        "1": "int key",
    }


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ({"x": object()}, "not JSON-serializable"),
        ({"x": float("nan")}, "not JSON-serializable"),
        ({"x": "a\x00b"}, "NUL"),
        ({1, 2}, "not JSON-serializable"),
    ],
)
def test_values_that_cannot_be_stored_are_refused(value: object, message: str) -> None:
    with pytest.raises(InvalidJobInput, match=message):
        normalize(value, what="input")


def test_deep_nesting_is_refused_clearly() -> None:
    value: list[object] = []
    for _ in range(100_000):
        value = [value]
    with pytest.raises(InvalidJobInput, match="nested too deeply"):
        normalize(value, what="input")


def test_size_limit(settings: pytest.FixtureRequest) -> None:
    settings.DJANGO_JOBS = {"MAX_INPUT_BYTES": 20}  # type: ignore[attr-defined]
    assert normalize({"a": "x" * 5}, what="input") == {"a": "xxxxx"}
    with pytest.raises(InvalidJobInput, match="MAX_INPUT_BYTES"):
        normalize({"a": "x" * 50}, what="the input")
