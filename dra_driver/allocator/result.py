"""What a claim gets: its results, its allocation, the outcome, and the
``status.allocation`` JSON written for it.

:func:`build_outcome` turns the picks of a search into an :class:`Allocation`: one
:class:`Result` per pick (a share gets a fresh share ID and the capacity it
consumes), the class and claim configs, and one ``GpuShareGrant`` per shared result.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from dra_driver.allocator.model import Claim, DeviceClass
from dra_driver.allocator.search import Pick
from dra_driver.api import GpuShareGrant, encode_config
from dra_driver.base.quantity import Amount, format_bytes, format_count


@dataclass(frozen=True)
class Result:
    request: str
    driver: str
    pool: str
    device: str
    share_id: str | None
    consumed: Mapping[str, Amount]
    admin_access: bool = False

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "request": self.request,
            "driver": self.driver,
            "pool": self.pool,
            "device": self.device,
        }
        if self.admin_access:
            out["adminAccess"] = True
        if self.share_id is not None:
            out["shareID"] = self.share_id
            out["consumedCapacity"] = {k: _format(k, v) for k, v in self.consumed.items()}
        return out


def _format(key: str, value: Amount) -> str:
    if value.denominator != 1:
        return f"{int(value * 1000)}m"
    return format_bytes(int(value)) if key == "memory" else format_count(int(value))


@dataclass(frozen=True)
class Allocation:
    node_name: str | None
    results: tuple[Result, ...]
    configs: tuple[Mapping[str, Any], ...]
    """``devices.config`` entries: class configs (FromClass), claim configs (FromClaim),
    then one ``GpuShareGrant`` per shared result (FromClaim)."""
    grants: tuple[GpuShareGrant, ...]

    def to_status(self, timestamp: str, *, keep_shares: bool = True) -> dict[str, Any]:
        """``status.allocation`` JSON; ``keep_shares=False`` drops shareID/consumedCapacity
        (clusters without consumable capacity)."""
        results = []
        for r in self.results:
            body = r.to_json()
            if not keep_shares:
                body.pop("shareID", None)
                body.pop("consumedCapacity", None)
            results.append(body)
        out: dict[str, Any] = {
            "devices": {"results": results, "config": [dict(c) for c in self.configs]},
            "allocationTimestamp": timestamp,
        }
        if self.node_name is not None:
            out["nodeSelector"] = {
                "nodeSelectorTerms": [
                    {
                        "matchFields": [
                            {"key": "metadata.name", "operator": "In", "values": [self.node_name]}
                        ]
                    }
                ]
            }
        return out


Failure = Literal["class-not-found", "selector-error", "quota", "unfit"]
"""Why a claim got no allocation (a metrics label): its class is missing, a CEL
selector failed on a candidate, the namespace's VRAM quota, or nothing fits."""


@dataclass(frozen=True)
class AllocationOutcome:
    allocation: Allocation | None = None
    reason: str | None = None
    failure: Failure | None = None
    """Set with ``reason``."""


def build_outcome(
    *,
    claim: Claim,
    node: str | None,
    picks: list[Pick],
    class_map: Mapping[str, DeviceClass],
    driver: str,
    share_id: Callable[[], str],
) -> Allocation:
    results = []
    grants = []
    configs: list[Mapping[str, Any]] = []
    for pick in picks:
        sid = share_id() if pick.share else None
        results.append(
            Result(
                pick.request.name,
                pick.device.driver,
                pick.device.pool,
                pick.device.name,
                sid,
                pick.consumed if pick.share else {},
                pick.request.admin_access,
            )
        )
        for config in class_map[pick.request.device_class].configs:
            configs.append({"source": "FromClass", "requests": [pick.request.name], **config})
        if sid is not None:
            grants.append(
                GpuShareGrant(
                    device=pick.device.name,
                    share_id=sid,
                    memory_bytes=int(pick.consumed.get("memory", 0)),
                    compute_percent=int(pick.consumed.get("computePercent", 0)),
                )
            )
    configs.extend({"source": "FromClaim", **c} for c in claim.configs)
    for result, grant in zip((r for r in results if r.share_id), grants, strict=True):
        configs.append(
            {
                "source": "FromClaim",
                "requests": [result.request],
                "opaque": {"driver": driver, "parameters": encode_config(grant, driver)},
            }
        )
    return Allocation(node, tuple(results), tuple(configs), tuple(grants))
