"""JSON merge patch (RFC 7386) and JSON patch (RFC 6902) for the fake API server (pure).

Values taken from a patch are copied (:func:`~tests.support.fakekube_raw.copy_json`), so
the result never shares a node with the patch; ``in_place`` saves the copy of the
target when the caller already holds one of its own (the store patches a copy of the
stored object: one copy per write, not one per step).
"""

from __future__ import annotations

from typing import Any

from tests.support.fakekube_raw import copy_json
from tests.support.fakekube_types import FakeApiError, bad_request


def merge_patch(target: Any, patch: Any, *, in_place: bool = False) -> Any:
    """RFC 7386 JSON merge patch: objects merge recursively, ``null`` deletes, the rest replaces.

    Returns a new document; neither argument is modified, unless ``in_place``: then
    ``target`` is patched and returned (when it is an object).
    """
    return _merge(target if in_place else copy_json(target), patch)


def _merge(target: Any, patch: Any) -> Any:
    if not isinstance(patch, dict):
        return copy_json(patch)
    result = target if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = _merge(result.get(key), value)
    return result


def _pointer(path: Any) -> list[str]:
    if not isinstance(path, str) or (path and not path.startswith("/")):
        raise ValueError(f"invalid JSON pointer {path!r}")
    return [t.replace("~1", "/").replace("~0", "~") for t in path.split("/")[1:]]


def _pointer_get(doc: Any, tokens: list[str]) -> Any:
    for token in tokens:
        doc = doc[int(token)] if isinstance(doc, list) else doc[token]
    return doc


def _pointer_add(doc: Any, tokens: list[str], value: Any) -> Any:
    if not tokens:
        return value
    parent = _pointer_get(doc, tokens[:-1])
    last = tokens[-1]
    if isinstance(parent, list):
        index = len(parent) if last == "-" else int(last)
        if not 0 <= index <= len(parent):
            raise IndexError(f"index {index} out of range")
        parent.insert(index, value)
    elif isinstance(parent, dict):
        parent[last] = value
    else:
        raise TypeError(f"cannot add to {type(parent).__name__}")
    return doc


def _pointer_remove(doc: Any, tokens: list[str]) -> tuple[Any, Any]:
    if not tokens:
        raise ValueError("cannot remove the whole document")
    parent = _pointer_get(doc, tokens[:-1])
    removed = parent.pop(int(tokens[-1]) if isinstance(parent, list) else tokens[-1])
    return doc, removed


def json_patch(doc: Any, operations: Any, *, in_place: bool = False) -> Any:
    """RFC 6902 JSON patch; 422 Invalid when an operation cannot apply. ``doc`` is not
    modified, unless ``in_place``."""
    if not isinstance(operations, list):
        raise bad_request("a JSON patch must be a list of operations")
    doc = doc if in_place else copy_json(doc)
    for operation in operations:
        try:
            op = operation["op"]
            path = _pointer(operation["path"])
            if op == "add":
                doc = _pointer_add(doc, path, copy_json(operation["value"]))
            elif op == "remove":
                doc, _ = _pointer_remove(doc, path)
            elif op == "replace":
                _pointer_get(doc, path)  # must exist
                doc = _pointer_add(
                    _pointer_remove(doc, path)[0], path, copy_json(operation["value"])
                )
            elif op in ("move", "copy"):
                source = _pointer(operation["from"])
                if op == "move":
                    doc, value = _pointer_remove(doc, source)
                else:
                    value = copy_json(_pointer_get(doc, source))
                doc = _pointer_add(doc, path, value)
            elif op == "test":
                if _pointer_get(doc, path) != operation["value"]:
                    raise ValueError(f"test failed at {operation['path']!r}")
            else:
                raise ValueError(f"unknown op {op!r}")
        except (KeyError, IndexError, ValueError, TypeError) as err:
            raise FakeApiError(422, f"json patch {operation!r} failed: {err!r}") from err
    return doc
