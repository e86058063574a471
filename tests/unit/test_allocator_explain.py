"""What the controller tells a user when a claim fits nowhere: the thing to change."""

from __future__ import annotations

from typing import Any

from dra_driver.allocator import AllocatorState, allocate
from dra_driver.controller.reconcile import ClusterView, Wait, decide
from tests.support.allocator import CLASSES, DRIVER, GI, claim, request, slices

NODE = {"metadata": {"name": "node-a"}}


def allocated(name: str, device: str, memory: int) -> dict[str, Any]:
    result = {
        "request": "gpu",
        "driver": DRIVER,
        "pool": "node-a",
        "device": device,
        "shareID": f"00000000-0000-0000-0000-{name:0>12}",
        "consumedCapacity": {"memory": str(memory), "computePercent": "0"},
    }
    return {
        "metadata": {"namespace": "default", "name": name, "uid": name},
        "status": {"allocation": {"devices": {"results": [result]}}},
    }


def reason(*, allocator: str = "controller", taken: list[dict[str, Any]] | None = None,
           memory: str = "50Gi", node_filter: Any = None) -> str:  # fmt: skip
    outcome = allocate(
        claim(request(memory=memory)),
        slices=slices("h100-80gb:2", allocator=allocator),
        classes=CLASSES,
        allocated_claims=taken or [],
        driver_name=DRIVER,
        node_filter=node_filter,
    )
    assert outcome.allocation is None and outcome.failure == "unfit"
    return str(outcome.reason)


def test_no_gpu_published_for_the_controller_names_the_setting() -> None:
    why = reason(allocator="scheduler")
    assert "no GPU of driver gpu.fractional.dev is published for the controller" in why
    assert "nodeSettings.defaults.allocator=controller" in why
    assert "--allocator controller" in why
    assert "candidate device(s) checked" not in why


def test_full_gpus_say_what_is_full_on_the_best_candidate() -> None:
    taken = [allocated("a", "gpu-0", 60 * GI), allocated("b", "gpu-1", 40 * GI)]
    why = reason(taken=taken)
    assert "2 matching GPU(s) are full" in why
    # gpu-1 has the most memory left: 81559Mi usable less 40Gi.
    assert "best candidate node-a/gpu-1: " in why
    assert "memory 40599Mi of 81559Mi free" in why
    assert "(the claim takes clients 1, memory 50Gi)" in why
    assert "not enough memory" in why


def test_no_reachable_node_is_said() -> None:
    why = reason(node_filter=lambda _: False)
    assert "none of the 2 controller-managed GPU(s) is on a node the claim's pods may use" in why


def test_the_controller_names_an_untolerated_taint() -> None:
    pod = {
        "metadata": {"name": "p1", "namespace": "default"},
        "spec": {"resourceClaims": [{"name": "gpu", "resourceClaimName": "c"}]},
    }
    tainted = {
        "metadata": {"name": "node-a"},
        "spec": {"taints": [{"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"}]},
    }
    the_claim = claim(request(memory="10Gi"))
    state = AllocatorState(
        slices=slices("h100-80gb:2"), classes=CLASSES, allocated_claims=[], driver_name=DRIVER
    )
    view = ClusterView(driver_name=DRIVER, state=state)
    decision = decide(the_claim, [pod], {"node-a": tainted}, view)
    assert isinstance(decision, Wait) and decision.event
    assert (
        "node-a: taint node.kubernetes.io/not-ready:NoSchedule is not tolerated by pod p1"
        in decision.reason
    )
