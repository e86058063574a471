"""Polling until a condition holds: the one home of the tests' ``eventually`` helpers.

* :func:`eventually` (in a coroutine): ``check`` may be a plain function or return an
  awaitable (an ``async def`` check); its result counts when truthy.
* :func:`eventually_sync` (in a thread, e.g. the e2e tests): ``check`` is a plain
  function.

Both call ``check`` at once, then every ``interval`` seconds until it is truthy, and
raise :class:`AssertionError` ``timed out after <timeout>s waiting for <what>`` once
``timeout`` seconds have passed with ``check`` still falsy (it is called one last time
at the deadline). ``what`` names the condition, so the failure says what never came.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable

DEFAULT_TIMEOUT_S = 10.0
DEFAULT_INTERVAL_S = 0.02


def _timed_out(what: str, timeout: float) -> AssertionError:
    return AssertionError(f"timed out after {timeout:g}s waiting for {what}")


async def eventually(
    check: Callable[[], object | Awaitable[object]],
    what: str = "the condition",
    *,
    timeout: float = DEFAULT_TIMEOUT_S,
    interval: float = DEFAULT_INTERVAL_S,
) -> None:
    """Return once ``check()`` (awaited when it returns an awaitable) is truthy."""
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if inspect.isawaitable(result):
            result = await result
        if result:
            return
        if time.monotonic() >= deadline:
            raise _timed_out(what, timeout)
        await asyncio.sleep(interval)


def eventually_sync(
    check: Callable[[], object],
    what: str = "the condition",
    *,
    timeout: float = DEFAULT_TIMEOUT_S,
    interval: float = DEFAULT_INTERVAL_S,
) -> None:
    """Return once ``check()`` is truthy; sleeps the thread between checks."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() >= deadline:
            raise _timed_out(what, timeout)
        time.sleep(interval)
