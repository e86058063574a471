"""Fixtures shared by the whole suite (helpers live in tests/support)."""

from __future__ import annotations

import asyncio
import gc
import logging
import threading
from collections.abc import Coroutine, Iterator
from typing import Any, TypeVar

import pytest

from tests.support.chart import chart_api
from tests.support.fakekube import FakeKubeApi
from tests.support.leaks import leaked_threads, watching_asyncio_run
from tests.support.transport import close_made

T = TypeVar("T")


@pytest.fixture
def fake_kube(request: pytest.FixtureRequest) -> Iterator[FakeKubeApi]:
    """A started fake Kubernetes API server; closed (watches ended) after the test.

    Under ``@pytest.mark.chart(values)`` (a module's ``pytestmark``) it enforces the
    Helm chart's RBAC and admission policies rendered with those ``--set`` values, so
    components must talk to it as their ServiceAccounts (``tests/support/chart.py``)."""
    marker = request.node.get_closest_marker("chart")
    if marker is None:
        api = FakeKubeApi()
    else:
        values = tuple(marker.args[0]) if marker.args else ()
        api = chart_api(values, **marker.kwargs)
    with api:
        yield api


@pytest.fixture(autouse=True)
def _transports_closed(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every ``asyncio.run`` of a test ends by closing the connections that the API
    transports of ``tests/support/transport.py`` keep on its loop (a driver process
    closes its own transport on its loop; a test may share one across runs)."""
    real_run = asyncio.run

    def run(main: Coroutine[Any, Any, T], **kwargs: Any) -> T:
        async def closing() -> T:
            try:
                return await main
            finally:
                await close_made()

        return real_run(closing(), **kwargs)

    monkeypatch.setattr(asyncio, "run", run)


@pytest.fixture(autouse=True)
def _root_logger_restored() -> Iterator[None]:
    """Tests that run a CLI entry point configure logging (root level and handler);
    put it back, so a later test's ``caplog`` sees what it logs."""
    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    yield
    root.setLevel(level)
    for handler in [h for h in root.handlers if h not in handlers]:
        root.removeHandler(handler)


@pytest.fixture(autouse=True)
def _heap_unfrozen() -> Iterator[None]:
    """A test that runs a daemon's entry point in this process freezes its heap
    (app/heap.py); thaw it, so later tests' garbage is collected as usual."""
    yield
    if gc.get_freeze_count():
        gc.unfreeze()


@pytest.fixture(autouse=True)
def _no_leaks(request: pytest.FixtureRequest) -> Iterator[None]:
    """Fail a test that leaves non-daemon threads running or asyncio tasks pending
    (the rules: tests/support/leaks.py). ``@pytest.mark.allow_leaks("why")`` exempts one."""
    marker = request.node.get_closest_marker("allow_leaks")
    if marker is not None:
        if not (marker.args and str(marker.args[0]).strip()):
            pytest.fail("allow_leaks needs a reason: @pytest.mark.allow_leaks('why')")
        yield
        return
    before = set(threading.enumerate())
    tasks: list[str] = []
    with watching_asyncio_run(tasks):
        yield
    threads = leaked_threads(before)
    problems = [f"thread still running: {t}" for t in threads]
    problems += [f"asyncio task still pending when asyncio.run returned: {t}" for t in tasks]
    if problems:
        pytest.fail("the test left work behind:\n  " + "\n  ".join(problems), pytrace=False)
