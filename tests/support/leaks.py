"""A test must not leave work running behind it: the ``no_leaks`` fixture's checks.

The rules (``tests/conftest.py`` applies them to every test, autouse):

* **Threads.** A non-daemon thread that is alive after the test and was not alive
  before it is a leak. Threads get up to :data:`GRACE_S` to end first (a server
  that was just told to stop may still be winding down). Daemon threads are not
  checked: nothing waits for them, and the long-lived helpers of libraries (the
  kubernetes client's thread pool, a session-scoped fake API server's threads) are
  daemon threads. Threads alive before the test started are never counted against
  it. There are no other exceptions.
* **asyncio tasks.** While the test runs, :func:`asyncio.run` is wrapped: when its
  main coroutine returns (or raises), every other task of that loop gets up to
  :data:`GRACE_S` to finish; a task still pending then is a leak (``asyncio.run``
  would cancel it silently). The tasks are left for ``asyncio.run`` to cancel as
  usual; the test fails at teardown, naming them.

:func:`tests.support.node.run_checked` applies the same task check at once (no
grace) where a test runs its scenario.

A test that must leave something behind is marked
``@pytest.mark.allow_leaks("why")``; the reason is required, and each such
marker should say what leaks and where it is tracked.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Coroutine, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

GRACE_S = 2.0
"""How long threads and tasks get to end after the test (or its ``asyncio.run``)."""

T = TypeVar("T")


def _describe_thread(thread: threading.Thread) -> str:
    target = getattr(thread, "_target", None)
    where = getattr(target, "__qualname__", None) or type(thread).__qualname__
    return f"{thread.name} ({where})"


def leaked_threads(before: set[threading.Thread], grace_s: float = GRACE_S) -> list[str]:
    """Non-daemon threads alive now that were not in ``before``, after up to ``grace_s``
    for them to end."""
    deadline = time.monotonic() + grace_s
    while True:
        new = [
            t
            for t in threading.enumerate()
            if t not in before and not t.daemon and t is not threading.current_thread()
        ]
        if not new or time.monotonic() >= deadline:
            return [_describe_thread(t) for t in new]
        new[0].join(timeout=max(0.0, min(0.05, deadline - time.monotonic())))


def _describe_task(task: asyncio.Task[Any]) -> str:
    return f"{task.get_name()}: {task.get_coro()!r:.200}"


async def pending_tasks(grace_s: float = GRACE_S) -> list[str]:
    """The running loop's other tasks still pending after one pass of the loop and
    up to ``grace_s`` more (0: that one pass only), described."""
    current = asyncio.current_task()
    loop = asyncio.get_running_loop()
    deadline = loop.time() + grace_s
    await asyncio.sleep(0)  # a task finishing now gets its last step
    while True:
        pending = [t for t in asyncio.all_tasks() if t is not current]
        if not pending or loop.time() >= deadline:
            return [_describe_task(t) for t in pending]
        await asyncio.sleep(0.01)


@contextmanager
def watching_asyncio_run(found: list[str], grace_s: float = GRACE_S) -> Iterator[None]:
    """Wrap :func:`asyncio.run` so that tasks still pending after its main coroutine
    (and ``grace_s``) are appended to ``found``."""
    real_run = asyncio.run

    def run(main: Coroutine[Any, Any, T], **kwargs: Any) -> T:
        async def checked() -> T:
            try:
                return await main
            finally:
                found.extend(await pending_tasks(grace_s))

        return real_run(checked(), **kwargs)

    asyncio.run = run
    try:
        yield
    finally:
        asyncio.run = real_run
