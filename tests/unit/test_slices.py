"""Inventory → ResourceSlices: layout, MIG partitions, shares, and the API's own rules.

Every built pool must pass both our ``validate_pool`` and the official OpenAPI
schema of the Kubernetes version it is built for (``kubernetes-validate``).
Inventories are built by hand here, independent of the fake backend's profiles.
"""

from __future__ import annotations

import dataclasses
import itertools
import random
from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from dra_driver.base.ids import GpuUUID, MigUUID
from dra_driver.base.quantity import format_bytes, format_count, parse_quantity
from dra_driver.core.model import GpuInfo, Inventory, MigDevice, MigPlacement, MigProfile
from dra_driver.core.settings import Allocator, Capabilities, GpuSettings, NodeSettings, Sharing
from dra_driver.core.slices import DesiredSlice, build_slices
from tests.support.slice_checks import DRIVER, NODE, assert_publishable

MIB = 2**20
GIB = 2**30
MINORS = (34, 35, 36, 37)

# 1.34 with DRAPartitionableDevices and DRAConsumableCapacity switched on by hand:
# counter sets live in the slice of the devices that consume them.
LEGACY_WITH_GATES = Capabilities(
    consumable_capacity=True,
    partitionable_devices=True,
    device_taints=True,
    counters_in_own_slice=False,
)


# --- inventories ----------------------------------------------------------------------


def _profile(
    profile_id: int,
    name: str,
    *,
    compute: int,
    memory_mib: int,
    sms: int,
    starts: Sequence[int],
    size: int,
    media: bool = False,
) -> MigProfile:
    return MigProfile(
        id=profile_id,
        name=name,
        compute_slices=compute,
        memory_mib=memory_mib,
        multiprocessors=sms,
        copy_engines=compute,
        decoders=max(1, compute),
        encoders=compute if compute == 7 else 0,
        jpeg_engines=1 if media or compute == 7 else 0,
        ofa_engines=1 if media or compute == 7 else 0,
        placements=tuple(MigPlacement(start, size) for start in starts),
    )


HOPPER_PROFILES = (
    _profile(19, "1g.10gb", compute=1, memory_mib=9856, sms=16, starts=range(7), size=1),
    _profile(
        20, "1g.10gb+me", compute=1, memory_mib=9856, sms=16, starts=range(7), size=1, media=True
    ),
    _profile(15, "1g.20gb", compute=1, memory_mib=19968, sms=16, starts=(0, 2, 4, 6), size=2),
    _profile(14, "2g.20gb", compute=2, memory_mib=19968, sms=32, starts=(0, 2, 4), size=2),
    _profile(9, "3g.40gb", compute=3, memory_mib=40192, sms=60, starts=(0, 4), size=4),
    _profile(5, "4g.40gb", compute=4, memory_mib=40192, sms=64, starts=(0,), size=4),
    _profile(0, "7g.80gb", compute=7, memory_mib=80384, sms=132, starts=(0,), size=8),
)
PLACEMENTS = sum(len(p.placements) for p in HOPPER_PROFILES)  # 7+7+4+3+2+1+1 = 25


def h100(index: int = 0, **changes: Any) -> GpuInfo:
    gpu = GpuInfo(
        index=index,
        uuid=GpuUUID(f"GPU-00000000-0000-0000-0000-{index:012d}"),
        product_name="NVIDIA H100 80GB HBM3",
        memory_bytes=81559 * MIB,
        minor=index,
        architecture="hopper",
        cuda_compute_capability="9.0",
        driver_version="580.65.06",
        cuda_driver_version="13.0",
        pci_bus_id=f"0000:{0x18 + index:02x}:00.0",
        mig_capable=True,
    )
    return dataclasses.replace(gpu, **changes)


def h100_mig(index: int = 0, *existing: MigDevice) -> GpuInfo:
    return h100(
        index,
        mig_enabled=True,
        mig_pending=True,
        mig_profiles=HOPPER_PROFILES,
        mig_devices=tuple(existing),
    )


def existing_3g(start: int = 0) -> MigDevice:
    return MigDevice(
        uuid=MigUUID(f"MIG-aaaaaaaa-0000-0000-0000-00000000000{start}"),
        gi_id=1 + start,
        ci_id=0,
        profile_id=9,
        profile_name="3g.40gb",
        placement=MigPlacement(start, 4),
        memory_mib=40192,
    )


def build(
    *gpus: GpuInfo,
    caps: Capabilities | None = None,
    settings: NodeSettings | None = None,
) -> list[DesiredSlice]:
    return build_slices(
        Inventory(gpus=tuple(gpus)),
        driver_name=DRIVER,
        node_name=NODE,
        settings=settings or NodeSettings(),
        capabilities=caps or Capabilities.for_version(36),
    )


def devices_of(slices: Sequence[DesiredSlice]) -> dict[str, Mapping[str, Any]]:
    return {d["name"]: d for s in slices for d in s.spec.get("devices", ())}


def counter_sets_of(slices: Sequence[DesiredSlice]) -> dict[str, Mapping[str, Any]]:
    return {c["name"]: c for s in slices for c in s.spec.get("sharedCounters", ())}


def attr(device: Mapping[str, Any], name: str) -> Any:
    (value,) = device["attributes"][name].values()
    return value


def memory_slices(device: Mapping[str, Any]) -> set[int]:
    (entry,) = device["consumesCounters"]
    return {
        int(name.removeprefix("memory-slice-"))
        for name in entry["counters"]
        if name.startswith("memory-slice-")
    }


# --- whole GPUs -----------------------------------------------------------------------


@pytest.mark.parametrize("minor", MINORS)
def test_h100_mig_off_shared_by_mps(minor: int) -> None:
    caps = Capabilities.for_version(minor)
    slices = build(h100(), caps=caps)

    assert [s.key for s in slices] == ["devices-0"]
    spec = slices[0].spec
    assert spec["driver"] == DRIVER
    assert spec["nodeName"] == NODE
    assert spec["pool"] == {"name": NODE, "generation": 0, "resourceSliceCount": 1}
    assert "sharedCounters" not in spec
    (device,) = spec["devices"]
    assert device["name"] == h100().device_name == "gpu-0"
    assert {name: attr(device, name) for name in device["attributes"]} == {
        "type": "gpu",
        "uuid": "GPU-00000000-0000-0000-0000-000000000000",
        "index": 0,
        "productName": "NVIDIA H100 80GB HBM3",
        "architecture": "hopper",
        "cudaComputeCapability": "9.0.0",
        "driverVersion": "580.65.6",
        "cudaDriverVersion": "13.0.0",
        "resource.kubernetes.io/pciBusID": "0000:18:00.0",
        "migCapable": True,
        "sharing": "mps",
        "allocator": "scheduler",
        **(
            {}
            if caps.consumable_capacity
            else {
                "memoryUsable": 81559 * MIB,
                "memoryMin": 256 * MIB,
                "memoryStep": 256 * MIB,
                "memoryDefault": 81408 * MIB,
                "clientsMax": 48,
            }
        ),
    }
    assert device["attributes"]["cudaComputeCapability"] == {"version": "9.0.0"}
    assert device["attributes"]["index"] == {"int": 0}
    assert device["attributes"]["migCapable"] == {"bool": True}
    if caps.consumable_capacity:  # 1.36+
        assert device["allowMultipleAllocations"] is True
        assert device["capacity"] == {
            "memory": {
                "value": "81559Mi",
                "requestPolicy": {
                    "default": "81408Mi",
                    "validRange": {"min": "256Mi", "step": "256Mi"},
                },
            },
            "computePercent": {
                "value": "100",
                "requestPolicy": {"default": "0", "validRange": {"min": "0", "step": "1"}},
            },
            "clients": {
                "value": "48",
                "requestPolicy": {"default": "1", "validRange": {"min": "1", "step": "1"}},
            },
        }
    else:  # 1.34, 1.35: the cluster would drop the fields
        assert "allowMultipleAllocations" not in device
        assert device["capacity"] == {"memory": {"value": "81559Mi"}}
    assert_publishable(slices, caps, minor)


@pytest.mark.parametrize("minor", MINORS)
def test_exclusive_gpu_is_a_plain_device(minor: int) -> None:
    caps = Capabilities.for_version(minor)
    settings = NodeSettings(default=GpuSettings(sharing=Sharing.EXCLUSIVE))
    (device,) = devices_of(build(h100(), caps=caps, settings=settings)).values()
    assert "allowMultipleAllocations" not in device
    assert device["capacity"] == {"memory": {"value": "81559Mi"}}
    assert attr(device, "sharing") == "exclusive"
    assert not {"memoryUsable", "memoryDefault", "clientsMax"} & set(device["attributes"])
    assert_publishable(build(h100(), caps=caps, settings=settings), caps, minor)


def test_per_gpu_settings_by_index_and_uuid() -> None:
    gpus = (h100(0), h100(1), h100(2))
    settings = NodeSettings(
        default=GpuSettings(sharing=Sharing.MPS),
        per_gpu={
            "1": GpuSettings(sharing=Sharing.EXCLUSIVE, allocator=Allocator.CONTROLLER),
            gpus[2].uuid: GpuSettings(sharing=Sharing.TIMESLICING),
        },
    )
    devices = devices_of(build(*gpus, settings=settings))
    assert [attr(devices[f"gpu-{i}"], "sharing") for i in range(3)] == [
        "mps",
        "exclusive",
        "timeslicing",
    ]
    assert attr(devices["gpu-1"], "allocator") == "controller"
    assert devices["gpu-0"]["allowMultipleAllocations"] is True
    assert "allowMultipleAllocations" not in devices["gpu-1"]
    assert devices["gpu-2"]["allowMultipleAllocations"] is True


@pytest.mark.parametrize(
    ("total_mib", "reserve", "step_mib", "value", "default"),
    [
        (81559, 0, 256, "81559Mi", "81408Mi"),
        (81559, GIB, 256, "80535Mi", "80384Mi"),
        (81920, 0, 256, "80Gi", "80Gi"),
        (81920, 0, 1024, "80Gi", "80Gi"),
        (40960, 512 * MIB, 1024, "40448Mi", "39Gi"),
        (143771, 3 * GIB, 512, "140699Mi", "137Gi"),  # 137Gi = 140288Mi
        (512, 0, 256, "512Mi", "512Mi"),  # exactly two steps: the smallest shareable GPU
    ],
    ids=[
        "h100-no-reserve",
        "h100-1gib-reserve",
        "aligned",
        "gib-step",
        "half-gib",
        "h200",
        "two-steps",
    ],
)
def test_memory_reserve_and_rounding(
    total_mib: int, reserve: int, step_mib: int, value: str, default: str
) -> None:
    settings = NodeSettings(memory_reserve_bytes=reserve, memory_step_bytes=step_mib * MIB)
    slices = build(h100(memory_bytes=total_mib * MIB), settings=settings)
    (device,) = devices_of(slices).values()
    memory = device["capacity"]["memory"]
    assert memory["value"] == value
    assert memory["requestPolicy"]["default"] == default
    step = parse_quantity(memory["requestPolicy"]["validRange"]["step"])
    assert step == step_mib * MIB
    usable = parse_quantity(memory["value"])
    granted = parse_quantity(memory["requestPolicy"]["default"])
    assert usable - step < granted <= usable and granted % step == 0
    assert usable == total_mib * MIB - reserve
    assert_publishable(slices, Capabilities.for_version(36), 36)


@pytest.mark.parametrize(
    "settings",
    [
        NodeSettings(memory_step_bytes=60 * GIB),  # min + step > usable
        NodeSettings(memory_reserve_bytes=80 * GIB),  # almost nothing left
        NodeSettings(memory_reserve_bytes=90 * GIB),  # reserve above the total
        NodeSettings(max_clients=1),  # clients min + step would exceed the value
        NodeSettings(memory_step_bytes=0),
    ],
    ids=[
        "step-too-big",
        "reserve-leaves-too-little",
        "reserve-above-total",
        "one-client",
        "no-step",
    ],
)
@pytest.mark.parametrize("minor", (35, 36))
def test_unshareable_gpu_falls_back_to_exclusive(settings: NodeSettings, minor: int) -> None:
    caps = Capabilities.for_version(minor)
    slices = build(h100(), settings=settings, caps=caps)
    (device,) = devices_of(slices).values()
    assert "allowMultipleAllocations" not in device
    assert device["capacity"] == {"memory": {"value": "81559Mi"}}
    assert attr(device, "sharing") == "exclusive"
    assert "memoryDefault" not in device["attributes"]
    assert_publishable(slices, caps, minor)


def test_consumable_capacity_dropped_carries_policy_as_int_attributes() -> None:
    caps = dataclasses.replace(Capabilities.for_version(36), consumable_capacity=False)
    settings = NodeSettings(memory_reserve_bytes=GIB, memory_step_bytes=512 * MIB, max_clients=16)
    (device,) = devices_of(build(h100(), caps=caps, settings=settings)).values()
    assert "allowMultipleAllocations" not in device
    assert device["capacity"] == {"memory": {"value": "81559Mi"}}
    assert attr(device, "sharing") == "mps"
    policy = ("memoryUsable", "memoryMin", "memoryStep", "memoryDefault", "clientsMax")
    assert {name: device["attributes"][name] for name in policy} == {
        "memoryUsable": {"int": 80535 * MIB},
        "memoryMin": {"int": 512 * MIB},
        "memoryStep": {"int": 512 * MIB},
        "memoryDefault": {"int": 80384 * MIB},
        "clientsMax": {"int": 16},
    }
    assert_publishable(build(h100(), caps=caps, settings=settings), caps, 36)


def test_versions_normalised_and_bad_or_empty_values_left_out() -> None:
    gpu = h100(
        driver_version="570.86.10",
        cuda_driver_version="v12.8",
        cuda_compute_capability="N/A",
        pci_bus_id="",
        architecture="",
        product_name="NVIDIA " + "X" * 80,
    )
    (device,) = devices_of(build(gpu)).values()
    attributes = device["attributes"]
    assert attributes["driverVersion"] == {"version": "570.86.10"}
    assert attributes["cudaDriverVersion"] == {"version": "12.8.0"}
    assert "cudaComputeCapability" not in attributes
    assert "resource.kubernetes.io/pciBusID" not in attributes
    assert "architecture" not in attributes
    assert len(attr(device, "productName")) == 64
    assert_publishable(build(gpu), Capabilities.for_version(36), 36)


def test_many_whole_gpus_share_slices_of_64() -> None:
    gpus = [h100(i) for i in range(70)]
    slices = build(*gpus)
    assert [s.key for s in slices] == ["devices-0", "devices-1"]
    assert [len(s.spec["devices"]) for s in slices] == [64, 6]
    assert all(s.spec["pool"]["resourceSliceCount"] == 2 for s in slices)
    assert list(devices_of(slices)) == [f"gpu-{i}" for i in range(70)]
    assert_publishable(slices, Capabilities.for_version(36), 36)


def test_empty_inventory_publishes_nothing() -> None:
    assert build() == []


# --- MIG ------------------------------------------------------------------------------


def test_mig_gpu_one_device_per_placement() -> None:
    caps = Capabilities.for_version(36)
    slices = build(h100_mig(0), caps=caps)
    assert [s.key for s in slices] == ["counters-0", "gpu-0"]
    counters_slice, devices_slice = (s.spec for s in slices)
    assert "devices" not in counters_slice
    assert "sharedCounters" not in devices_slice

    (counter_set,) = counters_slice["sharedCounters"]
    assert counter_set == {
        "name": "gpu-0-counters",
        "counters": {
            **{f"memory-slice-{i}": {"value": "1"} for i in range(8)},
            "compute-slices": {"value": "7"},
            "copy-engines": {"value": "7"},
            "decoders": {"value": "7"},
            "encoders": {"value": "7"},
            "jpeg-engines": {"value": "1"},
            "ofa-engines": {"value": "1"},
        },
    }

    devices = devices_of(slices)
    assert "gpu-0" not in devices, "a MIG GPU is never also a whole device"
    expected = {
        f"gpu-0-mig-{p.name.replace('.', '').replace('+', '')}-{p.id}-{pl.start}": (p, pl)
        for p in HOPPER_PROFILES
        for pl in p.placements
    }
    assert len(devices) == len(expected) == PLACEMENTS == 25
    assert set(devices) == set(expected)
    assert "gpu-0-mig-1g10gbme-20-3" in devices
    for name, (profile, placement) in expected.items():
        device = devices[name]
        assert len(name) <= 63
        assert "allowMultipleAllocations" not in device
        (entry,) = device["consumesCounters"]
        assert entry["counterSet"] == "gpu-0-counters"
        assert memory_slices(device) == set(
            range(placement.start, placement.start + placement.size)
        )
        assert entry["counters"]["compute-slices"] == {"value": str(profile.compute_slices)}
        assert all(c["value"] != "0" for c in entry["counters"].values()), "zero counters omitted"
        assert ("encoders" in entry["counters"]) == (profile.encoders > 0)
        assert device["capacity"] == {
            "memory": {"value": f"{profile.memory_mib}Mi"},
            "multiprocessors": {"value": str(profile.multiprocessors)},
            "copyEngines": {"value": str(profile.copy_engines)},
            "decoders": {"value": str(profile.decoders)},
            "encoders": {"value": str(profile.encoders)},
            "jpegEngines": {"value": str(profile.jpeg_engines)},
            "ofaEngines": {"value": str(profile.ofa_engines)},
        }
        assert {k: attr(device, k) for k in ("type", "profile", "parentIndex", "sharing")} == {
            "type": "mig",
            "profile": profile.name,
            "parentIndex": 0,
            "sharing": "exclusive",
        }
        assert attr(device, "parentUUID") == h100().uuid
        assert attr(device, "static") is False
        assert "migUUID" not in device["attributes"]
        assert device["attributes"]["driverVersion"] == {"version": "580.65.6"}
        assert attr(device, "resource.kubernetes.io/pciBusID") == "0000:18:00.0"
    assert_publishable(slices, caps, 36)


def test_existing_instance_blocks_overlapping_placements() -> None:
    caps = Capabilities.for_version(37)
    slices = build(h100_mig(0, existing_3g(0)), caps=caps)
    devices = devices_of(slices)

    static = devices["gpu-0-mig-3g40gb-9-0"]
    assert attr(static, "static") is True
    assert attr(static, "migUUID") == existing_3g(0).uuid
    assert memory_slices(static) == {0, 1, 2, 3}
    assert static["consumesCounters"][0]["counters"]["compute-slices"] == {"value": "3"}
    assert static["capacity"]["memory"] == {"value": "40192Mi"}

    dynamic = {name: d for name, d in devices.items() if not attr(d, "static")}
    assert all(memory_slices(d) <= {4, 5, 6, 7} for d in dynamic.values())
    assert set(dynamic) == {
        "gpu-0-mig-1g10gb-19-4",
        "gpu-0-mig-1g10gb-19-5",
        "gpu-0-mig-1g10gb-19-6",
        "gpu-0-mig-1g10gbme-20-4",
        "gpu-0-mig-1g10gbme-20-5",
        "gpu-0-mig-1g10gbme-20-6",
        "gpu-0-mig-1g20gb-15-4",
        "gpu-0-mig-1g20gb-15-6",
        "gpu-0-mig-2g20gb-14-4",
        "gpu-0-mig-3g40gb-9-4",
    }
    assert_publishable(slices, caps, 37)


@pytest.mark.parametrize("minor", (34, 35))
def test_without_partitionable_devices_only_existing_instances(minor: int) -> None:
    caps = Capabilities.for_version(minor)
    slices = build(h100_mig(0, existing_3g(0), existing_3g(4)), h100(1), caps=caps)
    assert [s.key for s in slices] == ["devices-0"]
    devices = devices_of(slices)
    assert list(devices) == ["gpu-0-mig-3g40gb-9-0", "gpu-0-mig-3g40gb-9-4", "gpu-1"]
    for name in ("gpu-0-mig-3g40gb-9-0", "gpu-0-mig-3g40gb-9-4"):
        assert "consumesCounters" not in devices[name]
        assert attr(devices[name], "static") is True
        assert attr(devices[name], "type") == "mig"
    assert_publishable(slices, caps, minor)


@pytest.mark.parametrize("minor", (34, 35))
def test_mig_gpu_without_instances_or_partitions_publishes_nothing(minor: int) -> None:
    assert build(h100_mig(0), caps=Capabilities.for_version(minor)) == []


def test_legacy_1_34_with_gates_keeps_counters_beside_devices() -> None:
    slices = build(h100_mig(0, existing_3g(4)), h100_mig(1), h100(2), caps=LEGACY_WITH_GATES)
    assert [s.key for s in slices] == ["devices-0", "gpu-0", "gpu-1"]
    for index in (0, 1):
        spec = slices[1 + index].spec
        (counter_set,) = spec["sharedCounters"]
        assert counter_set["name"] == f"gpu-{index}-counters"
        assert {d["consumesCounters"][0]["counterSet"] for d in spec["devices"]} == {
            counter_set["name"]
        }
    assert len(slices[2].spec["devices"]) == PLACEMENTS
    assert_publishable(slices, LEGACY_WITH_GATES, 34)


def test_sixteen_mig_gpus_split_counter_sets_over_two_slices() -> None:
    caps = Capabilities.for_version(36)
    gpus = [h100_mig(i) for i in range(16)] + [h100(16), h100(17)]
    slices = build(*gpus, caps=caps)
    keys = [s.key for s in slices]
    assert keys == ["counters-0", "counters-1", "devices-0"] + [f"gpu-{i}" for i in range(16)]
    assert [len(s.spec["sharedCounters"]) for s in slices[:2]] == [8, 8]
    assert [c["name"] for s in slices[:2] for c in s.spec["sharedCounters"]] == [
        f"gpu-{i}-counters" for i in range(16)
    ]
    assert [d["name"] for d in slices[2].spec["devices"]] == ["gpu-16", "gpu-17"]
    assert len(slices) == 19
    assert {s.spec["pool"]["resourceSliceCount"] for s in slices} == {19}
    assert len(devices_of(slices)) == 16 * PLACEMENTS + 2
    assert_publishable(slices, caps, 36)


def test_mixed_node_names_are_unique_and_match_gpu_device_name() -> None:
    gpus = (h100(0), h100_mig(1, existing_3g(0)), h100(2, mig_capable=False))
    slices = build(*gpus)
    devices = devices_of(slices)
    assert gpus[0].device_name in devices and gpus[2].device_name in devices
    assert gpus[1].device_name not in devices
    assert attr(devices["gpu-2"], "migCapable") is False
    assert_publishable(slices, Capabilities.for_version(36), 36)


def test_static_instance_of_unknown_profile_consumes_its_memory_slices() -> None:
    odd = MigDevice(
        uuid=MigUUID("MIG-bbbb"),
        gi_id=7,
        ci_id=0,
        profile_id=99,
        profile_name="1g.12gb+gfx",
        placement=MigPlacement(7, 1),
        memory_mib=11000,
    )
    slices = build(h100_mig(0, odd))
    device = devices_of(slices)["gpu-0-mig-1g12gbgfx-99-7"]
    assert device["consumesCounters"][0]["counters"] == {"memory-slice-7": {"value": "1"}}
    assert device["capacity"] == {"memory": {"value": "11000Mi"}}
    assert "gpu-0-mig-7g80gb-0-0" not in devices_of(slices)
    assert_publishable(slices, Capabilities.for_version(36), 36)


# --- determinism and quantity format ---------------------------------------------------


def test_deterministic_whatever_the_discovery_order() -> None:
    gpus = [h100_mig(0, existing_3g(4)), h100(1), h100_mig(2), h100(3)]
    first = build(*gpus)
    assert build(*gpus) == first
    rng = random.Random(7)
    for _ in range(3):
        shuffled = [
            dataclasses.replace(
                gpu, mig_profiles=tuple(rng.sample(gpu.mig_profiles, len(gpu.mig_profiles)))
            )
            for gpu in rng.sample(gpus, len(gpus))
        ]
        assert build(*shuffled) == first


@pytest.mark.parametrize(
    ("amount", "text"),
    [
        (0, "0"),
        (1, "1"),
        (1023, "1023"),
        (1024, "1Ki"),
        (1536, "1536"),
        (2048000, "2000Ki"),
        (256 * MIB, "256Mi"),
        (81408 * MIB, "81408Mi"),
        (80 * GIB, "80Gi"),
        (85520809000, "85520809k"),
        (85520809001, "85520809001"),
        (2**60, "1Ei"),
        (2**70, "1024Ei"),
    ],
)
def test_format_bytes_is_canonical(amount: int, text: str) -> None:
    assert format_bytes(amount) == text
    assert parse_quantity(text) == amount


@pytest.mark.parametrize(
    ("count", "text"),
    [(0, "0"), (7, "7"), (48, "48"), (100, "100"), (1000, "1k"), (1500, "1500"), (2 * 10**6, "2M")],
)
def test_format_count_is_canonical(count: int, text: str) -> None:
    assert format_count(count) == text
    assert parse_quantity(text) == count


def test_all_capability_combinations_publish_valid_pools() -> None:
    gpus = (h100_mig(0, existing_3g(0)), h100(1), h100_mig(2))
    for flags in itertools.product((False, True), repeat=4):
        caps = Capabilities(*flags)
        minor = 36 if caps.counters_in_own_slice else 34
        slices = build(*gpus, caps=caps)
        assert slices, caps
        assert_publishable(slices, caps, minor)
