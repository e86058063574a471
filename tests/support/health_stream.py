"""Reading the kubelet's health stream (``NodeWatchResources``) in the tests."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from dra_driver.fakes.kubelet import HealthReport, health_reports


async def until_health(
    stream: AsyncIterator[Any], device: str, health: str, *, timeout: float = 10.0
) -> dict[str, HealthReport]:
    """The first message's reports in which ``device`` has ``health``; fails when the
    stream ends first, or after ``timeout`` seconds (:class:`TimeoutError`)."""

    async def read() -> dict[str, HealthReport]:
        async for message in stream:
            reports = health_reports(message)
            if reports[device].health == health:
                return reports
        raise AssertionError("the health stream ended")

    return await asyncio.wait_for(read(), timeout)
