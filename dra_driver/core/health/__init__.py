"""Device health (pure): from XIDs, probes and MPS daemons to per-device state and taints.

``model`` is the health model (:class:`HealthModel`, its settings and
problems), ``xid`` the XID catalogue, ``device`` the per-device record and
``taints`` the ResourceSlice taints made from it. Import from here.
"""

from dra_driver.core.health.device import DeviceHealth, Status
from dra_driver.core.health.model import (
    EVENTS_FAILED,
    GPU_LOST,
    MPS_DAEMON_DOWN,
    PROBE_FAILED,
    HealthModel,
    HealthSettings,
    Problem,
    Source,
    xid_reason,
)
from dra_driver.core.health.taints import (
    TAINT_NAME,
    TaintEffect,
    device_taints,
    unhealthy_taint_key,
)
from dra_driver.core.health.xid import (
    APPLICATION_XIDS,
    FATAL_XIDS,
    INFORMATIONAL_XIDS,
    NOT_AN_XID,
    XID_NAMES,
    XidClass,
    classify_xid,
    describe_xid,
    parse_xid_list,
)

__all__ = [
    "APPLICATION_XIDS",
    "EVENTS_FAILED",
    "FATAL_XIDS",
    "GPU_LOST",
    "INFORMATIONAL_XIDS",
    "MPS_DAEMON_DOWN",
    "NOT_AN_XID",
    "PROBE_FAILED",
    "TAINT_NAME",
    "XID_NAMES",
    "DeviceHealth",
    "HealthModel",
    "HealthSettings",
    "Problem",
    "Source",
    "Status",
    "TaintEffect",
    "XidClass",
    "classify_xid",
    "describe_xid",
    "device_taints",
    "parse_xid_list",
    "unhealthy_taint_key",
    "xid_reason",
]
