"""The assume cache: the claims as we last wrote them, laid over the informer's until
its watch shows a resourceVersion at least as new (client-go's ``AssumeCache``).

Without it the next decision, taken before the watch brings our write back, would
read the claim as it was before the write (and its devices as free).
"""

from __future__ import annotations

from dra_driver.controller.informer import Informer
from dra_driver.core import claim_shape
from dra_driver.k8s.rest import JsonObj


class AssumeCache:
    def __init__(self, claims: Informer) -> None:
        self._claims = claims
        self.assumed: dict[str, JsonObj] = {}
        """Claim UID -> the claim as we last wrote it, until the watch catches up."""

    def current(self, uid: str) -> JsonObj | None:
        """The newer of the informer's copy and ours."""
        seen = self._claims.get(uid)
        mine = self.assumed.get(uid)
        if mine is not None and (
            seen is None or claim_shape.resource_version(mine) > claim_shape.resource_version(seen)
        ):
            return mine
        return seen

    def all(self) -> list[JsonObj]:
        uids = self._claims.uids() | set(self.assumed)
        return [c for c in (self.current(u) for u in uids) if c is not None]

    def assume(self, claim: JsonObj) -> None:
        """``claim`` as an answer of ours showed it."""
        uid = claim_shape.key(claim)
        seen = self._claims.get(uid)
        if seen is None or claim_shape.resource_version(claim) > claim_shape.resource_version(seen):
            self.assumed[uid] = claim

    def seen(self, claim: JsonObj) -> bool:
        """The informer shows ``claim``: ours goes once the informer's is as new.

        True when ``claim`` is no news: a version up to the last one we hold (our
        write's answer, or a claim read back after a conflict). Each of our writes is
        guarded by the resourceVersion it was based on, so every version up to it is
        one that we wrote, wrote upon or decided upon."""
        uid = claim_shape.key(claim)
        mine = self.assumed.get(uid)
        if mine is None:
            return False
        version, ours = claim_shape.resource_version(claim), claim_shape.resource_version(mine)
        if version >= ours:
            del self.assumed[uid]
        return version <= ours

    def forget(self, uid: str) -> None:
        self.assumed.pop(uid, None)
