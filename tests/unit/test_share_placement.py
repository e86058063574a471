"""Where a share goes (controller path): only to a shareable device, never to an
exclusive GPU or a MIG partition, whether its amount comes from ``capacity.requests``
or from a ``GpuShare`` config (what 1.34/1.35 leave when they drop capacity requests).

Found on a real node (2026-12-01): a ``GpuShare`` of 10Gi was allocated the whole
``1g.10gb`` partition (9856Mi), because only ``capacity.requests`` was checked.
"""

from __future__ import annotations

from typing import Any

import pytest

from dra_driver.allocator import allocate, sentinel_expression
from dra_driver.core.settings import Allocator, Capabilities, GpuSettings, NodeSettings, Sharing
from dra_driver.core.slices import build_slices
from dra_driver.fakes.gpu import build_inventory, load_spec

DRIVER = "gpu.fractional.dev"
D = f'device.attributes["{DRIVER}"]'


def slices(kube_minor: int) -> list[dict[str, Any]]:
    """An exclusive H100 (gpu-0), a MIG-enabled one (gpu-1: its partitions), and an
    MPS-shared one (gpu-2), all for the controller."""
    controller = GpuSettings(allocator=Allocator.CONTROLLER)
    settings = NodeSettings(
        default=controller,
        per_gpu={"0": GpuSettings(allocator=Allocator.CONTROLLER, sharing=Sharing.EXCLUSIVE)},
    )
    built = build_slices(
        build_inventory(load_spec("h100-80gb:1,h100-80gb:1:mig,h100-80gb:1"), "node-a"),
        driver_name=DRIVER,
        node_name="node-a",
        settings=settings,
        capabilities=Capabilities.for_version(kube_minor),
    )
    return [{"spec": s.spec} for s in built]


def device_class(name: str, selector: str) -> dict[str, Any]:
    exprs = [sentinel_expression(DRIVER), selector]
    selectors = [{"cel": {"expression": e}} for e in exprs]
    return {"metadata": {"name": name}, "spec": {"selectors": selectors}}


CLASSES = [
    device_class("exclusive-gpu", f'{D}.type == "gpu" && {D}.index == 0'),
    device_class("shared-gpu", f'{D}.type == "gpu" && {D}.index == 2'),
    device_class("mig-1g10gb", f'{D}.type == "mig" && {D}.profile == "1g.10gb"'),
    device_class("mig-1g20gb", f'{D}.type == "mig" && {D}.profile == "1g.20gb"'),
]


def claim(device_class: str, memory: str | None, form: str) -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": device_class}
    config: list[dict[str, Any]] = []
    if memory is not None and form == "capacity":
        exactly["capacity"] = {"requests": {"memory": memory}}
    if memory is not None and form == "GpuShare":
        params = {"apiVersion": f"{DRIVER}/v1alpha1", "kind": "GpuShare", "memory": memory}
        config = [{"requests": ["gpu"], "opaque": {"driver": DRIVER, "parameters": params}}]
    return {
        "metadata": {"name": "c", "namespace": "team", "uid": "u-1"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}], "config": config}},
    }


def outcome(device_class: str, memory: str | None, form: str, kube_minor: int) -> str:
    result = allocate(
        claim(device_class, memory, form),
        slices=slices(kube_minor),
        classes=CLASSES,
        allocated_claims=[],
        driver_name=DRIVER,
    )
    if result.allocation is None:
        return "never"
    (picked,) = result.allocation.results
    return picked.device


@pytest.mark.parametrize("kube_minor", [34, 36])
@pytest.mark.parametrize("form", ["capacity", "GpuShare"])
@pytest.mark.parametrize(
    ("device_class", "memory", "expected"),
    [
        ("mig-1g10gb", "10Gi", "never"),  # 10Gi over the partition's 9856Mi
        ("mig-1g10gb", "4Gi", "never"),  # fits, but a partition is not a share
        ("mig-1g20gb", "10Gi", "never"),
        ("exclusive-gpu", "10Gi", "never"),
        ("exclusive-gpu", "4Ti", "never"),
        # No amount: the claim asks for a whole device, which it gets.
        ("exclusive-gpu", None, "gpu-0"),
        ("mig-1g10gb", None, "mig"),
        # A shareable GPU takes the share.
        ("shared-gpu", "10Gi", "gpu-2"),
    ],
)
def test_a_share_is_never_placed_on_a_device_that_is_not_shareable(
    device_class: str, memory: str | None, expected: str, form: str, kube_minor: int
) -> None:
    if expected == "mig" and kube_minor < 36:
        pytest.skip("MIG partitions are partitionable devices: published from 1.36")
    got = outcome(device_class, memory, form, kube_minor)
    if expected == "mig":
        assert got.startswith("gpu-1-mig-1g10gb-"), got
    else:
        assert got == expected
