"""The one way this project serialises a JSON body for the API server.

Opaque ``parameters`` (``spec.devices.config``, ``status.allocation.devices.config``)
and ``status.devices[].data`` are ``RawExtension`` fields: the API server keeps
their *bytes* and compares old and new byte for byte when it checks that a
claim's spec or allocation did not change (fact sheet 5.3). It re-encodes them
when a write goes through its generic JSON form (server-side apply, strategic
merge patch): Go's ``encoding/json`` marshals a ``map[string]interface{}``, so
keys come out sorted, with no whitespace, ``<``, ``>``, ``&``, U+2028 and
U+2029 escaped, other non-ASCII text as UTF-8, and numbers decoded as int64 or
float64. Bytes that differ from that form look like a change to the next apply
and the write is refused (``field is immutable``).

So every body is written in exactly that canonical form: whatever we write
into a ``RawExtension`` (our ``GpuShareGrant``, a user's config copied into an
allocation) is already what the API server would make of it, and stays
byte-identical through any later write of the object, ours or anyone's.
Key order is not meaningful anywhere else in the Kubernetes API, so the whole
body is sorted.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from decimal import Decimal
from typing import Any

_GO_HTML_ESCAPES = {
    "<": "\\u003c",
    ">": "\\u003e",
    "&": "\\u0026",
    "\u2028": "\\u2028",
    "\u2029": "\\u2029",
}

_MAX_INT64 = 2**63 - 1
_MIN_INT64 = -(2**63)


_RISKY_NUMBERS = re.compile(r'"(?:[^"\\]|\\.)*"|(-?\d+[.eE][\d.eE+-]*|-?\d{19,})')
"""JSON strings (skipped: group 1 is empty), or a number token Go may write otherwise:
a float, or an integer of 19 digits or more (int64 holds up to 19)."""
_MAYBE_RISKY = re.compile(r"[:\[,]-?(?:\d+[.eE]|\d{19})")
"""Where such a token could start: compact JSON has a number only at the start or after
``:``, ``[`` or ``,``. Text inside strings may match too (then the exact scan decides);
a body without a match has no such number, and is not scanned string by string."""
_NUMBER_STARTS = frozenset("-0123456789")
"""A text that is a number itself (not a body, but :func:`canonical_json` takes any value)."""


def encode_body(body: Mapping[str, Any] | list[Any]) -> bytes:
    """``body`` as canonical JSON bytes (see the module docstring)."""
    return canonical_json(body).encode()


def canonical_json(value: Any) -> str:
    """One JSON value as the API server re-encodes a ``RawExtension`` holding it.

    The C encoder does the work; only a body holding a float or an integer beyond
    int64 (rare: copied user parameters) takes the slower path that writes numbers
    as Go does. ``<``, ``>``, ``&``, U+2028 and U+2029 occur only inside strings, so
    escaping them in the whole text is escaping them in the strings.
    """
    text = json.dumps(
        value,
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
        allow_nan=False,
        default=_as_plain,
    )
    # The quick search first (most bodies hold no float); findall runs in C: one pass
    # over the text, no Python call per string, but a list entry per string.
    if (_MAYBE_RISKY.search(text) or text[:1] in _NUMBER_STARTS) and any(
        _go_writes_otherwise(n) for n in _RISKY_NUMBERS.findall(text) if n
    ):
        text = "".join(_encode(value))
    for char, escaped in _GO_HTML_ESCAPES.items():  # str.replace: a C scan each, no copy
        text = text.replace(char, escaped)  # when the character is not there
    return text


def _as_plain(value: Any) -> Any:
    if isinstance(value, Mapping):
        return dict(value)
    raise TypeError(f"cannot encode {type(value).__name__} as JSON: {value!r}")


def _go_writes_otherwise(token: str) -> bool:
    """A number token that Go may write differently (a float, or beyond int64)."""
    if token.startswith('"'):
        return False
    return not token.lstrip("-").isdigit() or not _MIN_INT64 <= int(token) <= _MAX_INT64


def _encode(value: Any) -> list[str]:
    out: list[str] = []
    _emit(value, out)
    return out


def _emit(value: Any, out: list[str]) -> None:
    if isinstance(value, Mapping):
        out.append("{")
        for i, key in enumerate(sorted(value)):
            if not isinstance(key, str):
                raise TypeError(f"JSON object keys must be strings, not {key!r}")
            if i:
                out.append(",")
            out.append(go_string(key))
            out.append(":")
            _emit(value[key], out)
        out.append("}")
    elif isinstance(value, list | tuple):
        out.append("[")
        for i, item in enumerate(value):
            if i:
                out.append(",")
            _emit(item, out)
        out.append("]")
    elif isinstance(value, str):
        out.append(go_string(value))
    elif value is None or isinstance(value, bool):
        out.append(json.dumps(value))
    elif isinstance(value, int | float):
        out.append(go_number(value))
    else:
        raise TypeError(f"cannot encode {type(value).__name__} as JSON: {value!r}")


def go_string(text: str) -> str:
    """``text`` as Go's ``json.Marshal`` writes a string (UTF-8 kept; the HTML-safe
    escapes are applied by :func:`canonical_json` to the whole text)."""
    return json.dumps(text, ensure_ascii=False)


def go_number(number: int | float) -> str:
    """A JSON number as the API server writes it after decoding it generically.

    Integers that fit int64 stay integers; anything else is a float64, which Go
    writes in its shortest form: fixed notation for 1e-6 <= |x| < 1e21 (``2.0``
    becomes ``2``), otherwise an exponent without a leading zero (``1e-7``).
    """
    if isinstance(number, int) and _MIN_INT64 <= number <= _MAX_INT64:
        return str(number)
    f = float(number)
    if not math.isfinite(f):
        raise ValueError(f"JSON cannot hold {number!r}")
    if f == 0:
        return "-0" if math.copysign(1.0, f) < 0 else "0"
    shortest = repr(f)
    if 1e-6 <= abs(f) < 1e21:
        text = format(Decimal(shortest), "f")
        if "." in text:
            text = text.rstrip("0").rstrip(".")
        return text
    # Outside that range repr() already uses an exponent, with the same shortest
    # digits as Go; Go writes it without a leading zero ("1e-07" -> "1e-7").
    mantissa, _, exponent = shortest.partition("e")
    sign = "-" if exponent.startswith("-") else "+"
    return f"{mantissa}e{sign}{exponent.lstrip('+-').lstrip('0')}"
