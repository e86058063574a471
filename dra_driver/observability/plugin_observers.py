"""The observers the kubelet plugin hands its engine: the claim log, and metrics when served.

The plugin's composition root (``dra_driver/app/plugin.py``) passes them to the
:class:`~dra_driver.plugin.driver.Driver`'s constructor::

    Driver(..., observers=plugin_observers(engine_state, metrics))

and the metrics follow device health through a health-monitor listener.
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
