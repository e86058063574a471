"""Strict decoding of opaque configs: every kind round-trips, every error names its field."""

from __future__ import annotations

from typing import Any

import pytest

from dra_driver.api import (
    GpuConfig,
    GpuShare,
    GpuShareGrant,
    InvalidConfigError,
    MigConfig,
    MpsConfig,
    TimeSliceInterval,
    TimeSlicingConfig,
    decode_config,
    encode_config,
    validate,
)

GI = 2**30
VERSION = "gpu.fractional.dev/v1alpha1"
SHARE_ID = "7d3f52c1-8a4e-4b9f-9c1d-2e5f6a7b8c9d"


def gpu_config(**body: Any) -> dict[str, Any]:
    return {"apiVersion": VERSION, "kind": "GpuConfig", **body}


def share(**body: Any) -> dict[str, Any]:
    return {"apiVersion": VERSION, "kind": "GpuShare", **body}


def grant(**body: Any) -> dict[str, Any]:
    fields = {"device": "gpu-0", "shareID": SHARE_ID, "memory": "10Gi", "computePercent": 25}
    return {"apiVersion": VERSION, "kind": "GpuShareGrant", **(fields | body)}


@pytest.mark.parametrize(
    ("parameters", "expected"),
    [
        pytest.param(gpu_config(), GpuConfig(), id="empty-config"),
        pytest.param(
            gpu_config(mps={"computePercent": 50, "memoryLimit": "4Gi"}),
            GpuConfig(mps=MpsConfig(compute_percent=50, memory_limit_bytes=4 * GI)),
            id="mps",
        ),
        pytest.param(
            gpu_config(mps={"memoryLimit": 1024}),
            GpuConfig(mps=MpsConfig(memory_limit_bytes=1024)),
            id="mps-integer-quantity",
        ),
        pytest.param(gpu_config(mps={}), GpuConfig(mps=MpsConfig()), id="mps-empty"),
        pytest.param(
            gpu_config(mps={"memoryLimit": "8Gi", "memorySoftLimit": "6Gi"}),
            GpuConfig(mps=MpsConfig(memory_limit_bytes=8 * GI, memory_soft_limit_bytes=6 * GI)),
            id="mps-soft-limit",
        ),
        pytest.param(
            gpu_config(mps={"memorySoftLimit": 2048}),
            GpuConfig(mps=MpsConfig(memory_soft_limit_bytes=2048)),
            id="mps-soft-limit-alone-integer",
        ),
        pytest.param(
            gpu_config(mps={"memoryLimit": "8Gi", "memorySoftLimit": "8Gi"}),
            GpuConfig(mps=MpsConfig(memory_limit_bytes=8 * GI, memory_soft_limit_bytes=8 * GI)),
            id="mps-soft-limit-equal-to-hard",
        ),
        pytest.param(
            gpu_config(timeSlicing={"interval": "Long"}),
            GpuConfig(time_slicing=TimeSlicingConfig(TimeSliceInterval.LONG)),
            id="time-slicing",
        ),
        pytest.param(
            gpu_config(timeSlicing={}),
            GpuConfig(time_slicing=TimeSlicingConfig()),
            id="time-slicing-default",
        ),
        pytest.param(gpu_config(mig={}), GpuConfig(mig=MigConfig()), id="mig-reserved"),
        pytest.param(share(memory="10Gi"), GpuShare(10 * GI, 0), id="share-default-percent"),
        pytest.param(
            share(memory=GI, computePercent=100), GpuShare(GI, 100), id="share-integer-memory"
        ),
        pytest.param(grant(), GpuShareGrant("gpu-0", SHARE_ID, 10 * GI, 25), id="grant"),
        pytest.param(
            grant(computePercent=0), GpuShareGrant("gpu-0", SHARE_ID, 10 * GI, 0), id="grant-0"
        ),
    ],
)
def test_decode_and_round_trip(parameters: dict[str, Any], expected: object) -> None:
    decoded = decode_config(parameters)
    assert decoded == expected
    assert decode_config(encode_config(decoded)) == decoded


def test_encode_writes_canonical_quantities() -> None:
    assert encode_config(GpuShareGrant("gpu-1", SHARE_ID, 81408 * 2**20, 0)) == {
        "apiVersion": VERSION,
        "kind": "GpuShareGrant",
        "device": "gpu-1",
        "shareID": SHARE_ID,
        "memory": "81408Mi",
        "computePercent": 0,
    }


def test_driver_name_is_a_parameter() -> None:
    parameters = {"apiVersion": "gpu.example.com/v1alpha1", "kind": "GpuShare", "memory": "1Gi"}
    assert decode_config(parameters, "gpu.example.com") == GpuShare(GI)
    assert encode_config(GpuShare(GI), "gpu.example.com") == parameters | {"computePercent": 0}
    with pytest.raises(InvalidConfigError, match=r"allowed: gpu\.fractional\.dev/v1alpha1"):
        decode_config(parameters)


@pytest.mark.parametrize(
    ("parameters", "field", "allowed"),
    [
        pytest.param(["GpuConfig"], "", "an object with apiVersion", id="not-an-object"),
        pytest.param({"kind": "GpuConfig"}, "apiVersion", VERSION, id="no-api-version"),
        pytest.param(
            gpu_config(apiVersion="gpu.fractional.dev/v1"), "apiVersion", VERSION, id="version"
        ),
        pytest.param(
            gpu_config(apiVersion="other.dev/v1alpha1"), "apiVersion", VERSION, id="group"
        ),
        pytest.param(
            {"apiVersion": VERSION}, "kind", "GpuConfig, GpuShare, GpuShareGrant", id="no-kind"
        ),
        pytest.param(
            gpu_config(kind="GpuClaimParameters"),
            "kind",
            "GpuConfig, GpuShare, GpuShareGrant",
            id="unknown-kind",
        ),
        pytest.param(
            gpu_config(mpss={}), "mpss", "fields of GpuConfig: mig, mps, timeSlicing", id="field"
        ),
        pytest.param(
            gpu_config(sharing="mps"), "sharing", "the sharing strategy is the GPU's", id="sharing"
        ),
        pytest.param(
            gpu_config(mps={"computePercent": 50, "memory": "1Gi"}),
            "mps.memory",
            "fields of mps: computePercent, memoryLimit",
            id="mps-field",
        ),
        pytest.param(gpu_config(mps=None), "mps", "an object", id="mps-null"),
        pytest.param(gpu_config(mps=[]), "mps", "an object", id="mps-list"),
        pytest.param(
            gpu_config(mps={"computePercent": 0}), "mps.computePercent", "1 to 100", id="pct-0"
        ),
        pytest.param(
            gpu_config(mps={"computePercent": 101}), "mps.computePercent", "1 to 100", id="pct"
        ),
        pytest.param(
            gpu_config(mps={"computePercent": "50"}),
            "mps.computePercent",
            "1 to 100",
            id="pct-string",
        ),
        pytest.param(
            gpu_config(mps={"computePercent": True}),
            "mps.computePercent",
            "1 to 100",
            id="pct-bool",
        ),
        pytest.param(
            gpu_config(mps={"computePercent": 50.0}),
            "mps.computePercent",
            "1 to 100",
            id="pct-float",
        ),
        pytest.param(
            gpu_config(mps={"memoryLimit": "10GB"}), "mps.memoryLimit", "10Gi", id="mem-suffix"
        ),
        pytest.param(
            gpu_config(mps={"memoryLimit": "500m"}), "mps.memoryLimit", "10Gi", id="mem-milli"
        ),
        pytest.param(gpu_config(mps={"memoryLimit": 0}), "mps.memoryLimit", "above 0", id="mem0"),
        pytest.param(
            gpu_config(mps={"memoryLimit": "-1Gi"}), "mps.memoryLimit", "above 0", id="mem-neg"
        ),
        pytest.param(
            gpu_config(mps={"memorySoft": "1Gi"}),
            "mps.memorySoft",
            "fields of mps: computePercent, memoryLimit, memorySoftLimit",
            id="soft-field-name",
        ),
        pytest.param(
            gpu_config(mps={"memorySoftLimit": "6GB"}),
            "mps.memorySoftLimit",
            "a quantity string such as 10Gi",
            id="soft-malformed",
        ),
        pytest.param(
            gpu_config(mps={"memorySoftLimit": True}),
            "mps.memorySoftLimit",
            "a quantity string such as 10Gi",
            id="soft-bool",
        ),
        pytest.param(
            gpu_config(mps={"memorySoftLimit": None}),
            "mps.memorySoftLimit",
            "a quantity string such as 10Gi",
            id="soft-null",
        ),
        pytest.param(
            gpu_config(mps={"memorySoftLimit": "0"}), "mps.memorySoftLimit", "above 0", id="soft-0"
        ),
        pytest.param(
            gpu_config(mps={"memorySoftLimit": "-1Gi"}),
            "mps.memorySoftLimit",
            "above 0",
            id="soft-negative",
        ),
        pytest.param(
            gpu_config(mps={"memoryLimit": "4Gi", "memorySoftLimit": "6Gi"}),
            "mps.memorySoftLimit",
            "1 to 4Gi",
            id="soft-above-hard-in-one-config",
        ),
        pytest.param(
            gpu_config(timeSlicing={"interval": "Fast"}),
            "timeSlicing.interval",
            "Default, Short, Medium, Long",
            id="interval",
        ),
        pytest.param(
            gpu_config(timeSlicing={"interval": 1}),
            "timeSlicing.interval",
            "Default, Short, Medium, Long",
            id="interval-type",
        ),
        pytest.param(
            gpu_config(timeSlicing={"length": "Long"}),
            "timeSlicing.length",
            "fields of timeSlicing: interval",
            id="time-slicing-field",
        ),
        pytest.param(
            gpu_config(mig={"profile": "1g.10gb"}), "mig.profile", "no fields in mig", id="mig"
        ),
        pytest.param(share(), "memory", "10Gi", id="share-no-memory"),
        pytest.param(share(memory="0"), "memory", "above 0", id="share-memory-0"),
        pytest.param(
            share(memory="1Gi", computePercent=101), "computePercent", "0 to 100", id="share-pct"
        ),
        pytest.param(
            share(memory="1Gi", device="gpu-0"),
            "device",
            "fields of GpuShare: computePercent, memory",
            id="share-field",
        ),
        pytest.param(grant(shareID="not-a-uuid"), "shareID", "UUID", id="grant-share-id"),
        pytest.param(grant(device="GPU_0"), "device", "DNS label", id="grant-device"),
        pytest.param(grant(device=0), "device", "name", id="grant-device-type"),
        pytest.param(grant(computePercent=-1), "computePercent", "0 to 100", id="grant-pct"),
        pytest.param(
            {k: v for k, v in grant().items() if k != "memory"}, "memory", "10Gi", id="grant-mem"
        ),
        pytest.param(
            {k: v for k, v in grant().items() if k != "computePercent"},
            "computePercent",
            "0 to 100",
            id="grant-no-pct",
        ),
        pytest.param(grant(pool="node-a"), "pool", "fields of GpuShareGrant", id="grant-field"),
    ],
)
def test_decode_errors_name_field_and_allowed(parameters: Any, field: str, allowed: str) -> None:
    with pytest.raises(InvalidConfigError) as info:
        decode_config(parameters)
    assert info.value.field == field
    message = str(info.value)
    assert f"{field}:" in message
    assert "allowed: " in message
    assert allowed in message.split("allowed: ", 1)[1]


@pytest.mark.parametrize(
    ("obj", "field"),
    [
        pytest.param(GpuConfig(mps=MpsConfig(compute_percent=0)), "mps.computePercent", id="pct"),
        pytest.param(GpuConfig(mps=MpsConfig(memory_limit_bytes=-1)), "mps.memoryLimit", id="m"),
        pytest.param(
            GpuConfig(mps=MpsConfig(memory_soft_limit_bytes=0)), "mps.memorySoftLimit", id="soft"
        ),
        pytest.param(
            GpuConfig(mps=MpsConfig(memory_limit_bytes=GI, memory_soft_limit_bytes=GI + 1)),
            "mps.memorySoftLimit",
            id="soft-above-hard",
        ),
        pytest.param(GpuShare(0), "memory", id="share"),
        pytest.param(GpuShareGrant("gpu-0", "x", GI, 0), "shareID", id="grant"),
    ],
)
def test_validate_holds_code_built_objects_to_the_same_rules(obj: Any, field: str) -> None:
    with pytest.raises(InvalidConfigError) as info:
        validate(obj)
    assert info.value.field == field


def test_a_soft_limit_above_the_hard_one_names_both_values() -> None:
    with pytest.raises(InvalidConfigError) as info:
        decode_config(gpu_config(mps={"memoryLimit": "4Gi", "memorySoftLimit": "6Gi"}))
    assert str(info.value) == (
        "GpuConfig mps.memorySoftLimit: 6Gi exceeds the hard memory limit of 4Gi"
        " (mps.memoryLimit); allowed: 1 to 4Gi (a soft limit is at most the share's hard limit)"
    )


def test_the_soft_limit_is_encoded_canonically() -> None:
    config = GpuConfig(mps=MpsConfig(memory_soft_limit_bytes=1536 * 2**20))
    assert encode_config(config) == gpu_config(mps={"memorySoftLimit": "1536Mi"})
