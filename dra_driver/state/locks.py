"""A lock that serialises prepare/unprepare across tasks *and* processes.

During a rolling update two plugin pods share the plugin directory and the
kubelet may call either, so an ``asyncio.Lock`` is not enough: we also take an
exclusive ``flock`` on ``<plugin dir>/serialize.lock``. The flock is taken
non-blocking and polled, so waiting never blocks the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import time
from collections.abc import AsyncIterator

from dra_driver.base.errors import DriverError


class LockTimeoutError(DriverError):
    """Another process held the node lock for longer than the timeout."""


class NodeLock:
    def __init__(self, path: str, timeout: float = 30.0, poll_interval: float = 0.005) -> None:
        self.path = path
        self.timeout = timeout
        self.poll_interval = poll_interval
        self._task_lock = asyncio.Lock()
        self._fd: int | None = None

    def _file(self) -> int:
        if self._fd is None:
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        return self._fd

    @contextlib.asynccontextmanager
    async def hold(self) -> AsyncIterator[None]:
        async with self._task_lock:
            fd = self._file()
            deadline = time.monotonic() + self.timeout
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        raise LockTimeoutError(
                            f"node lock {self.path} held by another process for over "
                            f"{self.timeout:g}s; is a second plugin instance stuck?"
                        ) from None
                    await asyncio.sleep(self.poll_interval)
            try:
                yield
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
