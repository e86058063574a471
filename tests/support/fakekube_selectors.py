"""Label and field selectors as the fake API server evaluates them (pure)."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

from tests.support.fakekube_types import bad_request

Predicate = Callable[[Mapping[str, Any]], bool]

_LABEL_KEY = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_SET_REQUIREMENT = re.compile(r"^(\S+)\s+(in|notin)\s*\(([^()]*)\)$")


def _split_top_level(text: str) -> list[str]:
    """Split on commas that are not inside ``( )``: ``a in (x,y),b`` → 2 parts."""
    parts, depth, start = [], 0, 0
    for i, char in enumerate(text):
        depth += {"(": 1, ")": -1}.get(char, 0)
        if char == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [p.strip() for p in parts if p.strip()]


def _label_requirement(text: str) -> Predicate:
    def check(key: str, *values: str) -> None:
        if not _LABEL_KEY.match(key) or not all(_LABEL_VALUE.match(v) for v in values):
            raise bad_request(f"unable to parse requirement: invalid label selector {text!r}")

    if match := _SET_REQUIREMENT.match(text):
        key, op = match[1], match[2]
        values = frozenset(v.strip() for v in match[3].split(",") if v.strip())
        check(key, *values)
        if op == "in":
            return lambda labels: key in labels and labels[key] in values
        return lambda labels: labels.get(key) not in values
    for op in ("!=", "==", "="):
        if op in text:
            key, value = (s.strip() for s in text.split(op, 1))
            check(key, value)
            if op == "!=":
                return lambda labels: labels.get(key) != value
            return lambda labels: labels.get(key) == value
    if text.startswith("!"):
        key = text[1:].strip()
        check(key)
        return lambda labels: key not in labels
    check(text)
    return lambda labels: text in labels


def parse_label_selector(text: str) -> Predicate:
    """Predicate over a labels mapping; 400 BadRequest on a malformed selector."""
    requirements = [_label_requirement(r) for r in _split_top_level(text)]
    return lambda labels: all(r(labels) for r in requirements)


def field_value(obj: Mapping[str, Any], path: str) -> str:
    """The string form of a dotted path, ``""`` when absent, as field selectors compare."""
    value: Any = obj
    for part in path.split("."):
        value = value.get(part) if isinstance(value, Mapping) else None
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def parse_field_selector(text: str) -> Predicate:
    """Predicate over a whole object; 400 BadRequest on a malformed selector."""
    checks = [_field_requirement(r) for r in _split_top_level(text)]
    return lambda obj: all(c(obj) for c in checks)


def _field_requirement(text: str) -> Predicate:
    for op in ("!=", "==", "="):
        if op in text:
            path, value = (s.strip() for s in text.split(op, 1))
            break
    else:
        raise bad_request(f"invalid field selector {text!r}: expected key=value")
    if not path:
        raise bad_request(f"invalid field selector {text!r}: empty field")
    if op == "!=":
        return lambda obj: field_value(obj, path) != value
    return lambda obj: field_value(obj, path) == value
