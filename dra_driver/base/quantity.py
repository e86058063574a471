"""Kubernetes resource quantities (``10Gi``, ``500m``, ``1e3``) <-> exact numbers.

Parsing is strict and exact (``Fraction``); formatting writes the API
server's canonical form, so what we read back from the API equals what we
wrote and a republish sees no spurious change.

:func:`parse_amount` is the allocator's reader: the same exact value, but an ``int``
when it is a whole number (bytes, counts, percentages: nearly every quantity a
device or claim carries) and a ``Fraction`` only when it is not (``1.5``, ``500m``).
Ints and Fractions compare, add and hash exactly with each other, so mixing them
changes no result; an int is a third of a Fraction's memory and several times
faster to add and compare.
"""

from __future__ import annotations

import functools
import re
from fractions import Fraction
from typing import TypeAlias

_BINARY_SUFFIXES = ("", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei")
_DECIMAL_SUFFIXES = ("", "k", "M", "G", "T", "P", "E")
_QUANTITY = re.compile(
    r"(?P<sign>[+-]?)(?P<number>[0-9]+(?:\.[0-9]*)?|\.[0-9]+)"
    r"(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|[eE][+-]?[0-9]+|[mkMGTPE])?"
)
_SUFFIX_FACTORS: dict[str, Fraction] = {
    "": Fraction(1),
    "m": Fraction(1, 1000),
    "k": Fraction(10**3),
    "M": Fraction(10**6),
    "G": Fraction(10**9),
    "T": Fraction(10**12),
    "P": Fraction(10**15),
    "E": Fraction(10**18),
    "Ki": Fraction(2**10),
    "Mi": Fraction(2**20),
    "Gi": Fraction(2**30),
    "Ti": Fraction(2**40),
    "Pi": Fraction(2**50),
    "Ei": Fraction(2**60),
}
_MAX_EXPONENT = 308  # keeps a hostile "1e999999999" from building a huge integer


def parse_quantity(value: object) -> Fraction:
    """A Kubernetes Quantity (``"81408Mi"``, ``"100"``, ``"500m"``, ``"1e3"``) as an exact number.

    Strict: a sign, digits with an optional fraction, then one optional suffix
    (binary ``Ki``…``Ei``, decimal ``m``, ``k``…``E``, or an exponent ``e<n>``);
    no spaces. A JSON integer is accepted as the API server accepts it.
    Raises :class:`ValueError` otherwise.
    """
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a quantity")
    if isinstance(value, int):
        return Fraction(value)
    if not isinstance(value, str):
        raise ValueError(f"{value!r} is not a quantity: expected a string")
    match = _QUANTITY.fullmatch(value)
    if match is None:
        raise ValueError(
            f"{value!r} is not a quantity: expected a number with an optional suffix"
            " (Ki, Mi, Gi, Ti, Pi, Ei, m, k, M, G, T, P, E or e<exponent>)"
        )
    number = Fraction(match["number"])
    suffix = match["suffix"] or ""
    if suffix not in _SUFFIX_FACTORS:  # an exponent: e3, E-2
        exponent = int(suffix[1:])
        if abs(exponent) > _MAX_EXPONENT:
            raise ValueError(f"{value!r} is not a quantity: exponent out of range")
        factor = Fraction(10) ** exponent
    else:
        factor = _SUFFIX_FACTORS[suffix]
    amount = number * factor
    return -amount if match["sign"] == "-" else amount


Amount: TypeAlias = int | Fraction
"""An exact quantity: an ``int`` when whole, a ``Fraction`` otherwise (never a float)."""


def exact(value: Fraction) -> Amount:
    """``value`` as an ``int`` when it is a whole number, else unchanged."""
    return value.numerator if value.denominator == 1 else value


def parse_amount(value: object) -> Amount:
    """:func:`parse_quantity`, an ``int`` when the quantity is a whole number.

    Strings are parsed once per distinct text (a cluster's devices repeat a handful
    of quantities), so equal quantities are also one shared object."""
    if isinstance(value, str):
        return _parse_text(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    return exact(parse_quantity(value))


@functools.lru_cache(maxsize=4096)
def _parse_text(text: str) -> Amount:
    return exact(parse_quantity(text))


def parse_whole(value: object) -> int:
    """A quantity that must be a whole number (bytes, counts): ``"1Gi"`` → 1073741824.

    Through :func:`parse_amount`'s cache: a prepare reads each MPS share's
    ``consumedCapacity`` again, a handful of texts on a node."""
    amount = parse_amount(value)
    if not isinstance(amount, int):
        raise ValueError(f"{value!r} is not a whole number")
    return amount


def format_count(value: int) -> str:
    """A count as the API server's canonical DecimalSI Quantity: ``100``, ``48``, ``1k``."""
    exponent = 0
    while value and value % 1000 == 0 and exponent < len(_DECIMAL_SUFFIXES) - 1:
        value //= 1000
        exponent += 1
    return f"{value}{_DECIMAL_SUFFIXES[exponent]}"


def format_bytes(value: int) -> str:
    """Bytes as the API server's canonical Quantity: ``81408Mi``, ``80Gi``; plain digits
    (DecimalSI) when the amount is not a whole number of KiB.

    Writing the canonical form means what we read back equals what we wrote.
    """
    if abs(value) < 1024 or value % 1024:
        return format_count(value)
    exponent = 0
    while value % 1024 == 0 and exponent < len(_BINARY_SUFFIXES) - 1:
        value //= 1024
        exponent += 1
    return f"{value}{_BINARY_SUFFIXES[exponent]}"
