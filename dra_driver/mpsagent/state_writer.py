"""One write of the agent's state file for the changes made at once (asyncio).

Shares of one GPU are now prepared side by side (:mod:`.gpu_gate`), and the
answers of a wave of them come back together: each would rewrite the whole
state file. :meth:`CoalescedWrite.save` joins the write already scheduled for
this turn of the event loop; that write runs on the next turn, after every
change made before it was asked for, so each caller returns only once a file
holding its change is in place (as the plugin is answered after it). The write
itself is synchronous (no fsync, see :func:`.agent_state.save_state`): no change
can slip in while it runs. A caller that says it is ``alone`` (no other change
is under way, so none would join) has the file written at once, not a turn of the
loop later: one call at a time is the plugin's common case. Only the caller can
say so: a wave of releases (no commands, so each runs to its save without a
pause) has one change under way at a time, yet theirs share a write only if each
waits that turn.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable


class CoalescedWrite:
    def __init__(self, write: Callable[[], None]) -> None:
        self._write = write
        self._next: asyncio.Future[None] | None = None
        self.writes = 0
        """How many times the file was written (tests, benchmarks)."""

    async def save(self, *, alone: bool = False) -> None:
        """Return once the state, as it is now, is written; raise what the write raised.

        ``alone``: no other change is under way, and none is expected to join: written
        now (unless a write is scheduled already: it holds this change too)."""
        pending = self._next
        if pending is None and alone:
            self._write()
            self.writes += 1
            return
        if pending is None:
            loop = asyncio.get_running_loop()
            pending = self._next = loop.create_future()
            loop.call_soon(self._run)
        # Shielded: a caller cancelled while waiting must not cancel the others' write.
        await asyncio.shield(pending)

    def _run(self) -> None:
        pending, self._next = self._next, None
        assert pending is not None
        try:
            self._write()
        except Exception as err:  # each waiting caller raises it (e.g. a full disk)
            pending.set_exception(err)
            return
        self.writes += 1
        pending.set_result(None)
