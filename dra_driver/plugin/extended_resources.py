"""The kubelet plugin's start-up check for DRA extended resources (KEP-5004).

The chart passes the extended resource names its DeviceClasses serve
(``--extended-resource-names``). If this node's ``status.allocatable`` or
``status.capacity`` has one of them, a device plugin advertises it here too
(:mod:`dra_driver.core.slices.extended_resources` says why that is a trap): the
plugin logs a warning and writes a Warning Event ``ExtendedResourceConflict``
on the Node. It only warns: the plugin still serves normal claims, and the
operator decides which of the two goes. A Node that cannot be read is logged
and the plugin starts anyway.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence

from dra_driver.base.errors import ApiError
from dra_driver.core.slices import EVENT_REASON, advertised, conflict_message
from dra_driver.k8s.events import WARNING, EventRecorder, InvolvedObject
from dra_driver.k8s.rest import JsonObj

log = logging.getLogger(__name__)


async def check_extended_resources(
    read_node: Callable[[], Awaitable[JsonObj]],
    *,
    node_name: str,
    names: Sequence[str],
    events: EventRecorder | None,
) -> str | None:
    """Warn if the Node also advertises one of ``names``; returns the warning (None: none)."""
    if not names:
        return None
    try:
        node = await read_node()
    except ApiError as err:
        log.warning(
            "cannot check node %s for extended resources advertised by a device plugin (%s): %s",
            node_name,
            ", ".join(names),
            err,
        )
        return None
    message = conflict_message(node_name, advertised(node, names))
    if message is None:
        log.info(
            "node %s advertises none of this driver's extended resources (%s) from a device plugin",
            node_name,
            ", ".join(names),
        )
        return None
    log.warning("%s", message)
    if events is not None:
        await events.record(InvolvedObject.node(node_name), EVENT_REASON, message, WARNING)
    return message
