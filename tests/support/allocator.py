"""Allocator inputs for the tests: ResourceSlices from the real slice builder on fake
GPUs, DeviceClasses, requests and claims as the API server holds them."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dra_driver.allocator import sentinel_expression
from dra_driver.core.settings import Allocator, Capabilities, GpuSettings, NodeSettings
from dra_driver.core.slices import build_slices
from dra_driver.fakes.gpu import build_inventory, load_spec

DRIVER = "gpu.fractional.dev"
GI = 2**30
CLASS = "share.gpu.fractional.dev"
D = f'device.attributes["{DRIVER}"]'


def slices(
    spec: str = "h100-80gb:2",
    node: str = "node-a",
    minor: int = 36,
    allocator: str = "controller",
    *,
    legacy_mps: bool = False,
) -> list[dict[str, Any]]:
    settings = NodeSettings(
        default=GpuSettings(allocator=Allocator(allocator)), legacy_mps=legacy_mps
    )
    built = build_slices(
        build_inventory(load_spec(spec), node),
        driver_name=DRIVER,
        node_name=node,
        settings=settings,
        capabilities=Capabilities.for_version(minor),
    )
    return [{"spec": s.spec} for s in built]


def device_class(name: str = CLASS, *selectors: str, config: Any = ()) -> dict[str, Any]:
    exprs = [sentinel_expression(DRIVER), *selectors]
    return {
        "metadata": {"name": name},
        "spec": {"selectors": [{"cel": {"expression": e}} for e in exprs], "config": list(config)},
    }


CLASSES = [
    device_class(),
    device_class("mig", f'{D}.type == "mig"'),
    device_class("gpu", f'{D}.type == "gpu"'),
]


def request(name: str = "gpu", memory: str | None = "10Gi", **extra: Any) -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": CLASS, **extra}
    if memory is not None:
        exactly["capacity"] = {"requests": {"memory": memory}}
    return {"name": name, "exactly": exactly}


def claim(
    *requests: Mapping[str, Any], namespace: str = "default", name: str = "c", **devices: Any
) -> dict[str, Any]:
    return {
        "metadata": {"namespace": namespace, "name": name, "uid": f"uid-{namespace}-{name}"},
        "spec": {"devices": {"requests": list(requests or [request()]), **devices}},
    }
