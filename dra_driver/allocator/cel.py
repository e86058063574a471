"""Device selectors: the Kubernetes CEL view of a device, compiled once, cached per device.

Library: ``common-expression-language`` (the ``cel`` module, a Rust interpreter).
Measured here on one core: a compiled selector with a Quantity comparison takes
≈ 0.009 ms per evaluation (≈ 0.001 ms for a plain attribute test), building a
device's context ≈ 0.02 ms (done once per device and slice generation);
``cel-python`` took ≈ 0.15 ms for the plain attribute test (≈ 0.9 ms measured
earlier on the cluster's selectors). Compiled programs are cached by expression;
results by (expression, driver, pool, generation, device).

The view (dra-facts 8): one variable ``device`` with ``driver``,
``attributes[domain].<id>``, ``capacity[domain].<id>`` and
``allowMultipleAllocations``. Qualified names are split at ``/``; an unqualified
name lives in the driver's domain. The library has no custom types, so:

* a **Quantity** is a tagged map ``{"@q": [numerator, denominator]}`` (exact);
* a **semver** value is a tagged map ``{"@v": "1.2.3"}``;

and the Kubernetes member functions are Python functions that dispatch on the tag.

Supported Kubernetes CEL functions (besides the CEL operators, ``has()``,
``size``, ``in``, ``contains``, ``startsWith``, ``endsWith``, ``matches``,
``int``, ``uint``, ``double``, ``string``, ``type``, ``dyn``, ``duration``,
``timestamp`` and the macros ``all``/``exists``/``exists_one``/``map``/``filter``):

* Quantity: ``quantity(s)``, ``isQuantity(s)``, ``q.compareTo(q)``,
  ``q.isGreaterThan(q)``, ``q.isLessThan(q)``, ``q.add(q|int)``, ``q.sub(q|int)``,
  ``q.asInteger()``, ``q.asApproximateFloat()``, ``q.isInteger()``, ``q.sign()``;
* semver: ``semver(s)``, ``isSemver(s)``, ``v.compareTo(v)``, ``v.isGreaterThan(v)``,
  ``v.isLessThan(v)``, ``v.major()``, ``v.minor()``, ``v.patch()``;
* strings (Kubernetes' ext strings): ``lowerAscii``, ``upperAscii``, ``trim``,
  ``replace`` (2 arguments), ``split`` (1 argument), ``join``, ``indexOf``,
  ``lastIndexOf``, ``substring``, ``charAt``;
* lists: ``x.includes(v)`` (scalar or list attributes).

Not supported (the claim fails with a reason naming the function or construct):
``cel.bind``, optional syntax ``.?`` / ``orValue``, ``url``/``ip``/``cidr``
libraries, ``format``, ``quote``, ``reverse``, ``sets.*``, ``math.*``, regex
``find``; any other function not in the lists above. Differences that remain:
comparing a Quantity or semver with ``==`` compares the exact value (as
Kubernetes does for equal values), but a Quantity compared with a plain number
or a version with a string is ``false`` here where Kubernetes rejects the
expression; a missing attribute is an evaluation error in both (guard with
``has()``); an unknown domain is an empty map in both for the domains written as
string literals in the expression (others are an error here).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import cel as _cel

from dra_driver.allocator.model import Device, SemVer
from dra_driver.base.quantity import Amount, parse_quantity
from dra_driver.base.semver import is_semver

SENTINEL_MARKER = '"share.gpu.fractional.dev/controller-managed" == "sentinel"'


def sentinel_expression(driver_name: str) -> str:
    """The controller-managed class's selector, exactly as the Helm chart writes it."""
    return f'device.driver == "{driver_name}" && {SENTINEL_MARKER}'


def is_sentinel(expression: str, driver_name: str) -> bool:
    return expression.strip() == sentinel_expression(driver_name)


class CelError(Exception):
    """A selector that cannot be compiled or evaluated; ``str()`` is the reason."""


# --- values -----------------------------------------------------------------------------

_Q = "@q"
_V = "@v"


def quantity_value(amount: Amount) -> dict[str, list[int]]:
    return {_Q: [amount.numerator, amount.denominator]}


def semver_value(text: str) -> dict[str, str]:
    return {_V: text}


def _as_quantity(value: object, what: str) -> Fraction:
    if isinstance(value, Mapping) and _Q in value:
        num, den = value[_Q]
        return Fraction(int(num), int(den))
    if isinstance(value, int) and not isinstance(value, bool):
        return Fraction(value)
    raise TypeError(f"{what}: expected a Quantity, got {value!r}")


def _semver_key(text: str) -> tuple[Any, ...]:
    core, _, rest = text.partition("+")[0].partition("-")
    numbers = tuple(int(part) for part in core.split("."))
    if not rest:
        return (*numbers, 1, ())
    ids = tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in rest.split("."))
    return (*numbers, 0, ids)


def _as_semver(value: object, what: str) -> str:
    if isinstance(value, Mapping) and _V in value:
        return str(value[_V])
    raise TypeError(f"{what}: expected a semver, got {value!r}")


def _is_q(value: object) -> bool:
    return isinstance(value, Mapping) and _Q in value


def _cmp(a: object, b: object) -> int:
    if _is_q(a):
        x, y = _as_quantity(a, "compareTo"), _as_quantity(b, "compareTo")
        return (x > y) - (x < y)
    ka, kb = _semver_key(_as_semver(a, "compareTo")), _semver_key(_as_semver(b, "compareTo"))
    return (ka > kb) - (ka < kb)


def _quantity(text: object) -> dict[str, list[int]]:
    try:
        return quantity_value(parse_quantity(text))
    except ValueError as err:
        raise ValueError(f"quantity: {err}") from None


def _is_quantity(text: object) -> bool:
    try:
        parse_quantity(text)
    except ValueError:
        return False
    return True


def _semver(text: object) -> dict[str, str]:
    if not isinstance(text, str) or not is_semver(text):
        raise ValueError(f"semver: {text!r} is not a semantic version")
    return semver_value(text)


def _includes(container: object, value: object) -> bool:
    if isinstance(container, list):
        return value in container
    return container == value


def _part(index: int) -> Callable[[object], int]:
    def part(value: object) -> int:
        core = _as_semver(value, "semver").partition("+")[0].partition("-")[0]
        return int(core.split(".")[index])

    return part


def _as_integer(value: object) -> int:
    amount = _as_quantity(value, "asInteger")
    if amount.denominator != 1:
        raise ValueError("asInteger: the quantity is not an integer")
    return int(amount)


FUNCTIONS: dict[str, Callable[..., Any]] = {
    "quantity": _quantity,
    "isQuantity": _is_quantity,
    "semver": _semver,
    "isSemver": lambda text: isinstance(text, str) and is_semver(text),
    "compareTo": _cmp,
    "isGreaterThan": lambda a, b: _cmp(a, b) > 0,
    "isLessThan": lambda a, b: _cmp(a, b) < 0,
    "add": lambda a, b: quantity_value(_as_quantity(a, "add") + _as_quantity(b, "add")),
    "sub": lambda a, b: quantity_value(_as_quantity(a, "sub") - _as_quantity(b, "sub")),
    "asInteger": _as_integer,
    "asApproximateFloat": lambda a: float(_as_quantity(a, "asApproximateFloat")),
    "isInteger": lambda a: _as_quantity(a, "isInteger").denominator == 1,
    "sign": lambda a: (_as_quantity(a, "sign") > 0) - (_as_quantity(a, "sign") < 0),
    "major": _part(0),
    "minor": _part(1),
    "patch": _part(2),
    "includes": _includes,
    "lowerAscii": lambda s: "".join(c.lower() if c.isascii() else c for c in s),
    "upperAscii": lambda s: "".join(c.upper() if c.isascii() else c for c in s),
    "trim": lambda s: s.strip(),
    "replace": lambda s, old, new: s.replace(old, new),
    "split": lambda s, sep: s.split(sep),
    "join": lambda items, sep="": sep.join(items),
    "indexOf": lambda s, sub: s.find(sub),
    "lastIndexOf": lambda s, sub: s.rfind(sub),
    "substring": lambda s, start, end=None: s[start:end],
    "charAt": lambda s, i: s[i : i + 1],
}

BUILTINS = frozenset(
    {
        "size", "contains", "startsWith", "endsWith", "matches", "int", "uint", "double",
        "string", "type", "dyn", "duration", "timestamp",
    }
)  # fmt: skip
"""Functions the library itself provides that Kubernetes' environment also has."""

SUPPORTED_FUNCTIONS = frozenset(BUILTINS | FUNCTIONS.keys())


def _is_operator(name: str) -> bool:
    return name.startswith(("_", "!_", "@", "-_"))


_DOMAIN_LITERAL = re.compile(
    r"""device\.(?:attributes|capacity)\[\s*(?:"([^"]*)"|'([^']*)')\s*\]"""
)


@dataclass(frozen=True)
class Selector:
    expression: str
    program: Any
    domains: frozenset[str]
    """Domains written as string literals: present (maybe empty) in every device view."""


def compile_selector(expression: str) -> Selector:
    """Compile ``expression``; raises :class:`CelError` on syntax or unsupported functions."""
    if "cel.bind" in expression:
        raise CelError(f"CEL selector {expression!r}: cel.bind is not supported")
    try:
        program = _cel.compile(expression)
    except Exception as err:  # the library raises ValueError; be safe with others
        raise CelError(f"CEL selector {expression!r} does not compile: {err}") from None
    unsupported = sorted(
        name
        for name in program.functions()
        if not _is_operator(name) and name not in SUPPORTED_FUNCTIONS
    )
    if unsupported:
        raise CelError(
            f"CEL selector {expression!r} uses unsupported function(s) {', '.join(unsupported)};"
            f" supported: {', '.join(sorted(SUPPORTED_FUNCTIONS))}"
        )
    domains = frozenset(a or b for a, b in _DOMAIN_LITERAL.findall(expression))
    return Selector(expression, program, domains)


def split_qualified(name: str, driver: str) -> tuple[str, str]:
    """``"dom/id"`` → ``("dom", "id")``; ``"id"`` → ``(driver, "id")``."""
    domain, slash, ident = name.rpartition("/")
    return (domain, ident) if slash else (driver, name)


def device_view(device: Device) -> dict[str, Any]:
    """The ``device`` variable for ``device`` (dra-facts 8)."""
    attributes: dict[str, dict[str, Any]] = {}
    for name, value in device.attributes.items():
        domain, ident = split_qualified(name, device.driver)
        if isinstance(value, SemVer):
            converted: Any = semver_value(value.text)
        elif isinstance(value, tuple):
            converted = [semver_value(v.text) if isinstance(v, SemVer) else v for v in value]
        else:
            converted = value
        attributes.setdefault(domain, {})[ident] = converted
    capacity: dict[str, dict[str, Any]] = {}
    for name, cap in device.capacity.items():
        domain, ident = split_qualified(name, device.driver)
        capacity.setdefault(domain, {})[ident] = quantity_value(cap.value)
    return {
        "driver": device.driver,
        "attributes": attributes,
        "capacity": capacity,
        "allowMultipleAllocations": device.allow_multiple_allocations,
    }


class SelectorCache:
    """Compiled selectors by expression; results by device identity and pool generation.

    The ``device`` variable a selector reads is built per device and kept only while
    that device is evaluated (its selectors one after another, as a request shape is
    matched): once every selector's result is cached it is never read again, and a
    view of every device of a large cluster was megabytes held for the process's
    life (about 1.5 KB a GPU)."""

    def __init__(self) -> None:
        self._compiled: dict[str, Selector | CelError] = {}
        self._view: tuple[tuple[str, str, int, str], dict[str, Any]] | None = None
        self._results: dict[tuple[str, str, str, int, str], bool | CelError] = {}
        self.evaluations = 0

    def compile(self, expression: str) -> Selector:
        found = self._compiled.get(expression)
        if found is None:
            try:
                found = compile_selector(expression)
            except CelError as err:
                found = err
            self._compiled[expression] = found
        if isinstance(found, CelError):
            raise found
        return found

    def matches(self, expression: str, device: Device) -> bool:
        """Whether ``device`` matches; raises :class:`CelError` when evaluation fails."""
        key = (expression, device.driver, device.pool, device.generation, device.name)
        result = self._results.get(key)
        if result is None:
            result = self._evaluate(self.compile(expression), device)
            self._results[key] = result
        if isinstance(result, CelError):
            raise result
        return result

    def _evaluate(self, selector: Selector, device: Device) -> bool | CelError:
        ident = (device.driver, device.pool, device.generation, device.name)
        last = self._view
        if last is not None and last[0] == ident:
            view = last[1]
        else:
            view = device_view(device)
            self._view = (ident, view)
        if (
            selector.domains - view["attributes"].keys()
            or selector.domains - view["capacity"].keys()
        ):
            view = {
                **view,
                "attributes": {d: {} for d in selector.domains} | view["attributes"],
                "capacity": {d: {} for d in selector.domains} | view["capacity"],
            }
        self.evaluations += 1
        try:
            value = selector.program.execute(_cel.Context({"device": view}, FUNCTIONS))
        except Exception as err:  # KeyError for a missing attribute, RuntimeError, ...
            return CelError(
                f"CEL selector {selector.expression!r} failed on device"
                f" {device.pool}/{device.name}: {type(err).__name__}: {err}"
            )
        if not isinstance(value, bool):
            return CelError(
                f"CEL selector {selector.expression!r} returned {value!r}, not a bool,"
                f" on device {device.pool}/{device.name}"
            )
        return value

    def forget_older(self, live: Mapping[tuple[str, str], int]) -> None:
        """Drop cached results of pools whose generation is not ``live[(driver, pool)]``."""
        self._view = None
        self._results = {k: v for k, v in self._results.items() if live.get((k[1], k[2])) == k[3]}
