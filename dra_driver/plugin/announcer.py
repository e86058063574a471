"""Telling the observers of each claim's operation, after its answer.

The observers (the claim log, metrics, claim status and Events) hear of a lone
call's claims before the call returns, and of a wave's once the whole wave has
been answered: their log lines, metrics and status writes are not what the other
claims of the wave wait for, and they cost a quarter of a millisecond of the one
core the wave's claims share.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from dra_driver.core.prepare import ClaimOperation, DriverObserver, notify
from dra_driver.plugin.activity import CallActivity


class OutcomeAnnouncer:
    def __init__(self, observers: list[DriverObserver], activity: CallActivity) -> None:
        """``observers``: the list itself, read at each announcement (the caller's to
        change)."""
        self.observers = observers
        self.activity = activity
        self._queued: list[Sequence[ClaimOperation]] = []
        self._task: asyncio.Task[None] | None = None

    def announce(self, operations: Sequence[ClaimOperation]) -> None:
        """Tell the observers of one call's claims; called before the call returns."""
        if self.activity.calls <= 1 and not self._queued:
            self._notify(operations)
            return
        # In the order the answers went out: a claim's prepare is always told first.
        self._queued.append(operations)
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._notify_after_lull(), name="claim-observers")

    async def close(self) -> None:
        """Wait for the announcements queued."""
        while self._task is not None and not self._task.done():
            await asyncio.gather(self._task, return_exceptions=True)

    async def _notify_after_lull(self) -> None:
        while self._queued:
            await self.activity.lull()
            told, self._queued = self._queued, []
            for operations in told:
                self._notify(operations)

    def _notify(self, operations: Sequence[ClaimOperation]) -> None:
        for operation in operations:
            notify(self.observers, operation)
