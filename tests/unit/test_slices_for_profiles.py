"""Every fake GPU profile, MIG on and off, on every supported Kubernetes version."""

from __future__ import annotations

import pytest

from dra_driver.core.published import device_names
from dra_driver.core.settings import Capabilities, NodeSettings
from dra_driver.core.slices import build_slices
from dra_driver.fakes.gpu import build_inventory, load_spec
from dra_driver.fakes.gpu_models import KNOWN_MODELS
from tests.support.slice_checks import DRIVER, NODE, assert_publishable

MINORS = (34, 35, 36, 37)
CASES = [
    pytest.param(model, mig, minor, id=f"{model}{'-mig' if mig else ''}-1.{minor}")
    for model in sorted(KNOWN_MODELS)
    for mig in (False, True)
    if not mig or KNOWN_MODELS[model].mig_capable
    for minor in MINORS
]


@pytest.mark.parametrize(("model", "mig", "minor"), CASES)
def test_profile_publishes_valid_slices(model: str, mig: bool, minor: int) -> None:
    spec = f"{model}:2:mig" if mig else f"{model}:2"
    inventory = build_inventory(load_spec(spec), NODE)
    caps = Capabilities.for_version(minor)
    slices = build_slices(
        inventory, driver_name=DRIVER, node_name=NODE, settings=NodeSettings(), capabilities=caps
    )
    assert_publishable(slices, caps, minor)
    devices = [d for s in slices for d in s.spec.get("devices", ())]
    if not mig:
        assert [d["name"] for d in devices] == ["gpu-0", "gpu-1"]
    elif caps.partitionable_devices:
        # Exactly one device per placement NVML would report, on each GPU.
        placements = sum(len(p.placements) for p in inventory.gpus[0].mig_profiles)
        assert len(devices) == 2 * placements
    else:
        assert devices == []  # no pre-existing instances, no dynamic MIG before 1.36


@pytest.mark.parametrize("spec", ["h100-80gb:2", "a100-40gb:1:mig,l4:1", "h200-141gb:2:mig"])
def test_device_names_are_the_published_ones(spec: str) -> None:
    """The health stream's device list equals what a 1.36 cluster gets published."""
    inventory = build_inventory(load_spec(spec), NODE)
    slices = build_slices(
        inventory,
        driver_name=DRIVER,
        node_name=NODE,
        settings=NodeSettings(),
        capabilities=Capabilities.for_version(36),
    )
    published = sorted(d["name"] for s in slices for d in s.spec.get("devices", ()))
    assert sorted(device_names(inventory)) == published
