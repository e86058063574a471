"""The observers the kubelet plugin hands its engine: the claim log, and metrics when served.

The plugin runtime, once it has built its :class:`~dra_driver.plugin.driver.Driver`
and its health monitor::

    driver.observers.extend(plugin_observers(driver, metrics))
    if metrics is not None:
        health.listeners.append(metrics.follow_health(health))
"""

from __future__ import annotations

from dra_driver.core.prepare import DriverObserver
from dra_driver.observability.claim_log import ClaimLog
from dra_driver.observability.plugin_metrics import DriverState, PluginMetrics


def plugin_observers(
    driver: DriverState, metrics: PluginMetrics | None = None
) -> list[DriverObserver]:
    """One log line per claim operation; and ``metrics`` (None: not served), bound to ``driver``."""
    observers: list[DriverObserver] = [ClaimLog()]
    if metrics is not None:
        metrics.bind(driver)
        observers.append(metrics)
    return observers
