"""A compiled yes/no schema check for the fake API server's writes (pure).

:mod:`tests.support.fakekube_schema` checks every HTTP write against the release's
strict OpenAPI schema with ``jsonschema``, which walks the schema anew for every
instance (a fifth of the fake's CPU in ``hack/bench/controller.py``, even with its
memo of valid ``$ref`` fragments). This module compiles a kind's schema once into
nested closures that only answer *valid or not*; ``jsonschema`` still runs whenever
they say *not*, to word the refusal, so a refusal reads exactly as before.

Compiled: the Draft 2020-12 keywords these schemas use, with ``jsonschema``'s
meaning: ``type`` (one name or a list; ``integer`` takes an integral float, neither
number type takes a bool), ``properties``, ``additionalProperties`` (false or a
schema), ``items`` (one schema for every item), ``required``, ``enum`` (of strings),
``$ref`` (resolved through the same ``referencing`` registry), ``oneOf``, ``anyOf``,
``allOf``; ``format`` asserts nothing, as in ``jsonschema`` without a format checker.
Any other keyword ``jsonschema`` knows (a ``pattern``, a ``minimum``, ...) makes
:func:`compile_schema` return None: such a kind is always checked by ``jsonschema``,
never with the keyword ignored. Keywords ``jsonschema`` does not know
(``description``, ``x-kubernetes-*``) assert nothing there either.

The check reads the Python object itself instead of a JSON round trip of it, so
:func:`plain` first makes sure it holds only what JSON decodes to (dict, list, str,
int, float, bool, None, and the store's :class:`~tests.support.fakekube_raw.RawJson`,
a dict): any other value anywhere (a tuple, a subclass, a key that is not a string)
raises :class:`Unsure`, and the caller then checks the JSON round trip with
``jsonschema``, as it always did.
``tests/unit/test_fakekube_schema_compiled.py`` pins that both checks agree.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from tests.support.fakekube_raw import RawJson

Check = Callable[[Any], bool]
"""True: the instance is valid against the schema it was compiled from."""

_NONE = type(None)
_OBJECTS = (dict, RawJson)
_PLAIN = frozenset({dict, RawJson, list, str, int, float, bool, _NONE})
"""The Python types a JSON document decodes to (and the store's RawJson)."""
_TYPES: dict[str, frozenset[type]] = {
    "object": frozenset(_OBJECTS),
    "array": frozenset({list}),
    "string": frozenset({str}),
    "integer": frozenset({int}),
    "number": frozenset({int, float}),
    "boolean": frozenset({bool}),
    "null": frozenset({_NONE}),
}

_HANDLED = frozenset(
    {
        "type",
        "properties",
        "additionalProperties",
        "items",
        "required",
        "enum",
        "$ref",
        "oneOf",
        "anyOf",
        "allOf",
        "format",
    }
)


class Unsure(Exception):
    """The instance holds a value JSON does not decode to: check its JSON form instead."""


class Unsupported(Exception):
    """The schema uses a keyword this compiler does not handle."""


def plain(value: Any) -> None:
    """Raise :class:`Unsure` unless ``value`` is a tree of JSON-decoded values."""
    kind = type(value)
    if kind not in _PLAIN:
        raise Unsure(kind.__name__)
    if kind is dict or kind is RawJson:
        for key, item in value.items():
            if type(key) is not str:
                raise Unsure("key")
            plain(item)
    elif kind is list:
        for item in value:
            plain(item)


def _accept_any(value: Any) -> bool:
    return True


def _refuse_all(value: Any) -> bool:
    return False


class _Compiler:
    """Compiles one schema tree; ``assertions``: every keyword ``jsonschema`` asserts."""

    def __init__(self, resolver: Any, assertions: Iterable[str]) -> None:
        self._root = resolver
        self._assertions = frozenset(assertions)
        self._done: dict[int, Check] = {}
        self._keep: list[Any] = []
        """Every schema compiled: ids stay unique while ``_done`` holds them."""

    def compile(self, schema: Any, resolver: Any) -> Check:
        if schema is True:
            return _accept_any
        if schema is False:
            return _refuse_all
        if not isinstance(schema, dict):
            raise Unsupported(f"schema {schema!r}")
        found = self._done.get(id(schema))
        if found is not None:
            return found
        # A recursive schema (a $ref back to an enclosing one) reads the finished
        # check through this cell.
        cell: list[Check] = []
        self._done[id(schema)] = lambda value: cell[0](value)  # noqa: PLW0108 (not built yet)
        self._keep.append(schema)
        check = self._build(schema, resolver)
        cell.append(check)
        self._done[id(schema)] = check
        return check

    def _build(self, schema: dict[str, Any], resolver: Any) -> Check:
        unknown = (schema.keys() & self._assertions) - _HANDLED
        if unknown:
            raise Unsupported(", ".join(sorted(unknown)))
        parts: list[Check] = []
        if "type" in schema:
            parts.append(_type_check(schema["type"]))
        if any(k in schema for k in ("properties", "additionalProperties", "required")):
            parts.append(self._object_check(schema, resolver))
        if "items" in schema:
            parts.append(_items_check(self.compile(schema["items"], resolver)))
        if "enum" in schema:
            parts.append(_enum_check(schema["enum"]))
        if "$ref" in schema:
            parts.append(self._ref_check(schema["$ref"], resolver))
        for keyword, combine in (("oneOf", _one_of), ("anyOf", _any_of), ("allOf", _all_of)):
            if keyword in schema:
                subs = schema[keyword]
                if not isinstance(subs, list) or not subs:
                    raise Unsupported(f"{keyword} {subs!r}")
                parts.append(combine([self.compile(s, resolver) for s in subs]))
        if not parts:
            return _accept_any
        if len(parts) == 1:
            return parts[0]
        if len(parts) == 2:
            first, second = parts
            return lambda value: first(value) and second(value)
        return lambda value: all(part(value) for part in parts)

    def _object_check(self, schema: dict[str, Any], resolver: Any) -> Check:
        properties = schema.get("properties", {})
        if not isinstance(properties, dict):
            raise Unsupported("properties")
        checks = {name: self.compile(sub, resolver) for name, sub in properties.items()}
        extra = schema.get("additionalProperties", True)
        extra_check = None if extra in (True, False) else self.compile(extra, resolver)
        refuse_extra = extra is False
        required = tuple(schema.get("required", ()))

        def check(value: Any) -> bool:
            kind = type(value)
            if kind is not dict and kind is not RawJson:
                return True  # not an object: these keywords assert nothing
            for key, item in value.items():
                sub = checks.get(key)
                if sub is not None:
                    if not sub(item):
                        return False
                elif refuse_extra or (extra_check is not None and not extra_check(item)):
                    return False
            return all(name in value for name in required)

        return check

    def _ref_check(self, ref: Any, resolver: Any) -> Check:
        if not isinstance(ref, str):
            raise Unsupported(f"$ref {ref!r}")
        resolved = resolver.lookup(ref)
        return self.compile(resolved.contents, resolved.resolver)


def _names(types: Any) -> list[str]:
    names = [types] if isinstance(types, str) else types
    if not isinstance(names, list) or not all(isinstance(n, str) and n in _TYPES for n in names):
        raise Unsupported(f"type {types!r}")
    return names


def _type_check(types: Any) -> Check:
    names = _names(types)
    accepted = frozenset().union(*(_TYPES[n] for n in names))
    integral_floats = "integer" in names and "number" not in names

    def check(value: Any) -> bool:
        kind = type(value)
        if kind in accepted:
            return True
        return integral_floats and kind is float and value.is_integer()

    return check


def _items_check(item_check: Check) -> Check:
    def check(value: Any) -> bool:
        if type(value) is not list:
            return True
        return all(item_check(item) for item in value)

    return check


def _enum_check(values: Any) -> Check:
    if not isinstance(values, list) or not all(type(v) is str for v in values):
        raise Unsupported(f"enum {values!r}")  # only strings compare as simply as this
    allowed = frozenset(values)

    return lambda value: type(value) is str and value in allowed


def _one_of(subs: list[Check]) -> Check:
    return lambda value: sum(1 for sub in subs if sub(value)) == 1


def _any_of(subs: list[Check]) -> Check:
    return lambda value: any(sub(value) for sub in subs)


def _all_of(subs: list[Check]) -> Check:
    return lambda value: all(sub(value) for sub in subs)


def compile_schema(schema: Any, resolver: Any, assertions: Iterable[str]) -> Check | None:
    """The check of ``schema`` (its ``$ref``s looked up with the ``referencing``
    ``resolver``), or None when it uses a keyword of ``assertions`` (those ``jsonschema``
    asserts) that this module does not compile."""
    try:
        compiler = _Compiler(resolver, assertions)
        return compiler.compile(schema, resolver)
    except Unsupported:
        return None
