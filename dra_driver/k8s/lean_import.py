"""Import a package's submodules without running its ``__init__`` until it is needed.

The official ``kubernetes`` package's ``__init__`` imports everything it ships:
its generated API classes and about a thousand models (``kubernetes.client``),
the dynamic client with kubernetes-validate and jsonschema, websocket streams,
OAuth, watch and informer modules. The driver uses only the configuration,
the REST transport, the exception type and the config loaders, which are
ordinary submodules. Importing them through the package costs the plugin about
20 MB of RSS it never uses (measured: 22.3 MB against 2.4 MB for the
in-cluster path).

:func:`defer_package_init` registers the package as a module whose
``__init__`` has not run yet: its submodules import as usual, and the first
time anything asks the package itself for a name it does not have, the real
``__init__`` runs in place and the name is looked up again. So other code in
the same process (tests, tools) that uses ``kubernetes.client.V1Pod`` or
``from kubernetes import watch`` still gets the whole package, only later.
``exports`` names the few package-level names that can be answered from one
submodule without running the whole ``__init__`` (``kubernetes.client``'s
``Configuration`` lives in ``kubernetes.client.configuration``).

Deferring changes how a package imports for the whole process, and a deferred
package answers no dunder but ``__all__`` until its ``__init__`` ran (``from
kubernetes import __version__`` fails): so only a process's entry point defers
(:func:`defer_official_client_inits`, called by ``dra-driver``'s console script
and ``python -m dra_driver``), never a module that a test, a tool or a user's
script imports.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import sys
import threading
from collections.abc import Iterator, Mapping
from types import ModuleType
from typing import Any

_LOCK = threading.RLock()


def defer_package_init(name: str, exports: Mapping[str, str] | None = None) -> None:
    """Register package ``name`` with its ``__init__`` deferred; no-op if already imported.

    A dotted ``name``'s parent must be imported or deferred first. ``exports``
    maps a package-level name to the submodule that defines it.
    """
    if name in sys.modules:
        return
    spec = importlib.util.find_spec(name)
    if spec is None or spec.loader is None or spec.submodule_search_locations is None:
        raise ImportError(f"{name} is not an importable package")
    module = importlib.util.module_from_spec(spec)
    state = _Deferred(module, dict(exports or {}))
    module.__dict__["__getattr__"] = state.getattr
    sys.modules[name] = module
    parent, _, child = name.rpartition(".")
    if parent:
        setattr(sys.modules[parent], child, module)


def defer_official_client_inits() -> None:
    """Defer the official client's package ``__init__``s for the rest of this process.

    Only a process entry point calls this, before anything imports ``kubernetes``
    (a no-op for a package already imported): the submodules this module needs
    then import without the generated models, the dynamic client, websockets and
    OAuth, and anything else that asks the package for a name still gets the
    whole ``__init__``, run on that first question.
    """
    defer_package_init("kubernetes")
    defer_package_init(
        "kubernetes.client",
        {
            "Configuration": "kubernetes.client.configuration",
            "ApiClient": "kubernetes.client.api_client",
            "ApiException": "kubernetes.client.exceptions",
        },
    )
    defer_package_init("kubernetes.client.models")
    defer_package_init("kubernetes.config")
    defer_package_init("kubernetes.utils")


@contextlib.contextmanager
def provisionally(package: str, name: str, value: object) -> Iterator[None]:
    """``package.name`` is ``value`` inside the block (for a module imported there,
    which binds it); afterwards the name is looked up as before. ``package`` must be
    deferred and not have the name yet."""
    namespace = sys.modules[package].__dict__
    if name in namespace:
        raise ValueError(f"{package}.{name} is already set")
    namespace[name] = value
    try:
        yield
    finally:
        if namespace.get(name) is value:
            del namespace[name]


@contextlib.contextmanager
def provisional_module(name: str, attributes: Mapping[str, object]) -> Iterator[None]:
    """Inside the block, importing ``name`` gives a module holding ``attributes``
    (for a module imported there, which binds them); afterwards ``name`` imports
    as usual. No-op if ``name`` is imported already."""
    if name in sys.modules:
        yield
        return
    stand_in = ModuleType(name)
    stand_in.__dict__.update(attributes)
    sys.modules[name] = stand_in
    try:
        yield
    finally:
        if sys.modules.get(name) is stand_in:
            del sys.modules[name]


def is_deferred(name: str) -> bool:
    """True while ``name`` is registered and its ``__init__`` has not run."""
    module = sys.modules.get(name)
    return module is not None and isinstance(
        getattr(module.__dict__.get("__getattr__"), "__self__", None), _Deferred
    )


class _Deferred:
    """The hook of one deferred package: answers exports, else runs the real ``__init__``."""

    def __init__(self, module: ModuleType, exports: dict[str, str]) -> None:
        self._module = module
        self._exports = exports
        self._started = False

    def getattr(self, attr: str) -> Any:
        name = self._module.__name__
        if attr in self._exports:
            value = getattr(importlib.import_module(self._exports[attr]), attr)
            self._module.__dict__[attr] = value
            return value
        if not attr.startswith("__") and importlib.util.find_spec(f"{name}.{attr}") is not None:
            # A submodule (``from kubernetes.client import rest``): import it
            # alone, as the import system would after this miss.
            return importlib.import_module(f"{name}.{attr}")
        # Dunder probes (copy, pickle, inspect, pytest) must not pull in the
        # whole package; ``__all__`` is a real question about its contents.
        if not (attr.startswith("__") and attr != "__all__"):
            self._run_init()
            # Looked up as usual now: the real ``__init__`` may define a
            # ``__getattr__`` of its own (kubernetes 37's client does).
            return getattr(self._module, attr)
        raise AttributeError(f"module {name!r} has no attribute {attr!r}")

    def _run_init(self) -> None:
        with _LOCK:
            if self._started:
                return
            self._started = True
            # Gone before the real code runs, so a name the ``__init__`` asks
            # of its own package while it runs fails as it would normally.
            self._module.__dict__.pop("__getattr__", None)
            spec = self._module.__spec__
            assert spec is not None and spec.loader is not None
            spec.loader.exec_module(self._module)
