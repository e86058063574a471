"""Legacy MPS serves one UID at a time: who waits on another UID's server (I/O).

While a legacy daemon runs, a monitor reads its control log (and
``get_server_list``) every ``interval`` seconds and reports a client that waits
on another UID's server (:attr:`UidMonitor.uid_wait`, a warning naming both UIDs
and the fix; what the log says is parsed by :func:`.commands.legacy_uid_wait`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from dra_driver.mpsagent import commands as cmd
from dra_driver.mpsagent.commands import ControlCall, UidWait
from dra_driver.mpsagent.daemon_control import DaemonControl
from dra_driver.mpsagent.daemon_files import DaemonError, read_tail

log = logging.getLogger(__name__)


class UidMonitor:
    """The latest UID check of one daemon, and the task that repeats it."""

    def __init__(
        self,
        control: DaemonControl,
        control_log: str,
        interval: float,
        *,
        running: Callable[[], bool],
        stopping: Callable[[], bool],
    ) -> None:
        """``interval``: seconds between checks (0: none); ``running``: the daemon
        answers now; ``stopping``: it is being stopped on purpose (the loop ends)."""
        self._control = control
        self._control_log = control_log
        self.interval = interval
        self._running = running
        self._stopping = stopping
        self.uid_wait: UidWait | None = None
        """A client waiting on another UID's server (latest check)."""
        self._task: asyncio.Task[None] | None = None

    @property
    def _legacy(self) -> bool:
        return self._control.protocol == "legacy"

    async def check(self) -> UidWait | None:
        """Legacy MPS: is a client waiting on a server of another UID? (None under v3.)

        ``get_server_list`` gives the live servers; the control log gives their
        UIDs and the clients' (see :func:`.commands.legacy_uid_wait`).
        """
        if not self._legacy or not self._running():
            return None
        gpu_uuid = self._control.gpu_uuid
        listed = await self._control.run(ControlCall(stdin="get_server_list\n"))
        pids = cmd.parse_legacy_server_list(listed)
        text = await asyncio.to_thread(read_tail, self._control_log)
        found = cmd.legacy_uid_wait(text, pids)
        if found != self.uid_wait:
            if found is not None:
                log.warning("GPU %s: %s", gpu_uuid, cmd.describe_uid_wait(found))
            else:
                log.info("GPU %s: no MPS client waits on another UID's server now", gpu_uuid)
        self.uid_wait = found
        return found

    def start(self) -> None:
        if not self._legacy or self.interval <= 0:
            return
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(
                self._repeat(), name=f"mps-uids-{self._control.gpu_uuid}"
            )

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None and task is not asyncio.current_task():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def _repeat(self) -> None:
        while not self._stopping():
            await asyncio.sleep(self.interval)
            try:
                await self.check()
            except DaemonError as err:
                # A daemon that died is the supervisor's business; look again later.
                log.debug("GPU %s: UID check failed: %s", self._control.gpu_uuid, err)
