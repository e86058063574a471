"""The node filter (the pods' node affinity, taints, rejected nodes) is asked once per
node for a claim, however many devices the node has and whether or not it fits."""

from __future__ import annotations

from collections import Counter

from dra_driver.allocator import AllocatorState
from tests.support.allocator import CLASSES, DRIVER, claim, request, slices


def test_the_node_filter_is_asked_once_per_node_per_claim() -> None:
    state = AllocatorState(
        slices=slices("h100-80gb:4", "node-a") + slices("h100-80gb:4", "node-b"),
        classes=CLASSES,
        allocated_claims=[],
        driver_name=DRIVER,
    )
    asked: Counter[str] = Counter()

    def node_filter(node: str) -> bool:
        asked[node] += 1
        return node == "node-b"

    fits = state.allocate(claim(request(memory="10Gi")), node_filter=node_filter)
    assert fits.allocation is not None and fits.allocation.node_name == "node-b"
    assert max(asked.values()) == 1
    asked.clear()
    unfit = state.allocate(claim(request(memory="500Gi")), node_filter=node_filter)
    assert unfit.allocation is None and unfit.failure == "unfit"
    assert "node-b" in (unfit.reason or "")  # the best candidate named, on node-b
    assert asked == Counter({"node-a": 1, "node-b": 1})
