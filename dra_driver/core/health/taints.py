"""Device-health taints (pure): what an unhealthy device's ResourceSlice entry carries.

:func:`device_taints` turns the devices' health into the ResourceSlice device taints:
key ``<driver>/unhealthy``, value the reason (``xid-79``, ``gpu-lost``,
``mps-daemon-down``), effect ``NoSchedule``, or ``NoExecute`` for fatal
problems when :attr:`~dra_driver.core.health.model.HealthSettings.fatal_effect` says
so. Unknown health is not tainted: nothing is known to be wrong with the device.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable

from dra_driver.base.errors import ConfigError
from dra_driver.base.names import LABEL_NAME_RE, MAX_DNS_SUBDOMAIN, dns_label
from dra_driver.core.health.device import DeviceHealth, Status


class TaintEffect(enum.StrEnum):
    NO_SCHEDULE = "NoSchedule"
    NO_EXECUTE = "NoExecute"


TAINT_NAME = "unhealthy"


def unhealthy_taint_key(driver_name: str) -> str:
    """``<driver name>/unhealthy``; raises ConfigError when that is no valid label key.

    A taint key is a label name: the prefix must be a lower-case DNS subdomain
    of at most 253 characters. The API accepts driver names with upper-case
    letters, which a taint key does not.
    """
    key = f"{driver_name}/{TAINT_NAME}"
    # Each label a DNS label of at most 63 characters (stricter than the API's
    # subdomain check, which does not bound the labels).
    if len(driver_name) > MAX_DNS_SUBDOMAIN or any(
        dns_label(label) for label in driver_name.split(".")
    ):
        raise ConfigError(
            f"the device taint key {key!r} is not a valid label key: its prefix, the driver "
            "name, must be a lower-case DNS subdomain; check --driver-name"
        )
    return key


def device_taints(
    devices: Iterable[DeviceHealth], *, driver_name: str, fatal_effect: TaintEffect
) -> dict[str, list[dict[str, str]]]:
    """Device name → the taints its ResourceSlice entry gets (only unhealthy devices).

    One taint per device, so the 1.34 limit of 4 taints is never near.
    ``timeAdded`` is left to the API server (the publisher keeps the stored one).
    """
    key = unhealthy_taint_key(driver_name)
    taints: dict[str, list[dict[str, str]]] = {}
    for device in devices:
        if device.status is not Status.UNHEALTHY:
            continue
        value = device.reason if LABEL_NAME_RE.fullmatch(device.reason or "-") else "unhealthy"
        effect = fatal_effect if device.fatal else TaintEffect.NO_SCHEDULE
        taints[device.device_name] = [{"key": key, "value": value[:63], "effect": str(effect)}]
    return taints
