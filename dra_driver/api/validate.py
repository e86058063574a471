"""Validation of decoded opaque configs: ranges and forms, one function per kind.

Decoding (:mod:`dra_driver.api.decode`) checks the *shape* of what was written
(known fields, JSON types, enum members, required fields); these functions check
the *values*, so a config the controller builds in code is held to the same rules
before it is written (``validate(grant)`` then ``encode_config(grant)``).

Every error is an :class:`InvalidConfigError` whose message reads
``<Kind> <field path>: <what is wrong>; allowed: <what is allowed>`` with the
wire names (``mps.computePercent``), and whose ``field`` is that path.
"""

from __future__ import annotations

import re

from dra_driver.api.types import (
    ApiObject,
    GpuConfig,
    GpuShare,
    GpuShareGrant,
    Kind,
)
from dra_driver.base.errors import InvalidConfigError
from dra_driver.base.names import dns_label
from dra_driver.base.quantity import format_bytes

_UUID = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")


def invalid(kind: Kind | str, path: str, problem: str, allowed: str) -> InvalidConfigError:
    """The one message format: ``GpuConfig mps.computePercent: 0 is out of range; allowed: ...``."""
    where = f"{kind} {path}" if path else str(kind)
    return InvalidConfigError(f"{where}: {problem}; allowed: {allowed}", field=path)


def _check_percent(kind: Kind, path: str, value: int, low: int) -> None:
    if not low <= value <= 100:
        raise invalid(kind, path, f"{value} is out of range", f"an integer from {low} to 100")


def _check_memory(kind: Kind, path: str, value: int) -> None:
    if value <= 0:
        raise invalid(
            kind, path, f"{format_bytes(value)} is not positive", "a quantity above 0, e.g. 10Gi"
        )


def validate_gpu_config(config: GpuConfig) -> None:
    """``mps.computePercent`` 1..100; ``mps.memoryLimit`` and ``mps.memorySoftLimit`` > 0,
    the soft limit no larger than a ``memoryLimit`` in the same config.

    Other sections need nothing. That the soft limit fits the share's memory
    (the grant, lowered by the merged configs) is checked where the grant is
    known: :func:`~dra_driver.core.prepare.apply_overrides`.
    """
    mps = config.mps
    if mps is None:
        return
    if mps.compute_percent is not None:
        _check_percent(Kind.GPU_CONFIG, "mps.computePercent", mps.compute_percent, 1)
    if mps.memory_limit_bytes is not None:
        _check_memory(Kind.GPU_CONFIG, "mps.memoryLimit", mps.memory_limit_bytes)
    soft = mps.memory_soft_limit_bytes
    if soft is not None:
        _check_memory(Kind.GPU_CONFIG, "mps.memorySoftLimit", soft)
        hard = mps.memory_limit_bytes
        if hard is not None and soft > hard:
            raise soft_limit_above_hard(soft, hard, "mps.memoryLimit")


def soft_limit_above_hard(soft: int, hard: int, hard_is: str) -> InvalidConfigError:
    """``mps.memorySoftLimit`` above the hard limit ``hard`` (``hard_is`` says what that is)."""
    limit = format_bytes(hard)
    return invalid(
        Kind.GPU_CONFIG,
        "mps.memorySoftLimit",
        f"{format_bytes(soft)} exceeds the hard memory limit of {limit} ({hard_is})",
        f"1 to {limit} (a soft limit is at most the share's hard limit)",
    )


def validate_gpu_share(share: GpuShare) -> None:
    """``memory`` > 0, ``computePercent`` 0..100."""
    _check_memory(Kind.GPU_SHARE, "memory", share.memory_bytes)
    _check_percent(Kind.GPU_SHARE, "computePercent", share.compute_percent, 0)


def validate_gpu_share_grant(grant: GpuShareGrant) -> None:
    """``device`` a DNS label, ``shareID`` a UUID, ``memory`` > 0, ``computePercent`` 0..100."""
    if dns_label(grant.device):
        raise invalid(
            Kind.GPU_SHARE_GRANT,
            "device",
            f"{grant.device!r} is not a device name",
            "a DNS label (lower-case letters, digits, '-'; at most 63), e.g. gpu-0",
        )
    if not _UUID.fullmatch(grant.share_id):
        raise invalid(
            Kind.GPU_SHARE_GRANT,
            "shareID",
            f"{grant.share_id!r} is not a UUID",
            "a UUID as 8-4-4-4-12 hex digits",
        )
    _check_memory(Kind.GPU_SHARE_GRANT, "memory", grant.memory_bytes)
    _check_percent(Kind.GPU_SHARE_GRANT, "computePercent", grant.compute_percent, 0)


def validate(obj: ApiObject) -> None:
    """Validate any kind; raises :class:`InvalidConfigError`."""
    match obj:
        case GpuConfig():
            validate_gpu_config(obj)
        case GpuShare():
            validate_gpu_share(obj)
        case GpuShareGrant():
            validate_gpu_share_grant(obj)
