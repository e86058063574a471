"""Read-only JSON trees: what one informer shares between the objects it caches.

A subtree shared by many cached objects (:class:`~.slim.Subtrees`) must not change
under any of them, so it is kept as a :class:`ReadOnlyDict` / :class:`ReadOnlyList`:
a change raises :class:`TypeError` at the line that tries it, instead of changing
every claim or pod holding the subtree. They are ``dict`` and ``list`` subclasses, so
a reader sees JSON as decoded (``isinstance``, ``==``, ``json.dumps``, ``dict(...)``
and ``{**...}`` work as for a plain tree); a copy (``copy.copy``, ``copy.deepcopy``,
pickling) is a plain, mutable ``dict`` / ``list``: the copy is the caller's own.
(``types.MappingProxyType`` would refuse changes too, but ``json.dumps`` and
``copy.deepcopy`` refuse it, and a list has no such proxy.)
"""

from __future__ import annotations

from typing import Any, NoReturn


def _refuse(self: object, *args: Any, **kwargs: Any) -> NoReturn:
    raise TypeError(
        f"this {type(self).__name__} is shared by the objects an informer caches and is "
        "read-only: change a copy (copy.deepcopy, dict(...), list(...))"
    )


class ReadOnlyDict(dict[str, Any]):
    """A ``dict`` whose every changing method raises :class:`TypeError`."""

    __slots__ = ()
    __setitem__ = __delitem__ = __ior__ = _refuse
    clear = pop = popitem = setdefault = update = _refuse

    def __reduce__(self) -> tuple[type[dict[str, Any]], tuple[dict[str, Any]]]:
        return dict, (dict(self),)


class ReadOnlyList(list[Any]):
    """A ``list`` whose every changing method raises :class:`TypeError`."""

    __slots__ = ()
    __setitem__ = __delitem__ = __iadd__ = __imul__ = _refuse
    append = extend = insert = pop = remove = clear = sort = reverse = _refuse

    def __reduce__(self) -> tuple[type[list[Any]], tuple[list[Any]]]:
        return list, (list(self),)


def read_only(node: Any) -> Any:
    """``node`` (decoded JSON) as a read-only tree: dicts and lists at every depth
    copied into :class:`ReadOnlyDict` / :class:`ReadOnlyList`; strings, numbers,
    booleans and None (immutable) as they are."""
    kind = type(node)
    if kind is dict:
        return ReadOnlyDict({k: read_only(v) for k, v in node.items()})
    if kind is list:
        return ReadOnlyList([read_only(v) for v in node])
    return node  # a scalar, or read-only already (built here: read-only all through)
