"""What the controller knows of the cluster, read by both its halves: the informers'
caches and what is kept beside them (pods and claims indexed both ways, the claims'
sizes, the allocator's state, each claim's in-flight record), and the views built
from them (Nodes and Namespaces by name, built when first asked after a change).

The change router (:mod:`.routing`) keeps these in step with the informers' events;
the claim processor (:mod:`.processing`) reads them to decide and records its
decisions in them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from dra_driver.allocator import SelectorCache
from dra_driver.controller.claim_index import ClaimPodIndex
from dra_driver.controller.claim_sizes import ClaimSizes
from dra_driver.controller.inflight import InFlight
from dra_driver.controller.informer import Informer
from dra_driver.controller.ledger_cache import LedgerCache, Sources
from dra_driver.k8s.rest import JsonObj


@dataclass(frozen=True)
class Informers:
    """One informer per kind the controller reads."""

    claims: Informer
    pods: Informer
    slices: Informer
    classes: Informer
    nodes: Informer
    namespaces: Informer

    def all(self) -> tuple[Informer, ...]:
        return (self.claims, self.pods, self.slices, self.classes, self.nodes, self.namespaces)


class ControllerCaches:
    def __init__(
        self,
        driver_name: str,
        informers: Informers,
        *,
        on_refused: Callable[[str, str], None] = lambda from_phase, to_phase: None,
    ) -> None:
        """``on_refused(from, to)``: an in-flight move was refused (:mod:`.inflight`)."""
        self.informers = informers
        self.claims = informers.claims
        self.pods = informers.pods
        self.ledger = LedgerCache(
            driver_name,
            Sources(
                slices=informers.slices.each,
                classes=informers.classes.values,
                allocated_claims=self.all_claims,
                holds=lambda: self.inflight.holds,
            ),
            SelectorCache(),
        )
        self.inflight = InFlight(informers.claims, self.ledger, on_refused)
        """Each claim's life from its decision to the watch's echo of its write."""
        self.index = ClaimPodIndex()
        self.sizes = ClaimSizes(driver_name)
        self._nodes_index: dict[str, JsonObj] | None = None
        self._namespaces_index: dict[str, JsonObj] | None = None
        self.changed = True
        """Something the metrics' gauges show changed since they were last computed."""

    def current_claim(self, uid: str) -> JsonObj | None:
        return self.inflight.current(uid)

    def all_claims(self) -> list[JsonObj]:
        return self.inflight.all()

    def pods_of(self, claim: JsonObj) -> list[JsonObj]:
        """The pods that may use ``claim`` (the index's; :func:`~.reconcile.decide`
        checks each)."""
        pods = self.pods
        return [p for u in self.index.pods_of(claim) if (p := pods.get(u)) is not None]

    def nodes_by_name(self) -> dict[str, JsonObj]:
        if self._nodes_index is None:
            self._nodes_index = _by_name(self.informers.nodes.values())
        return self._nodes_index

    def namespaces_by_name(self) -> dict[str, JsonObj]:
        if self._namespaces_index is None:
            self._namespaces_index = _by_name(self.informers.namespaces.values())
        return self._namespaces_index

    def nodes_changed(self) -> None:
        self._nodes_index = None

    def namespaces_changed(self) -> None:
        self._namespaces_index = None


def _by_name(objects: list[JsonObj]) -> dict[str, JsonObj]:
    return {str((o.get("metadata") or {}).get("name")): o for o in objects}
