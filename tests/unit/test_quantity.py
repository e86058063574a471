"""Quantity parsing for whole amounts (node settings) and canonical byte formatting."""

from __future__ import annotations

import pytest

from dra_driver.base import quantity
from dra_driver.base.quantity import format_bytes, parse_whole


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("0", 0),
        ("100", 100),
        ("1Ki", 1024),
        ("10Gi", 10 * 2**30),
        ("81408Mi", 81408 * 2**20),
        ("1.5Gi", 3 * 2**29),
        ("2k", 2000),
        ("1M", 10**6),
        ("0.5k", 500),
        ("1e3", 1000),
    ],
)
def test_parse_whole(text: str, value: int) -> None:
    assert parse_whole(text) == value


@pytest.mark.parametrize("text", ["", "Gi", "10GB", "1.5", "0.0003k", "500m", "ten", "10 Gi"])
def test_parse_whole_rejects(text: str) -> None:
    with pytest.raises(ValueError):
        parse_whole(text)


def test_parse_whole_parses_a_text_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """A prepare reads each share's consumedCapacity again: a text seen before is not
    parsed again (the plugin's plan, per MPS claim)."""
    parsed: list[object] = []
    real = quantity.parse_quantity

    def counted(value: object) -> object:
        parsed.append(value)
        return real(value)

    monkeypatch.setattr(quantity, "parse_quantity", counted)
    text = "12345Mi"  # no other test parses it: not in the cache yet
    assert [parse_whole(text) for _ in range(3)] == [12345 * 2**20] * 3
    assert parsed == [text]
    assert parse_whole(7) == 7
    for wrong in (True, 1.5, "0.5"):
        with pytest.raises(ValueError):
            parse_whole(wrong)


@pytest.mark.parametrize(
    ("value", "text"),
    [(0, "0"), (1023, "1023"), (1024, "1Ki"), (81408 * 2**20, "81408Mi"), (2**30, "1Gi")],
)
def test_format_bytes(value: int, text: str) -> None:
    assert format_bytes(value) == text
    assert parse_whole(text) == value
