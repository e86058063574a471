"""The allocation controller's composition root: run until a signal.

Its object graph (API client, informers, leader election, metrics server) is
built by :func:`~dra_driver.controller.main.run_controller` from a
:class:`~dra_driver.controller.ControllerConfig`.
"""

from __future__ import annotations

import asyncio

from dra_driver.controller import ControllerConfig, run_controller


def run(config: ControllerConfig) -> None:
    """Serve until SIGTERM or SIGINT."""
    asyncio.run(run_controller(config))
