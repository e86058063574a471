"""The building blocks of the ResourceSlice checks (pure): a problem list and the value grammars.

Every check adds its findings to a :class:`Problems` as ``"<location>: <what is
wrong>"``. The shape helpers read quantities, mappings and lists into it. The
name grammars (DNS label or subdomain, driver name, C identifier, attribute or
capacity name, label key or value) live in :mod:`dra_driver.base.names`, since
the opaque config API checks names too.
"""

from __future__ import annotations

from collections.abc import Mapping
from fractions import Fraction
from typing import Any

from dra_driver.base.quantity import parse_quantity


class Problems:
    """The findings of one run of the checks, in the order they were found."""

    def __init__(self) -> None:
        self.items: list[str] = []

    def add(self, path: str, message: str) -> None:
        self.items.append(f"{path}: {message}")

    def extend(self, problems: Any) -> None:
        self.items.extend(problems)


def unknown_fields(
    obj: Mapping[str, Any], allowed: frozenset[str], path: str, found: Problems
) -> None:
    for key in sorted(set(obj) - allowed, key=str):
        found.add(f"{path}.{key}", "unknown field")


def quantity(value: object, path: str, found: Problems) -> Fraction | None:
    try:
        return parse_quantity(value)
    except ValueError as err:
        found.add(path, str(err))
        return None


def is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def as_mapping(value: object, path: str, found: Problems) -> Mapping[str, Any] | None:
    if value is None:
        return None
    if not isinstance(value, Mapping):
        found.add(path, "must be an object")
        return None
    return value


def as_list(value: object, path: str, found: Problems) -> list[Any] | None:
    if value is None:
        return None
    if not isinstance(value, list | tuple):
        found.add(path, "must be a list")
        return None
    return list(value)
