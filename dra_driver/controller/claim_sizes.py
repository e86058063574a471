"""What each claim asks (:func:`~dra_driver.allocator.requested_size`), worked out once.

The worker starts claims largest first (:func:`~.reconcile.placement_key`), and a claim
is placed again each time it is queued (its pod seen after it, a retry): each time its
requests were parsed and its GpuShare config read anew. A claim's spec cannot change
(the API server refuses any change to it), so its size is kept by UID, for as long as
the claim exists.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dra_driver.allocator import requested_size
from dra_driver.base.quantity import Amount
from dra_driver.core import claim_shape

Size = tuple[int, Amount]
"""(devices taken whole, memory its shares ask)"""


class ClaimSizes:
    def __init__(self, driver_name: str) -> None:
        self._driver_name = driver_name
        self._sizes: dict[str, Size] = {}

    def __call__(self, claim: Mapping[str, Any]) -> Size:
        """The claim's size; raises as :func:`requested_size` does (nothing kept then)."""
        uid = claim_shape.uid(claim)
        size = self._sizes.get(uid)
        if size is None:
            size = self._sizes[uid] = requested_size(claim, self._driver_name)
        return size

    def forget(self, uid: str) -> None:
        """The claim is gone."""
        self._sizes.pop(uid, None)

    def retain(self, uids: set[str]) -> None:
        """Only these claims exist (after a relist, which may have missed deletions)."""
        for uid in [u for u in self._sizes if u not in uids]:
            del self._sizes[uid]

    def __len__(self) -> int:
        return len(self._sizes)
