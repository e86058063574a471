"""``RawExtension`` fields as the real API server keeps them: bytes, not values (pure).

Observed on a real 1.36 API server (fact sheet 5.3, issue 16): opaque
``parameters`` and ``status.devices[].data`` are stored as the *bytes* a client
sent, and immutability (a claim's spec, its ``status.allocation``) is checked
by comparing those bytes. What each write makes of them:

* POST and PUT: exactly the bytes of the value in the request body, spaces and
  key order included;
* every answer (GET, list, watch, a write's reply): the stored bytes with the
  whitespace removed and ``<``, ``>``, ``&``, U+2028, U+2029 escaped inside
  strings (Go's ``json.Compact`` with HTML escaping), key order kept;
* JSON merge patch and JSON patch: the stored object as answered (compacted),
  the patch applied; a value the patch supplies keeps the patch's bytes
  (compacted), a value the patch merges into is re-encoded canonically;
* strategic merge patch and server-side apply: the whole object goes through
  Go's generic JSON form, so every such value is re-encoded canonically: keys
  sorted, no whitespace, HTML-escaped (``json.Marshal`` of a map);
* the fake's own test-side writes (``FakeKubeApi.create`` etc., given Python
  dicts) store the canonical form, as ``kubectl`` sends it.

:class:`RawJson` is a ``dict`` (tests read it as the parsed value) that also
carries the stored text in ``raw``. NOT emulated: Go's float formatting for
numbers under 1e-4 or with exponents (integral floats are written as integers,
the rest as Python writes them); invalid UTF-8.
"""

from __future__ import annotations

import copy
import functools
import json
import re
from collections.abc import Callable, Iterator
from typing import Any, TypeVar, cast

from tests.support.fakekube_types import FakeApiError, JsonObj, ResourceKind

_Path = tuple[str, ...]
"""Field names from the object's root; ``*`` stands for any list index."""

_OPAQUE = ("opaque", "parameters")
RAW_PATHS: dict[str, frozenset[_Path]] = {
    "ResourceClaim": frozenset(
        {
            ("spec", "devices", "config", "*", *_OPAQUE),
            ("status", "allocation", "devices", "config", "*", *_OPAQUE),
            ("status", "devices", "*", "data"),
        }
    ),
    "ResourceClaimTemplate": frozenset({("spec", "spec", "devices", "config", "*", *_OPAQUE)}),
    "DeviceClass": frozenset({("spec", "config", "*", *_OPAQUE)}),
}


class RawJson(dict[str, Any]):
    """A ``RawExtension`` value: the parsed object, and in :attr:`raw` the stored text."""

    def __init__(self, value: dict[str, Any], raw: str) -> None:
        super().__init__(value)
        self.raw = raw

    def __repr__(self) -> str:
        return f"RawJson({self.raw})"


def raw_paths(kind: ResourceKind) -> frozenset[_Path]:
    return RAW_PATHS.get(kind.kind, frozenset())


# --- Go's encodings ---------------------------------------------------------------------

_HTML_ESCAPES = {
    "<": "\\u003c",
    ">": "\\u003e",
    "&": "\\u0026",
    "\u2028": "\\u2028",
    "\u2029": "\\u2029",
}
_HTML = re.compile("[<>&\u2028\u2029]")


@functools.lru_cache(maxsize=4096)
def go_compact(raw: str) -> str:
    """``json.Compact`` with HTML escaping: whitespace outside strings dropped.

    Remembered (a pure function of the text): every answer and event re-sends the
    same few stored texts."""
    out: list[str] = []
    in_string = escaped = False
    for char in raw:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
            out.append(_HTML_ESCAPES.get(char, char))
        elif char == '"':
            in_string = True
            out.append(char)
        elif char not in " \t\n\r":
            out.append(char)
    return "".join(out)


def go_canonical(value: Any) -> str:
    """``json.Marshal`` of the value decoded into Go's generic JSON form."""
    text = json.dumps(_go_numbers(value), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return _HTML.sub(lambda m: _HTML_ESCAPES[m.group()], text)


def _go_numbers(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _go_numbers(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_go_numbers(v) for v in value]
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e21:
        return int(value)  # Go writes float64 2.0 as 2
    return value


# --- reading request bodies ---------------------------------------------------------------

_WS = re.compile(r"[ \t\n\r]*")
_DECODER = json.JSONDecoder()


def decode_body(text: str, paths: frozenset[_Path]) -> Any:
    """Parse a request body; objects at ``paths`` become :class:`RawJson` with their exact text.

    Raises ``ValueError`` for invalid JSON.
    """
    value = json.loads(text)  # validity (and its error message) first
    if not isinstance(value, dict) or not any(f'"{p[-1]}"' in text for p in paths):
        return value  # no field that could hold one: nothing to keep
    return _parse(text, 0, (), paths, _prefixes(paths))[0]


@functools.cache
def _prefixes(paths: frozenset[_Path]) -> frozenset[_Path]:
    """Every path on the way to one of ``paths``: below any other, nothing is kept raw."""
    return frozenset(p[:i] for p in paths for i in range(len(p) + 1))


def _ws(text: str, i: int) -> int:
    match = _WS.match(text, i)
    return match.end() if match else i


def _parse(
    text: str, i: int, path: _Path, paths: frozenset[_Path], prefixes: frozenset[_Path]
) -> tuple[Any, int]:
    i = _ws(text, i)
    start = i
    value: Any
    if path not in prefixes:
        value, i = _DECODER.raw_decode(text, i)  # nothing raw below: json's own parser
    elif text[i] == "{":
        value, i = {}, _ws(text, i + 1)
        if text[i] == "}":
            i += 1
        while text[i - 1] != "}":
            key, i = _DECODER.raw_decode(text, _ws(text, i))
            i = _ws(text, i) + 1  # the colon
            value[key], i = _parse(text, i, (*path, key), paths, prefixes)
            i = _ws(text, i) + 1  # a comma or the closing brace
    elif text[i] == "[":
        value, i = [], _ws(text, i + 1)
        if text[i] == "]":
            i += 1
        while text[i - 1] != "]":
            item, i = _parse(text, i, (*path, "*"), paths, prefixes)
            value.append(item)
            i = _ws(text, i) + 1
    else:
        value, i = _DECODER.raw_decode(text, i)
    if path in paths and isinstance(value, dict):
        value = RawJson(value, text[start:i])
    return value, i


# --- what a write stores ------------------------------------------------------------------


def _nodes(obj: Any, pattern: _Path) -> Iterator[tuple[Any, str | int]]:
    """(container, key) of every value at ``pattern`` in ``obj``."""
    containers: list[Any] = [obj]
    for step in pattern[:-1]:
        nxt: list[Any] = []
        for node in containers:
            if step == "*" and isinstance(node, list):
                nxt.extend(node)
            elif isinstance(node, dict) and isinstance(node.get(step), dict | list):
                nxt.append(node[step])
        containers = nxt
    last = pattern[-1]
    for node in containers:
        if last == "*" and isinstance(node, list):
            yield from ((node, i) for i in range(len(node)))
        elif isinstance(node, dict) and last in node:
            yield node, last


def _rewrite(obj: Any, kind: ResourceKind, encode: Callable[[Any], RawJson | Any]) -> Any:
    for pattern in raw_paths(kind):
        for container, key in _nodes(obj, pattern):
            container[key] = encode(container[key])
    return obj


def _consistent(value: Any) -> bool:
    """The stored text still says what the value holds (nothing merged into it)."""
    return isinstance(value, RawJson) and json.loads(value.raw) == dict(value)


def as_sent(obj: Any, kind: ResourceKind) -> Any:
    """POST/PUT: a value read from the body keeps its exact text; a Python dict
    (the test-side API) gets the canonical one."""

    def encode(value: Any) -> Any:
        if _consistent(value) or not isinstance(value, dict):
            return value
        return RawJson(value, go_canonical(value))

    return _rewrite(obj, kind, encode)


def as_answered(obj: Any, kind: ResourceKind) -> Any:
    """The object as the server writes it out (and as patches see it): compacted."""

    def encode(value: Any) -> Any:
        return RawJson(value, go_compact(value.raw)) if isinstance(value, RawJson) else value

    return _rewrite(obj, kind, encode)


def as_patched(obj: Any, kind: ResourceKind) -> Any:
    """After a JSON (merge) patch: untouched and supplied values keep their (compacted)
    text; values the patch merged into are re-encoded canonically."""

    def encode(value: Any) -> Any:
        if _consistent(value):
            return RawJson(value, go_compact(value.raw))
        return RawJson(value, go_canonical(value)) if isinstance(value, dict) else value

    return _rewrite(obj, kind, encode)


def as_generic(obj: Any, kind: ResourceKind) -> Any:
    """Strategic merge patch and server-side apply: every value re-encoded canonically."""

    def encode(value: Any) -> Any:
        return RawJson(value, go_canonical(value)) if isinstance(value, dict) else value

    return _rewrite(obj, kind, encode)


def encode_wire(obj: Any, raw_at: frozenset[_Path] | None = None) -> bytes:
    """The JSON the server sends for ``obj``: each :class:`RawJson` as its compacted text.

    ``raw_at``: where in ``obj`` a :class:`RawJson` may be (its kind's
    :data:`RAW_PATHS`, under the event's ``object`` or a list's ``items``); only those
    branches are looked into, instead of the whole tree. None: anywhere."""
    raws: list[str] = []

    def swap(node: Any) -> Any:
        if isinstance(node, RawJson):
            raws.append(go_compact(node.raw))
            return f"\0raw{len(raws) - 1}\0"
        if isinstance(node, dict):
            return {k: swap(v) for k, v in node.items()}
        if isinstance(node, list):
            return [swap(v) for v in node]
        return node

    def along(node: Any, trie: _Trie) -> Any:
        if trie is _LEAF:
            return swap(node)
        if isinstance(node, list):
            below = trie.get("*")
            return node if below is None else [along(v, below) for v in node]
        if isinstance(node, dict):
            out = None
            for key, below in trie.items():
                if key in node:
                    out = dict(node) if out is None else out
                    out[key] = along(node[key], below)
            return node if out is None else out
        return node

    text = json.dumps(swap(obj) if raw_at is None else along(obj, _trie(raw_at)) if raw_at else obj)
    for i, raw in enumerate(raws):
        text = text.replace(f'"\\u0000raw{i}\\u0000"', raw, 1)
    return text.encode()


_Trie = dict[str, Any]
_LEAF: _Trie = {}
"""The end of a path: everything below may be raw."""


@functools.cache
def _trie(paths: frozenset[_Path]) -> _Trie:
    """``paths`` as nested dicts, step by step (built once per set of paths)."""
    if () in paths:
        return _LEAF
    steps = sorted({p[0] for p in paths})
    return {step: _trie(frozenset(p[1:] for p in paths if p[0] == step)) for step in steps}


def event_line(event_type: str, encoded: bytes) -> bytes:
    """A watch event's line from its object's :func:`encode_wire` bytes: the same bytes
    as ``encode_wire({"type": event_type, "object": obj}, <the paths under "object">)``
    plus the newline (``json.dumps`` writes ``{"type": ..., "object": ...}`` so)."""
    return b'{"type": %s, "object": %s}\n' % (json.dumps(event_type).encode(), encoded)


def under(prefix: _Path, paths: frozenset[_Path]) -> frozenset[_Path]:
    """``paths`` (of one object) as seen from a body that holds the object at ``prefix``."""
    return frozenset((*prefix, *p) for p in paths)


_T = TypeVar("_T")
_IMMUTABLE = (str, int, float, bool, type(None))


def copy_json(node: _T) -> _T:
    """A deep copy of a JSON tree (what the store holds): plain dicts and lists are
    rebuilt, scalars shared, a :class:`RawJson` rebuilt with its text, anything else
    deep-copied. The same result as ``copy.deepcopy`` several times faster: no memo
    of shared nodes, which a tree decoded from JSON never has."""
    return cast(_T, _copied(node))


def _copied(node: Any) -> Any:
    kind = type(node)
    if kind is dict:
        return {k: _copied(v) for k, v in node.items()}
    if kind is list:
        return [_copied(v) for v in node]
    if kind in _IMMUTABLE:
        return node
    if kind is RawJson:
        return RawJson({k: _copied(v) for k, v in node.items()}, node.raw)
    return copy.deepcopy(node)


# --- immutability --------------------------------------------------------------------------


def same_bytes(a: Any, b: Any) -> bool:
    """Equal as the API server compares: ``RawJson`` by its stored text."""
    kind, other = type(a), type(b)
    # Plain JSON nodes first, by exact type (the walk of every write's whole object).
    if kind is dict and other is dict:
        return a.keys() == b.keys() and _same_values(a, b)
    if kind is list and other is list:
        return len(a) == len(b) and _same_items(a, b)
    if kind in _IMMUTABLE and other in _IMMUTABLE:
        return bool(a == b)
    return _same_other(a, b)


def _same_other(a: Any, b: Any) -> bool:
    """:func:`same_bytes` of anything but two plain dicts, lists or scalars."""
    if isinstance(a, RawJson) or isinstance(b, RawJson):
        return isinstance(a, RawJson) and isinstance(b, RawJson) and a.raw == b.raw
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same_bytes(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same_bytes(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def _same_values(a: dict[str, Any], b: dict[str, Any]) -> bool:
    for key, value in a.items():  # noqa: SIM110 (a loop: no generator frame per node)
        if not same_bytes(value, b[key]):
            return False
    return True


def _same_items(a: list[Any], b: list[Any]) -> bool:
    for x, y in zip(a, b, strict=True):  # noqa: SIM110 (as above)
        if not same_bytes(x, y):
            return False
    return True


def check_claim_update(
    kind: ResourceKind, name: str, old: JsonObj, new: JsonObj, *, spec: bool, status: bool
) -> None:
    """A ResourceClaim's spec never changes; its ``status.allocation`` only from none
    to one or back to none. ``spec``/``status``: which halves this write carries."""
    if kind.kind != "ResourceClaim":
        return
    if spec and not same_bytes(old.get("spec"), new.get("spec")):
        raise _immutable(kind, name, "spec", new.get("spec"))
    before = (old.get("status") or {}).get("allocation")
    after = (new.get("status") or {}).get("allocation")
    if status and before and after and not same_bytes(before, after):
        raise _immutable(kind, name, "status.allocation", after)


def _immutable(kind: ResourceKind, name: str, field: str, value: Any) -> FakeApiError:
    shown = encode_wire(value).decode()
    return FakeApiError(
        422,
        f'{kind.kind}.{kind.group} "{name}" is invalid: {field}: Invalid value: {shown}: '
        "field is immutable",
        kind=kind,
        name=name,
    )
