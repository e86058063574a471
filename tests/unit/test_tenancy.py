"""Tenancy (issue 33): a daemon that cannot keep tenants apart serves one namespace.

Legacy MPS (and a MIG instance's daemon, always legacy) hands every client the
daemon's ``control`` socket and ``/dev/shm``. So, unless a GPU opts in with
``tenancy: cooperative``:

* the node config reads ``tenancy`` node-wide and per GPU, and refuses other values;
* the slices never let the kube-scheduler, which cannot see namespaces, share such
  a daemon: a legacy whole GPU for the scheduler is published whole, one for the
  controller as an ordinary device with the share policy as attributes (as on 1.34)
  and ``mpsTenancy: namespace``; a MIG GPU's instances stay exclusive. MPS v3 GPUs
  are published as before;
* the controller places a share on a ``mpsTenancy: namespace`` device only for the
  namespace whose shares it already holds, and says why when nothing else fits.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dra_driver.allocator import AllocatorState
from dra_driver.base.errors import ConfigError
from dra_driver.core.settings import (
    Allocator,
    Capabilities,
    GpuSettings,
    NodeSettings,
    Sharing,
    Tenancy,
)
from dra_driver.core.slices import build_slices
from dra_driver.fakes.gpu import build_inventory, load_spec
from dra_driver.plugin.node_config import NodeFlags, load_node_settings
from tests.support import allocator as support

DRIVER = "gpu.fractional.dev"
NODE = "node-a"


# --- node config ----------------------------------------------------------------------


def test_the_node_config_reads_tenancy_node_wide_and_per_gpu(tmp_path: Path) -> None:
    path = tmp_path / "node.yaml"
    path.write_text("tenancy: namespace\ngpus:\n  '1': {tenancy: cooperative}\n")
    settings = load_node_settings(NodeFlags(config_file=str(path), legacy_mps=True))
    assert settings.default.tenancy is Tenancy.NAMESPACE
    assert settings.for_gpu(1, "GPU-x").tenancy is Tenancy.COOPERATIVE
    assert settings.for_gpu(0, "GPU-y").tenancy is Tenancy.NAMESPACE
    assert settings.legacy_mps is True
    # The default, from the flags.
    assert load_node_settings(NodeFlags()).default.tenancy is Tenancy.NAMESPACE


def test_an_unknown_tenancy_is_refused_naming_the_choices(tmp_path: Path) -> None:
    path = tmp_path / "node.yaml"
    path.write_text("gpus:\n  '0': {tenancy: shared}\n")
    with pytest.raises(
        ConfigError, match=r"tenancy: 'shared' is not one of namespace, cooperative"
    ):
        load_node_settings(NodeFlags(config_file=str(path)))


# --- slices ---------------------------------------------------------------------------


def _devices(settings: NodeSettings, spec: str = "h100-80gb", minor: int = 36) -> dict[str, Any]:
    built = build_slices(
        build_inventory(load_spec(spec), NODE),
        driver_name=DRIVER,
        node_name=NODE,
        settings=settings,
        capabilities=Capabilities.for_version(minor),
    )
    return {d["name"]: d for s in built for d in s.spec.get("devices", ())}


def _attr(device: dict[str, Any], name: str) -> Any:
    found = device["attributes"].get(name)
    return None if found is None else next(iter(found.values()))


def test_a_v3_gpu_is_shared_natively_with_no_tenancy_attribute() -> None:
    (gpu,) = _devices(NodeSettings(legacy_mps=False)).values()
    assert gpu.get("allowMultipleAllocations") is True
    assert _attr(gpu, "mpsTenancy") is None


def test_a_legacy_gpu_for_the_scheduler_is_published_whole() -> None:
    (gpu,) = _devices(NodeSettings(legacy_mps=True)).values()
    assert "allowMultipleAllocations" not in gpu
    assert _attr(gpu, "sharing") == "exclusive"
    assert _attr(gpu, "memoryUsable") is None  # nothing for anyone to share it by


def test_a_legacy_gpu_for_the_controller_is_shared_only_through_it() -> None:
    settings = NodeSettings(default=GpuSettings(allocator=Allocator.CONTROLLER), legacy_mps=True)
    (gpu,) = _devices(settings).values()
    assert "allowMultipleAllocations" not in gpu  # the scheduler gets it whole
    assert _attr(gpu, "sharing") == "mps"
    assert _attr(gpu, "mpsTenancy") == "namespace"
    assert _attr(gpu, "memoryUsable") == 81559 * 2**20  # the controller's share policy


def test_a_cooperative_legacy_gpu_is_shared_natively_and_says_so() -> None:
    settings = NodeSettings(default=GpuSettings(tenancy=Tenancy.COOPERATIVE), legacy_mps=True)
    (gpu,) = _devices(settings).values()
    assert gpu.get("allowMultipleAllocations") is True
    assert _attr(gpu, "mpsTenancy") == "cooperative"


@pytest.mark.parametrize("tenancy", list(Tenancy))
def test_mig_instances_are_mps_shared_only_with_the_opt_in(tenancy: Tenancy) -> None:
    # legacy_mps False: a MIG instance's daemon is legacy whatever the agent speaks.
    settings = NodeSettings(
        per_gpu={"0": GpuSettings(mig_sharing=Sharing.MPS, tenancy=tenancy)}, legacy_mps=False
    )
    migs = [d for d in _devices(settings, "h100-80gb:1:mig").values() if _attr(d, "type") == "mig"]
    assert migs
    shared = tenancy is Tenancy.COOPERATIVE
    for device in migs:
        assert (device.get("allowMultipleAllocations") is True) is shared, device["name"]
        assert _attr(device, "sharing") == ("mps" if shared else "exclusive")
        assert _attr(device, "mpsTenancy") == ("cooperative" if shared else None)


# --- the controller's allocator ------------------------------------------------------------


def _state(legacy: bool, *claims: dict[str, Any]) -> AllocatorState:
    return AllocatorState(
        slices=support.slices(legacy_mps=legacy),
        classes=[support.device_class()],
        allocated_claims=list(claims),
        driver_name=DRIVER,
    )


def _claim(namespace: str, name: str) -> dict[str, Any]:
    return support.claim(support.request(), namespace=namespace, name=name)


def _device_of(state: AllocatorState, claim: dict[str, Any]) -> str | None:
    outcome = state.allocate(claim)
    if outcome.allocation is None:
        return None
    (result,) = outcome.allocation.results
    return result.device


def test_the_controller_keeps_a_legacy_gpu_to_one_namespace() -> None:
    state = _state(True)
    first = _device_of(state, _claim("team-a", "a1"))
    assert _device_of(state, _claim("team-a", "a2")) == first  # best fit: same tenant packs
    other = _device_of(state, _claim("team-b", "b1"))
    assert other is not None and other != first  # kept off team-a's GPU
    # Both GPUs now serve a namespace: a third namespace fits nowhere, and is told why.
    outcome = state.allocate(_claim("team-c", "c1"))
    assert outcome.allocation is None
    assert outcome.reason is not None
    assert "2 device(s) kept off for namespace team-c" in outcome.reason, outcome.reason
    assert "tenancy: cooperative" in outcome.reason


def test_the_controller_counts_tenants_of_claims_allocated_before() -> None:
    """A new state (a restart, a rebuild) reads whose shares each device holds."""
    state = _state(True)
    a1 = _claim("team-a", "a1")
    outcome = state.allocate(a1, record=False)
    assert outcome.allocation is not None
    (result,) = outcome.allocation.results
    allocated = dict(
        a1, status={"allocation": outcome.allocation.to_status("2026-12-05T00:00:00Z")}
    )
    rebuilt = _state(True, allocated)
    assert _device_of(rebuilt, _claim("team-b", "b1")) not in (None, result.device)


def test_a_v3_gpu_takes_every_namespace_on_the_controller_path() -> None:
    state = _state(False)
    first = _device_of(state, _claim("team-a", "a1"))
    assert _device_of(state, _claim("team-b", "b1")) == first


# --- what the plugin tells the agent ------------------------------------------------------


@pytest.mark.parametrize(
    ("legacy", "mig", "tenancy", "expected"),
    [
        (False, False, Tenancy.NAMESPACE, {}),  # v3: an agent older than the rule serves it
        (True, False, Tenancy.NAMESPACE, {"tenant": "team-a", "cooperative": False}),
        (True, False, Tenancy.COOPERATIVE, {"tenant": "team-a", "cooperative": True}),
        (False, True, Tenancy.COOPERATIVE, {"tenant": "team-a", "cooperative": True}),
    ],
)
def test_the_plugin_names_the_tenant_only_to_a_legacy_daemon(
    legacy: bool, mig: bool, tenancy: Tenancy, expected: dict[str, Any]
) -> None:
    from dra_driver.base.ids import ClaimRef, ClaimUID
    from dra_driver.plugin.enforcement import Enforcer

    inventory = build_inventory(load_spec("h100-80gb"), NODE)
    (gpu,) = inventory.gpus
    enforcer = Enforcer(
        backend=None,  # type: ignore[arg-type]  # not reached: only the agent's arguments
        inventory=lambda: inventory,
        mig_caps=None,
        mps=None,
        settings=NodeSettings(per_gpu={"0": GpuSettings(tenancy=tenancy)}, legacy_mps=legacy),
    )
    claim = ClaimRef("team-a", "c", ClaimUID("u1"))
    daemon = "MIG-00000000-aaaa-bbbb-cccc-444444444444" if mig else gpu.uuid
    assert enforcer._tenancy(claim, gpu.uuid, daemon) == expected
    # A GPU gone from the inventory: no opt-in is known for it.
    if expected:
        assert enforcer._tenancy(claim, "GPU-gone", daemon)["cooperative"] is False
