"""Background tasks that must live as long as their process: one supervisor for all.

:func:`supervise` runs them in one :class:`asyncio.TaskGroup`; the first that
fails or returns is logged as an ERROR naming it, reported once as a
:class:`BackgroundTaskFailed` and cancels the others, so that the process stops
(and is restarted) rather than living on without, say, an informer.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Coroutine, Mapping
from typing import Any, NoReturn

from dra_driver.base.errors import DriverError

__all__ = ["BackgroundFate", "BackgroundTaskFailed", "Work", "first_of", "supervise"]

log = logging.getLogger(__name__)

Work = Callable[[], Coroutine[Any, Any, object]]
"""A background task's body, run for the process's lifetime."""


class BackgroundTaskFailed(DriverError):
    """A background task that must run until shutdown failed or ended: its process stops."""

    def __init__(self, name: str, cause: BaseException | None, component: str = "plugin") -> None:
        why = f"failed: {cause!r}" if cause is not None else "ended"
        super().__init__(
            f"background task {name} {why}; it should run until shutdown, so the {component} stops"
        )
        self.task_name = name
        self.cause = cause
        self.component = component


class BackgroundFate:
    """Whether a process's supervised background tasks still run, and why they stopped."""

    def __init__(self) -> None:
        self.failure: BackgroundTaskFailed | None = None
        """Why they stopped (one failed or ended); None while they run."""
        self.failed = asyncio.Event()
        """Set when :attr:`failure` is."""

    def stopped(self, failure: BackgroundTaskFailed) -> None:
        """The first task to fail or end cancelled the others (``supervise``'s callback)."""
        self.failure = failure
        self.failed.set()


async def supervise(
    work: Mapping[str, Work],
    *,
    component: str,
    on_failure: Callable[[BackgroundTaskFailed], None],
) -> None:
    """Run every task of ``work`` (name → body) in one group until cancelled.

    The first to fail or end is logged and handed to ``on_failure`` (once); the
    group then cancels the others and this returns.
    """
    failures: list[BackgroundTaskFailed] = []

    async def forever(name: str, body: Work) -> NoReturn:
        try:
            await body()
        except asyncio.CancelledError:
            raise
        except Exception as err:
            log.exception("background task %s failed", name)
            failure = BackgroundTaskFailed(name, err, component)
        else:
            log.error("background task %s ended; it should run until shutdown", name)
            failure = BackgroundTaskFailed(name, None, component)
        if not failures:  # the first one says why the process stops
            failures.append(failure)
            log.error("%s", failure)
            on_failure(failure)
        raise failure

    with contextlib.suppress(BaseExceptionGroup):  # logged and reported by forever
        async with asyncio.TaskGroup() as group:
            for name, body in work.items():
                group.create_task(forever(name, body), name=name)


async def first_of(*waits: Coroutine[Any, Any, object]) -> None:
    """Wait until one of ``waits`` is done; cancel the others."""
    tasks = [asyncio.ensure_future(w) for w in waits]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
