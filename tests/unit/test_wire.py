"""Every body we send is written as the API server re-encodes a RawExtension (Go's
``json.Marshal`` of the generic value), so our opaque parameters stay byte-identical
through any later write. Expected texts are what Go writes for the same values."""

from __future__ import annotations

from types import MappingProxyType
from typing import Any

import pytest

from dra_driver.k8s.wire import _encode, canonical_json, encode_body, go_number

GRANT = {
    "kind": "GpuShareGrant",
    "apiVersion": "gpu.fractional.dev/v1alpha1",
    "shareID": "0e0ce9dc-dd4a-42a8-b0eb-ffabbf670857",
    "memory": "10Gi",
    "computePercent": 25,
}


@pytest.mark.parametrize(
    ("value", "go"),
    [
        (
            GRANT,
            '{"apiVersion":"gpu.fractional.dev/v1alpha1","computePercent":25,'
            '"kind":"GpuShareGrant","memory":"10Gi","shareID":"0e0ce9dc-dd4a-42a8-b0eb-ffabbf670857"}',
        ),
        ({"b": {"z": 1, "a": [True, None]}, "a": ""}, '{"a":"","b":{"a":[true,null],"z":1}}'),
        (
            {"html": "<a href='x'>&</a>"},
            '{"html":"\\u003ca href=\'x\'\\u003e\\u0026\\u003c/a\\u003e"}',
        ),
        ({"text": "é ü 日本\u2028\u2029"}, '{"text":"é ü 日本\\u2028\\u2029"}'),
        ({"ctl": "a\nb\tc\x01\b\f\x7f"}, '{"ctl":"a\\nb\\tc\\u0001\\b\\f\x7f"}'),
        (
            {"n": [2.0, 1.5, 0.1, 1e-7, 1.5e-7, 1e21, 1e16, 1e-6]},
            '{"n":[2,1.5,0.1,1e-7,1.5e-7,1e+21,10000000000000000,0.000001]}',
        ),
        (
            {"big": 2**64, "max": 2**63 - 1},
            '{"big":18446744073709552000,"max":9223372036854775807}',
        ),
        ({"version": "580.65.6", "q": "1.5e3"}, '{"q":"1.5e3","version":"580.65.6"}'),
    ],
    ids=["grant", "nested", "html", "utf8", "control", "floats", "int64", "numbers-in-strings"],
)
def test_written_as_go_writes_it(value: Any, go: str) -> None:
    assert canonical_json(value) == go
    assert encode_body(value) == go.encode()


@pytest.mark.parametrize(
    "value",
    [GRANT, {"a": [1, 2.5, {"z": "<"}], "b": None}, {"x": [2**70, -0.0, "é"]}],
)
def test_the_fast_path_and_the_go_writer_agree(value: Any) -> None:
    slow = "".join(_encode(value)).replace("<", "\\u003c")
    assert canonical_json(value) == slow


def test_mappings_other_than_dicts_are_objects() -> None:
    assert canonical_json({"spec": MappingProxyType({"b": 1, "a": 2})}) == '{"spec":{"a":2,"b":1}}'


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), object()])
def test_what_json_cannot_hold_is_refused(bad: Any) -> None:
    with pytest.raises((TypeError, ValueError)):
        canonical_json({"v": bad})


def test_go_number_negative_zero() -> None:
    assert go_number(-0.0) == "-0" and go_number(0) == "0"


@pytest.mark.parametrize(
    ("value", "go"),
    [
        (2.0, "2"),
        (-1e-7, "-1e-7"),
        ([3.0], "[3]"),
        ({"a": "x:1.5", "b": 2.0}, '{"a":"x:1.5","b":2}'),
        ({"a": "x:1.5", "b": 2}, '{"a":"x:1.5","b":2}'),
        ({"a": [1, -2.5e3]}, '{"a":[1,-2500]}'),
    ],
    ids=["top-level", "top-level-negative", "first-in-list", "after-a-string", "no-float", "neg"],
)
def test_every_place_a_number_can_stand_is_looked_at(value: Any, go: str) -> None:
    # The quick search for where a float could be must miss none of them.
    assert canonical_json(value) == go
