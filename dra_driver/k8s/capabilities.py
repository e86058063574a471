"""Learn which gated DRA fields the API server keeps, by server-side dry run.

An API server whose feature gate is off drops that gate's fields from new
objects without an error (``dra-facts.md`` sections 4 and 6). So instead of
guessing from the version, :func:`probe_capabilities` creates probe
ResourceSlices with ``dryRun=All`` (validated, admitted, answered as if
stored, never stored, no watch event) and reads which fields came back:

* devices slice: one device with ``allowMultipleAllocations``, a capacity with
  a ``requestPolicy`` (DRAConsumableCapacity), ``consumesCounters``
  (DRAPartitionableDevices) and ``taints`` (DRADeviceTaints);
* counters: from 1.35 a slice may hold devices or ``sharedCounters``, not both,
  so a second, counters-only slice is probed; before 1.35 the counter set goes
  into the devices slice (where its consumers must find it).

``partitionable_devices`` needs both ``consumesCounters`` and
``sharedCounters`` to survive. ``counters_in_own_slice`` comes from the
server's version (``/version``, minor ``"36+"`` read as 36), not the probe.

The probe's object names are ``<driver>-capability-probe-<node>`` (and
``...-counters``) as DNS subdomains; its slices name our node, so a
ValidatingAdmissionPolicy binding the service account to its node admits them.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping, Sequence
from typing import Any

from dra_driver.base.errors import ApiError, ApiNotFoundError, ApiUnavailableError
from dra_driver.core.settings import Capabilities
from dra_driver.k8s.publisher import FIELD_MANAGER, SLICES_PATH, dns_subdomain
from dra_driver.k8s.rest import DEFAULT_REQUEST_TIMEOUT_S, JsonObj
from dra_driver.k8s.transport import ApiTransport

log = logging.getLogger(__name__)

PROBE_DEVICE = "probe-0"
PROBE_CAPACITY = "probe"
PROBE_COUNTER_SET = "probe-counters"
PROBE_COUNTER = "probe"


# --- Pure ---------------------------------------------------------------------------------


def parse_minor(minor: str) -> int:
    """The minor version from ``/version``: ``"36"`` and ``"36+"`` (GKE, EKS) are 36."""
    digits = re.sub(r"\D", "", minor)
    if not digits:
        raise ValueError(f"the API server's minor version {minor!r} has no digits")
    return int(digits)


def probe_name(driver_name: str, node_name: str, suffix: str = "") -> str:
    return dns_subdomain(f"{driver_name}-capability-probe-{node_name}{suffix}")


def minor_in_effect(info: Mapping[str, Any]) -> int:
    """The minor release the API server behaves as: ``emulationMinor`` when it runs with
    ``--emulated-version`` (a 1.36 binary emulating 1.34 says ``minor: "36"`` and
    ``emulationMinor: "34"``), else ``minor``."""
    emulated = str(info.get("emulationMinor") or "")
    minor = parse_minor(str(info.get("minor", "")))
    if not emulated:
        return minor
    in_effect = parse_minor(emulated)
    if in_effect != minor:
        log.info("the API server (1.%d binary) emulates Kubernetes 1.%d", minor, in_effect)
    return in_effect


def probe_slices(driver_name: str, node_name: str, minor: int | None) -> list[JsonObj]:
    """The ResourceSlices to dry-run: ``[devices]`` before 1.35, ``[devices, counters]`` after.

    ``minor`` None (version unknown) probes the 1.35+ shape.
    """
    own_slice = minor is None or minor >= 35
    counter_sets = [{"name": PROBE_COUNTER_SET, "counters": {PROBE_COUNTER: {"value": "1"}}}]
    device = {
        "name": PROBE_DEVICE,
        "allowMultipleAllocations": True,
        "capacity": {
            PROBE_CAPACITY: {
                "value": "2",
                "requestPolicy": {"default": "1", "validRange": {"min": "1", "step": "1"}},
            }
        },
        "consumesCounters": [
            {"counterSet": PROBE_COUNTER_SET, "counters": {PROBE_COUNTER: {"value": "1"}}}
        ],
        "taints": [{"key": f"{driver_name}/probe", "value": "probe", "effect": "NoSchedule"}],
    }

    def slice_(name: str, spec: JsonObj) -> JsonObj:
        pool = {"name": node_name, "generation": 0, "resourceSliceCount": 1}
        return {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {"name": name},
            "spec": {"driver": driver_name, "pool": pool, "nodeName": node_name, **spec},
        }

    devices_spec: JsonObj = {"devices": [device]}
    if not own_slice:
        devices_spec["sharedCounters"] = counter_sets
        return [slice_(probe_name(driver_name, node_name), devices_spec)]
    return [
        slice_(probe_name(driver_name, node_name), devices_spec),
        slice_(probe_name(driver_name, node_name, "-counters"), {"sharedCounters": counter_sets}),
    ]


def capabilities_from(answers: Sequence[Mapping[str, Any]], minor: int | None) -> Capabilities:
    """What survived in the dry-run answers to :func:`probe_slices` (same order)."""
    specs = [a.get("spec") or {} for a in answers]
    devices = specs[0].get("devices") or [{}]
    device = devices[0]
    capacity = (device.get("capacity") or {}).get(PROBE_CAPACITY) or {}
    counters = any(s.get("sharedCounters") for s in specs)
    return Capabilities(
        consumable_capacity=device.get("allowMultipleAllocations") is True
        and "requestPolicy" in capacity,
        partitionable_devices=bool(device.get("consumesCounters")) and counters,
        device_taints=bool(device.get("taints")),
        counters_in_own_slice=minor is None or minor >= 35,
    )


# --- I/O --------------------------------------------------------------------------------------


async def read_server_minor(
    http: ApiTransport, *, request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S
) -> int:
    """The API server's minor version (``GET /version``); :class:`ApiError` on failure."""
    info = await http.send_json("GET", "/version", timeout_s=request_timeout_s)
    try:
        return minor_in_effect(info)
    except ValueError as err:
        raise ApiError(f"GET /version: {err}") from err


async def probe_capabilities(
    http: ApiTransport,
    driver_name: str,
    node_name: str,
    server_minor: int | None = None,
    *,
    request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S,
) -> Capabilities:
    """Dry-run probe ResourceSlices and return what the API server keeps.

    ``server_minor`` None reads ``/version`` first. Errors:

    * :class:`ApiUnavailableError` (transport, 429, 5xx) is raised: retry later;
    * :class:`ApiNotFoundError` is raised: resource.k8s.io/v1 is not served
      (Kubernetes older than 1.34), so no slice can be published at all;
    * any other refusal (403 Forbidden, 422 Invalid, 409, 400) of the probe
      falls back, with a warning, to every gated feature off
      (``Capabilities()``; ``counters_in_own_slice`` from the version when
      known, True otherwise), the shape every release accepts. A refused
      ``/version`` just leaves the version unknown.
    """
    if server_minor is None:
        try:
            server_minor = await read_server_minor(http, request_timeout_s=request_timeout_s)
        except (ApiUnavailableError, ApiNotFoundError):
            raise
        except ApiError as err:
            log.warning("cannot read the API server version (%s); probing as for 1.35+", err)

    answers = []
    try:
        for body in probe_slices(driver_name, node_name, server_minor):
            answers.append(
                await http.send_json(
                    "POST",
                    SLICES_PATH,
                    body,
                    query=[("dryRun", "All"), ("fieldManager", FIELD_MANAGER)],
                    what=f"POST resourceslices {body['metadata']['name']} (dry run)",
                    timeout_s=request_timeout_s,
                )
            )
    except (ApiUnavailableError, ApiNotFoundError):
        raise
    except ApiError as err:
        fallback = Capabilities(counters_in_own_slice=server_minor is None or server_minor >= 35)
        log.warning(
            "the capability probe (dry-run ResourceSlice create) was refused: %s; publishing "
            "without consumable capacity, partitionable devices and device taints",
            err,
        )
        return fallback
    capabilities = capabilities_from(answers, server_minor)
    log.info(
        "API server 1.%s keeps: consumable capacity %s, partitionable devices %s, "
        "device taints %s; counters in their own slice %s",
        server_minor if server_minor is not None else "?",
        capabilities.consumable_capacity,
        capabilities.partitionable_devices,
        capabilities.device_taints,
        capabilities.counters_in_own_slice,
    )
    return capabilities
