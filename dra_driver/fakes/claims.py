"""An in-memory :class:`~dra_driver.core.ports.ClaimSource` (demo, benchmarks, tests)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from dra_driver.base.errors import ClaimNotFoundError
from dra_driver.base.ids import ClaimRef
from dra_driver.core.allocation import claim_from_dict
from dra_driver.core.model import ResourceClaim
from dra_driver.core.ports import ensure_same_claim


class InMemoryClaimSource:
    """Holds ResourceClaim objects as the API server would return them (JSON dicts)."""

    def __init__(self, objects: Iterable[Mapping[str, Any]] = ()) -> None:
        self._claims: dict[tuple[str, str], Mapping[str, Any]] = {}
        for obj in objects:
            self.put(obj)

    def put(self, obj: Mapping[str, Any]) -> None:
        meta = obj["metadata"]
        self._claims[(meta["namespace"], meta["name"])] = obj

    def delete(self, namespace: str, name: str) -> None:
        self._claims.pop((namespace, name), None)

    async def get_claim(self, ref: ClaimRef) -> ResourceClaim:
        obj = self._claims.get((ref.namespace, ref.name))
        if obj is None:
            raise ClaimNotFoundError(
                ref, f"ResourceClaim {ref.namespace}/{ref.name} does not exist (deleted?)"
            )
        return ensure_same_claim(ref, claim_from_dict(obj))
