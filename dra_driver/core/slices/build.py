"""Inventory + node settings + cluster capabilities → the ResourceSlices we publish (pure).

One pool per node (pool name = node name, ``spec.nodeName`` set). The
publisher (``k8s/publisher.py``) gives each :class:`DesiredSlice` its
metadata and the pool's generation; everything else is decided here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from dra_driver.base.quantity import format_bytes, format_count
from dra_driver.base.semver import normalise_version
from dra_driver.core.model import GpuInfo, Inventory, MigDevice, MigPlacement, MigProfile
from dra_driver.core.published import free_placements, mig_device_name
from dra_driver.core.settings import Allocator, Capabilities, GpuSettings, NodeSettings, Sharing

_T = TypeVar("_T")


@dataclass(frozen=True)
class DesiredSlice:
    """One ResourceSlice as we want it, before the publisher names and numbers it."""

    key: str
    """Stable within the node across rebuilds (e.g. ``gpu-0``, ``counters-0``); the
    publisher derives the object name from node, driver and key."""
    spec: Mapping[str, Any]
    """``ResourceSlice.spec`` as JSON (resource.k8s.io/v1). ``pool.generation`` is 0
    here; the publisher sets it. ``pool.resourceSliceCount`` is already right."""


# --- builder --------------------------------------------------------------------------

DEVICES_PER_SLICE = 64
"""Devices per slice. 128 would be allowed for plain devices, but 64 is the limit once a
device has taints or consumes counters (1.35+), so a later health taint never forces a
re-layout."""
COUNTER_SETS_PER_SLICE = 8
"""1.35+: at most 8 counter sets in one slice."""
MAX_STRING = 64
"""Longest ``string`` attribute the API accepts; longer NVML strings are cut."""
MIB = 2**20
PCI_BUS_ID = "resource.kubernetes.io/pciBusID"
"""The standard attribute for a device's PCI address."""

_MIG_COUNTERS = (
    # (counter name, MigProfile field, capacity name)
    ("compute-slices", "compute_slices", None),
    ("copy-engines", "copy_engines", "copyEngines"),
    ("decoders", "decoders", "decoders"),
    ("encoders", "encoders", "encoders"),
    ("jpeg-engines", "jpeg_engines", "jpegEngines"),
    ("ofa-engines", "ofa_engines", "ofaEngines"),
)


def build_slices(
    inventory: Inventory,
    *,
    driver_name: str,
    node_name: str,
    settings: NodeSettings,
    capabilities: Capabilities,
    taints: Mapping[str, Sequence[Mapping[str, Any]]] | None = None,
) -> list[DesiredSlice]:
    """The node's pool (name = node name) as ResourceSlices; deterministic.

    ``taints`` maps device names to their device taints (device health,
    :func:`~dra_driver.core.health.device_taints`); they are published only
    where the cluster keeps taints (``capabilities.device_taints``), and
    never change the layout: slices hold at most 64 devices either way.

    Layout, in this order:

    * ``counters-<k>`` (1.35+, partitionable devices): the counter sets of the
      MIG GPUs, at most 8 per slice, no devices.
    * ``devices-<k>``: every device that consumes no counters (whole GPUs, and
      pre-existing MIG instances when the cluster has no partitionable devices),
      at most 64 per slice, in GPU-index order.
    * ``gpu-<index>`` (partitionable devices): one slice per MIG GPU with its MIG
      partitions (overflow beyond 64 in ``gpu-<index>-part-<k>``); before 1.35
      it also holds that GPU's counter set.

    A GPU that has nothing to publish (MIG on, no partitionable devices and no
    MIG instances) contributes no slice; an empty inventory gives no slices.
    """
    plain: list[dict[str, Any]] = []
    mig_gpus: list[tuple[GpuInfo, dict[str, Any], list[dict[str, Any]]]] = []
    for gpu in sorted(inventory.gpus, key=lambda g: g.index):
        gpu_settings = settings.for_gpu(gpu.index, gpu.uuid)
        if not gpu.mig_enabled:
            plain.append(_whole_gpu(gpu, gpu_settings, settings, capabilities))
        elif capabilities.partitionable_devices:
            partitioned = _partitioned_gpu(gpu, gpu_settings, settings, capabilities)
            if partitioned is not None:
                mig_gpus.append((gpu, *partitioned))
        else:
            instances = sorted(
                _static_mig_devices(gpu, gpu_settings, None, settings, capabilities),
                key=lambda i: i[0],
            )
            plain.extend(device for _, device in instances)

    if taints and capabilities.device_taints:
        _add_taints([*plain, *(d for _, _, devices in mig_gpus for d in devices)], taints)

    bodies: list[tuple[str, dict[str, Any]]] = []
    split = capabilities.counters_in_own_slice
    if split:
        sets = [counter_set for _, counter_set, _ in mig_gpus]
        for k, chunk in enumerate(_chunks(sets, COUNTER_SETS_PER_SLICE)):
            bodies.append((f"counters-{k}", {"sharedCounters": chunk}))
    for k, chunk in enumerate(_chunks(plain, DEVICES_PER_SLICE)):
        bodies.append((f"devices-{k}", {"devices": chunk}))
    for gpu, counter_set, devices in mig_gpus:
        if not split:
            # 1.34: a device may only consume counters of its own slice.
            bodies.append(
                (f"gpu-{gpu.index}", {"sharedCounters": [counter_set], "devices": devices})
            )
            continue
        for k, chunk in enumerate(_chunks(devices, DEVICES_PER_SLICE)):
            key = f"gpu-{gpu.index}" if k == 0 else f"gpu-{gpu.index}-part-{k}"
            bodies.append((key, {"devices": chunk}))

    pool = {"name": node_name, "generation": 0, "resourceSliceCount": len(bodies)}
    return [
        DesiredSlice(
            key=key,
            spec={"driver": driver_name, "pool": dict(pool), "nodeName": node_name, **body},
        )
        for key, body in bodies
    ]


def _add_taints(
    devices: list[dict[str, Any]], taints: Mapping[str, Sequence[Mapping[str, Any]]]
) -> None:
    for device in devices:
        found = taints.get(device["name"])
        if found:
            device["taints"] = [dict(taint) for taint in found]


def _chunks(items: list[_T], size: int) -> list[list[_T]]:
    return [items[start : start + size] for start in range(0, len(items), size)]


# --- whole GPUs -----------------------------------------------------------------------


@dataclass(frozen=True)
class SharePolicy:
    usable: int
    step: int
    default: int
    clients: int


def _share_policy(gpu: GpuInfo, settings: NodeSettings) -> SharePolicy | None:
    """The memory policy of a shared GPU, or None when the GPU cannot be shared.

    The API requires ``min + step ≤ value`` and ``(default - min) % step == 0``
    (dra-facts 5.2). With ``min = step`` the default is the usable memory
    rounded down to a whole number of steps. A GPU whose usable memory is under
    two steps, or a node allowing fewer than two clients, is published exclusive.
    """
    step = settings.memory_step_bytes
    usable = gpu.memory_bytes - settings.memory_reserve_bytes
    if step <= 0 or usable < 2 * step or settings.max_clients < 2:
        return None
    return SharePolicy(
        usable=usable, step=step, default=usable // step * step, clients=settings.max_clients
    )


def _whole_gpu(
    gpu: GpuInfo, gpu_settings: GpuSettings, settings: NodeSettings, capabilities: Capabilities
) -> dict[str, Any]:
    policy = None
    if gpu_settings.sharing in (Sharing.MPS, Sharing.TIMESLICING):
        policy = _share_policy(gpu, settings)
    one_namespace = gpu_settings.sharing is Sharing.MPS and settings.shares_one_namespace(
        gpu_settings, mig=False
    )
    if one_namespace and gpu_settings.allocator is Allocator.SCHEDULER:
        # The kube-scheduler cannot see namespaces: its shares could put two tenants
        # on a daemon that cannot keep them apart. Whole GPUs only on that path.
        policy = None
    sharing = gpu_settings.sharing if policy is not None else Sharing.EXCLUSIVE
    attributes: dict[str, Any] = {
        "type": {"string": "gpu"},
        "uuid": {"string": _cut(gpu.uuid)},
        "index": {"int": gpu.index},
        **_hardware_attributes(gpu),
        "migCapable": {"bool": gpu.mig_capable},
        "sharing": {"string": str(sharing)},
        "allocator": {"string": str(gpu_settings.allocator)},
        **_tenancy_attribute(sharing, gpu_settings, settings, mig=False),
    }
    device: dict[str, Any] = {"name": gpu.device_name}
    if policy is not None and capabilities.consumable_capacity and not one_namespace:
        device["allowMultipleAllocations"] = True
        device["attributes"] = attributes
        device["capacity"] = _share_capacity(policy)
        return device
    if policy is not None:
        # The cluster drops consumable capacity, or only our controller may share the
        # GPU (it keeps a one-namespace daemon to one namespace): publish an ordinary
        # device and carry the policy as attributes for the controller (ARCHITECTURE 3.2).
        attributes |= {
            "memoryUsable": {"int": policy.usable},
            "memoryMin": {"int": policy.step},
            "memoryStep": {"int": policy.step},
            "memoryDefault": {"int": policy.default},
            "clientsMax": {"int": policy.clients},
        }
    device["attributes"] = attributes
    device["capacity"] = {"memory": {"value": format_bytes(gpu.memory_bytes)}}
    return device


TENANCY_ATTRIBUTE = "mpsTenancy"
"""On an MPS-shared device whose daemon cannot keep clients apart: ``namespace`` (the
controller places only one namespace's claims on it) or ``cooperative``."""


def _tenancy_attribute(
    sharing: Sharing, gpu_settings: GpuSettings, settings: NodeSettings, *, mig: bool
) -> dict[str, Any]:
    if sharing is not Sharing.MPS or settings.daemon_keeps_tenants_apart(mig=mig):
        return {}
    return {TENANCY_ATTRIBUTE: {"string": str(gpu_settings.tenancy)}}


def _share_capacity(policy: SharePolicy) -> dict[str, Any]:
    """The consumable capacities of an MPS-shared device (a GPU or a MIG instance)."""
    return {
        "memory": {
            "value": format_bytes(policy.usable),
            "requestPolicy": {
                # Default = all of it: a claim naming no amount gets the whole GPU.
                "default": format_bytes(policy.default),
                "validRange": {
                    "min": format_bytes(policy.step),
                    "step": format_bytes(policy.step),
                },
            },
        },
        "computePercent": {
            # An MPS cap, not a guarantee: a share that names none takes 0.
            "value": "100",
            "requestPolicy": {"default": "0", "validRange": {"min": "0", "step": "1"}},
        },
        "clients": {
            # Each share is one MPS client.
            "value": format_count(policy.clients),
            "requestPolicy": {"default": "1", "validRange": {"min": "1", "step": "1"}},
        },
    }


# --- MIG ------------------------------------------------------------------------------

MPS_MAX_CLIENTS = 48
"""Clients of one MPS server on a whole GPU (Volta and newer). Inside a MIG instance
the limit is "lowered proportionally to the Compute Instance size" (NVIDIA MIG user
guide, "MIG with CUDA MPS")."""


def mig_share_policy(
    gpu: GpuInfo, profile: MigProfile | None, memory_mib: int, settings: NodeSettings
) -> SharePolicy | None:
    """The share policy of an MPS-shared MIG instance, or None when it cannot be shared.

    The instance's own memory is shared (no reserve: that is per GPU), in steps of
    the node's ``memoryStep``; ``clients`` is the node's ``maxClients`` bounded by
    48 * (the instance's compute slices / the GPU's). Unknown profile (an instance
    whose profile NVML did not list), fewer than two clients, or less than two
    steps of memory: not shareable.
    """
    step = settings.memory_step_bytes
    usable = memory_mib * MIB
    gpu_slices = max((p.compute_slices for p in gpu.mig_profiles), default=0)
    if profile is None or step <= 0 or usable < 2 * step or gpu_slices <= 0:
        return None
    clients = min(settings.max_clients, MPS_MAX_CLIENTS * profile.compute_slices // gpu_slices)
    if clients < 2:
        return None
    return SharePolicy(usable=usable, step=step, default=usable // step * step, clients=clients)


def _mig_policy(  # noqa: PLR0917 (private; every call site names the same six things)
    gpu: GpuInfo,
    gpu_settings: GpuSettings,
    profile: MigProfile | None,
    existing: MigDevice | None,
    settings: NodeSettings,
    capabilities: Capabilities,
) -> SharePolicy | None:
    """A MIG device's share policy when it is published as MPS-shared, else None.

    Only with consumable capacity (1.36+, or the gate on): where the API drops it
    the device stays exclusive (the controller path does not share MIG instances).
    """
    if gpu_settings.mig_sharing is not Sharing.MPS or not capabilities.consumable_capacity:
        return None
    if settings.shares_one_namespace(gpu_settings, mig=True):
        # An instance's daemon is legacy MPS, and only the kube-scheduler shares MIG
        # instances, which cannot keep one instance to one namespace: exclusive
        # instances unless the GPU's entry opts in (tenancy: cooperative).
        return None
    memory_mib = existing.memory_mib if existing is not None and existing.memory_mib else 0
    if not memory_mib and profile is not None:
        memory_mib = profile.memory_mib
    return mig_share_policy(gpu, profile, memory_mib, settings)


def _partitioned_gpu(
    gpu: GpuInfo, gpu_settings: GpuSettings, settings: NodeSettings, capabilities: Capabilities
) -> tuple[dict[str, Any], list[dict[str, Any]]] | None:
    """A MIG GPU's counter set and partition devices, or None when it has none.

    Memory slices are one counter each (value 1), so two partitions whose
    placements overlap can never be allocated together; the other counters
    hold the GPU's compute slices and engines (max over profiles). Placements
    that overlap a MIG instance that already exists are left out; the instance
    itself is published as a static device.
    """
    set_name = f"gpu-{gpu.index}-counters"
    placements = [p for profile in gpu.mig_profiles for p in profile.placements]
    placements += [existing.placement for existing in gpu.mig_devices]
    memory_slices = max((p.start + p.size for p in placements), default=0)
    counters: dict[str, Any] = {f"memory-slice-{i}": {"value": "1"} for i in range(memory_slices)}
    for counter, attr, _ in _MIG_COUNTERS:
        most = max((getattr(profile, attr) for profile in gpu.mig_profiles), default=0)
        if most > 0:
            counters[counter] = {"value": format_count(most)}

    devices = _static_mig_devices(gpu, gpu_settings, set_name, settings, capabilities)
    for profile, placement in free_placements(gpu):
        name = mig_device_name(gpu, profile.name, profile.id, placement.start)
        device = _mig_device(
            gpu,
            gpu_settings,
            name=name,
            profile_name=profile.name,
            profile=profile,
            policy=_mig_policy(gpu, gpu_settings, profile, None, settings, capabilities),
            placement_start=placement.start,
        )
        device["consumesCounters"] = [_consumption(set_name, profile, placement)]
        devices.append(((profile.id, placement.start), device))
    if not counters or not devices:
        return None
    devices.sort(key=lambda item: item[0])
    return {"name": set_name, "counters": counters}, [device for _, device in devices]


def _static_mig_devices(
    gpu: GpuInfo,
    gpu_settings: GpuSettings,
    set_name: str | None,
    settings: NodeSettings,
    capabilities: Capabilities,
) -> list[tuple[tuple[int, int], dict[str, Any]]]:
    """The MIG instances that exist now, keyed by (profile id, start) for ordering.

    With ``set_name`` they consume counters from it like the partitions do.
    """
    profiles = {profile.id: profile for profile in gpu.mig_profiles}
    devices = []
    for existing in gpu.mig_devices:
        profile = profiles.get(existing.profile_id)
        name = mig_device_name(
            gpu, existing.profile_name, existing.profile_id, existing.placement.start
        )
        device = _mig_device(
            gpu,
            gpu_settings,
            name=name,
            profile_name=existing.profile_name,
            profile=profile,
            existing=existing,
            policy=_mig_policy(gpu, gpu_settings, profile, existing, settings, capabilities),
            placement_start=existing.placement.start,
        )
        if set_name is not None:
            device["consumesCounters"] = [_consumption(set_name, profile, existing.placement)]
        devices.append(((existing.profile_id, existing.placement.start), device))
    return devices


def _mig_device(
    gpu: GpuInfo,
    gpu_settings: GpuSettings,
    *,
    name: str,
    profile_name: str,
    profile: MigProfile | None,
    existing: MigDevice | None = None,
    policy: SharePolicy | None = None,
    placement_start: int = 0,
) -> dict[str, Any]:
    """A MIG device: exclusive, or (``policy``) an MPS-shared one (see :func:`mig_share_policy`)."""
    attributes: dict[str, Any] = {
        "type": {"string": "mig"},
        "profile": {"string": _cut(profile_name)},
        "parentUUID": {"string": _cut(gpu.uuid)},
        "parentIndex": {"int": gpu.index},
        **_hardware_attributes(gpu),
        "sharing": {"string": str(Sharing.MPS if policy is not None else Sharing.EXCLUSIVE)},
        "allocator": {"string": str(gpu_settings.allocator)},
        "static": {"bool": existing is not None},
    }
    if policy is not None:  # an instance's MPS daemon is legacy: say who shares it
        attributes[TENANCY_ATTRIBUTE] = {"string": str(gpu_settings.tenancy)}
    if existing is not None:
        attributes["migUUID"] = {"string": _cut(existing.uuid)}
    memory_mib = existing.memory_mib if existing is not None else 0
    if profile is not None and not memory_mib:
        memory_mib = profile.memory_mib
    if policy is not None:
        # Every capacity of a shareable device is consumed by each share, all of it
        # when the share names none and there is no default (dra-facts 6): so the
        # engine counts are attributes here, and the capacities are the share's.
        # Where the instance sits (memory slice it starts at), so claims meant to share
        # one instance can select the same one.
        attributes["placementStart"] = {"int": placement_start}
        if profile is not None:
            attributes["multiprocessors"] = {"int": profile.multiprocessors}
            for _, attr, capacity_name in _MIG_COUNTERS:
                if capacity_name is not None:
                    attributes[capacity_name] = {"int": getattr(profile, attr)}
        return {
            "name": name,
            "allowMultipleAllocations": True,
            "attributes": attributes,
            "capacity": _share_capacity(policy),
        }
    capacity: dict[str, Any] = {"memory": {"value": format_bytes(memory_mib * MIB)}}
    if profile is not None:
        capacity["multiprocessors"] = {"value": format_count(profile.multiprocessors)}
        for _, attr, capacity_name in _MIG_COUNTERS:
            if capacity_name is not None:
                capacity[capacity_name] = {"value": format_count(getattr(profile, attr))}
    return {"name": name, "attributes": attributes, "capacity": capacity}


def _consumption(
    set_name: str, profile: MigProfile | None, placement: MigPlacement
) -> dict[str, Any]:
    """What one partition draws: its memory slices and (if the profile is known) its engines."""
    counters: dict[str, Any] = {
        f"memory-slice-{i}": {"value": "1"}
        for i in range(placement.start, placement.start + placement.size)
    }
    if profile is not None:
        for counter, attr, _ in _MIG_COUNTERS:
            amount = getattr(profile, attr)
            if amount > 0:
                counters[counter] = {"value": format_count(amount)}
    return {"counterSet": set_name, "counters": counters}


# --- attributes -----------------------------------------------------------------------


def _cut(text: str) -> str:
    return text[:MAX_STRING]


def _hardware_attributes(gpu: GpuInfo) -> dict[str, Any]:
    """Attributes a GPU and its MIG devices share; empty or unparsable values are left out."""
    attributes: dict[str, Any] = {}
    if gpu.product_name:
        attributes["productName"] = {"string": _cut(gpu.product_name)}
    if gpu.architecture:
        attributes["architecture"] = {"string": _cut(gpu.architecture)}
    for name, raw in (
        ("cudaComputeCapability", gpu.cuda_compute_capability),
        ("driverVersion", gpu.driver_version),
        ("cudaDriverVersion", gpu.cuda_driver_version),
    ):
        if not raw:
            continue
        try:
            attributes[name] = {"version": normalise_version(raw)}
        except ValueError:
            continue  # better no attribute than a slice the API server refuses
    if gpu.pci_bus_id:
        attributes[PCI_BUS_ID] = {"string": _cut(gpu.pci_bus_id)}
    return attributes
