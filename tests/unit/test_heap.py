"""settle_heap: what a daemon holds after start-up is left out of later collections."""

from __future__ import annotations

import gc

from dra_driver.app.heap import settle_heap


class _Node:
    def __init__(self) -> None:
        self.other: _Node | None = None


def test_settle_heap_freezes_what_is_alive_and_leaves_new_garbage_collectable() -> None:
    kept = [_Node() for _ in range(100)]
    try:
        settle_heap()
        assert gc.get_freeze_count() >= len(kept)
        # A cycle made after start-up is still found by the collector.
        a, b = _Node(), _Node()
        a.other, b.other = b, a
        del a, b
        assert gc.collect() >= 2
    finally:
        gc.unfreeze()
    assert gc.get_freeze_count() == 0
