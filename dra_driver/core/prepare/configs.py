"""The configs that apply to one allocation result, merged, and the limits they yield.

Rules (dra-facts 3.3-3.5, 5.2; ARCHITECTURE 3.4), and the decisions made here:

* Only entries whose ``opaque.driver`` is ours are looked at; others are skipped
  silently (an allocation carries every driver's configs).
* An entry applies to a result when its ``requests`` is empty, or lists the
  result's request exactly, or lists the result's *main* request: per the DRA API,
  ``gpu`` covers every sub-request ``gpu/<sub>``, while ``gpu/a`` covers only
  ``gpu/a`` (not ``gpu/b``, and not a plain ``gpu`` result). Entries that do not
  apply are not decoded (they are decoded when their own result is).
* Order: ``FromClass`` entries first, then ``FromClaim``, each in list order (the
  allocator writes them so; we sort stably by source so a hand-written allocation
  cannot invert it). Later wins, field by field: a claim's ``mps.memoryLimit``
  overrides the class's and keeps the class's ``mps.computePercent``. A section
  or field that is absent never resets what an earlier entry set. Specificity
  (``gpu/a`` over ``gpu``) plays no part; only order does, as in the DRA rules.
* ``GpuShare`` entries are collected in order (for the controller); they never
  set limits.
* A ``GpuShareGrant`` is trusted only from ``FromClaim`` (the controller writes it
  into the allocation; a class cannot grant), and only when its ``device`` is the
  result's device and its ``shareID`` equals the result's ``shareID`` (case
  insensitive). Where the API dropped ``shareID`` (no consumable capacity), the
  device alone must match. Other grants are ignored and recorded with a reason in
  :attr:`EffectiveConfig.ignored`. Two trusted grants for one result are an error:
  the controller writes exactly one, and a second one means a forged or
  ambiguous allocation (the controller must refuse claims whose *spec* carries a
  ``GpuShareGrant``, since it copies claim configs into the allocation as
  ``FromClaim`` too).
* A malformed entry that applies is an :class:`InvalidConfigError` prefixed with
  ``devices.config[<i>] (<source>)``; the claim fails, others are unaffected.

Limits: :func:`granted_limits` takes ``consumedCapacity`` when the result has one
(native path), else the trusted grant (controller path), else the whole GPU
(exclusive). When both ``consumedCapacity`` and a grant exist they must agree.
:func:`apply_overrides` lets a ``GpuConfig``'s ``mps`` section only *lower* them,
and adds its soft memory limit (``mps.memorySoftLimit``), which must fit under the
resulting hard limit (the granted memory, after any ``mps.memoryLimit``).
A granted ``computePercent`` of 0 means "no SM cap" and compares as 100. The
overrides are numbers only: the planner applies them only on MPS-shared GPUs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from dra_driver.api.decode import decode_config
from dra_driver.api.types import (
    DEFAULT_DRIVER_NAME,
    GpuConfig,
    GpuShare,
    GpuShareGrant,
    Kind,
    Limits,
    LimitsOrigin,
    MpsConfig,
    TimeSliceInterval,
    TimeSlicingConfig,
)
from dra_driver.api.validate import invalid, soft_limit_above_hard
from dra_driver.base.errors import InvalidConfigError
from dra_driver.base.quantity import format_bytes, parse_whole
from dra_driver.core.model import DeviceResult, OpaqueConfig

FROM_CLASS = "FromClass"
FROM_CLAIM = "FromClaim"
_SOURCES = (FROM_CLASS, FROM_CLAIM)


@dataclass(frozen=True)
class IgnoredConfig:
    """An entry of ours that applied to the result's request but was not used."""

    index: int
    """Position in ``status.allocation.devices.config``."""
    source: str
    reason: str


@dataclass(frozen=True)
class EffectiveConfig:
    """Everything our configs say about one allocation result."""

    gpu: GpuConfig = field(default_factory=GpuConfig)
    """All applicable ``GpuConfig`` entries merged (class, then claim)."""
    shares: tuple[GpuShare, ...] = ()
    """Applicable ``GpuShare`` entries, in order (the controller's input only)."""
    grant: GpuShareGrant | None = None
    """The trusted grant for this result, if any."""
    ignored: tuple[IgnoredConfig, ...] = ()

    @property
    def time_slice_interval(self) -> TimeSliceInterval:
        """The interval to set on a time-sliced GPU (``Default`` when none is configured)."""
        section = self.gpu.time_slicing
        if section is None or section.interval is None:
            return TimeSliceInterval.DEFAULT
        return section.interval


def applies_to(requests: Sequence[str], result_request: str) -> bool:
    """Whether a config listing ``requests`` applies to a result for ``result_request``."""
    if not requests:
        return True
    main = result_request.split("/", 1)[0]
    return any(name in (result_request, main) for name in requests)


def _merge_mps(base: MpsConfig | None, over: MpsConfig | None) -> MpsConfig | None:
    if base is None or over is None:
        return over if base is None else base
    return MpsConfig(
        compute_percent=(
            base.compute_percent if over.compute_percent is None else over.compute_percent
        ),
        memory_limit_bytes=(
            base.memory_limit_bytes if over.memory_limit_bytes is None else over.memory_limit_bytes
        ),
        memory_soft_limit_bytes=(
            base.memory_soft_limit_bytes
            if over.memory_soft_limit_bytes is None
            else over.memory_soft_limit_bytes
        ),
    )


def _merge_time_slicing(
    base: TimeSlicingConfig | None, over: TimeSlicingConfig | None
) -> TimeSlicingConfig | None:
    if base is None or over is None:
        return over if base is None else base
    return TimeSlicingConfig(interval=base.interval if over.interval is None else over.interval)


def merge_gpu_configs(base: GpuConfig, over: GpuConfig) -> GpuConfig:
    """``over`` on top of ``base``, field by field; absent never resets."""
    return GpuConfig(
        mps=_merge_mps(base.mps, over.mps),
        time_slicing=_merge_time_slicing(base.time_slicing, over.time_slicing),
        mig=over.mig if over.mig is not None else base.mig,
    )


def _grant_mismatch(grant: GpuShareGrant, result: DeviceResult) -> str | None:
    if grant.device != result.device:
        return f"it is for device {grant.device}, not this result's {result.device}"
    if result.share_id is not None and grant.share_id.lower() != result.share_id.lower():
        return f"it is for share {grant.share_id}, not this result's {result.share_id}"
    return None


def effective_config(
    result: DeviceResult,
    configs: Sequence[OpaqueConfig],
    driver_name: str = DEFAULT_DRIVER_NAME,
) -> EffectiveConfig:
    """Select, decode and merge the entries of ``configs`` that apply to ``result``.

    Raises :class:`InvalidConfigError` for a malformed entry that applies, an
    unknown ``source``, or two trusted grants.
    """
    ours: list[tuple[int, OpaqueConfig]] = []
    for index, config in enumerate(configs):
        if config.driver != driver_name or not applies_to(config.requests, result.request):
            continue
        if config.source not in _SOURCES:
            raise InvalidConfigError(
                f"devices.config[{index}]: source {config.source!r} is unknown;"
                f" allowed: {', '.join(_SOURCES)}",
                field="source",
            )
        ours.append((index, config))
    ours.sort(key=lambda entry: entry[1].source != FROM_CLASS)  # stable: class first

    merged = GpuConfig()
    shares: list[GpuShare] = []
    grant: tuple[int, GpuShareGrant] | None = None
    ignored: list[IgnoredConfig] = []
    for index, config in ours:
        try:
            obj = decode_config(config.parameters, driver_name)
        except InvalidConfigError as err:
            raise InvalidConfigError(
                f"devices.config[{index}] ({config.source}): {err}", field=err.field
            ) from err
        match obj:
            case GpuConfig():
                merged = merge_gpu_configs(merged, obj)
            case GpuShare():
                shares.append(obj)
            case GpuShareGrant():
                if config.source != FROM_CLAIM:
                    reason = (
                        f"a {Kind.GPU_SHARE_GRANT} is trusted only in the allocation's"
                        f" {FROM_CLAIM} configs (the controller writes it), not {config.source}"
                    )
                    ignored.append(IgnoredConfig(index, config.source, reason))
                elif (mismatch := _grant_mismatch(obj, result)) is not None:
                    ignored.append(IgnoredConfig(index, config.source, mismatch))
                elif grant is not None:
                    raise InvalidConfigError(
                        f"devices.config[{grant[0]}] and devices.config[{index}]: two"
                        f" {Kind.GPU_SHARE_GRANT}s for device {result.device}"
                        f" share {result.share_id or obj.share_id}; allowed: exactly one"
                        " per allocation result"
                    )
                else:
                    grant = (index, obj)
    return EffectiveConfig(
        gpu=merged,
        shares=tuple(shares),
        grant=None if grant is None else grant[1],
        ignored=tuple(ignored),
    )


def trusted_grant(
    result: DeviceResult,
    configs: Sequence[OpaqueConfig],
    driver_name: str = DEFAULT_DRIVER_NAME,
) -> GpuShareGrant | None:
    """The ``GpuShareGrant`` the node trusts for ``result`` (:func:`effective_config`'s
    rules), or None: what names a share whose ``shareID`` the API dropped."""
    return effective_config(result, configs, driver_name).grant


def _capacity(consumed: Mapping[str, str], key: str, absent: int, device: str) -> int:
    if key not in consumed:
        return absent
    try:
        return parse_whole(consumed[key])
    except ValueError as err:
        raise InvalidConfigError(
            f"consumedCapacity {key} {consumed[key]!r} of {device} is not a whole number;"
            " allowed: a whole quantity",
            field=f"consumedCapacity.{key}",
        ) from err


def granted_limits(
    result: DeviceResult, grant: GpuShareGrant | None, total_memory_bytes: int
) -> Limits:
    """What the allocation granted ``result`` on a GPU with ``total_memory_bytes``.

    ``consumedCapacity`` (keys ``memory``, ``computePercent``; a key that is
    absent means all memory / no SM cap) when the result has one, else ``grant``,
    else the whole GPU (``computePercent`` 100).
    """
    device = result.device
    if grant is not None and grant.device != device:
        raise InvalidConfigError(
            f"{Kind.GPU_SHARE_GRANT} for {grant.device} given for a result on {device};"
            f" allowed: a grant for {device}",
            field="device",
        )
    if result.consumed_capacity:
        cc = result.consumed_capacity
        limits = Limits(
            memory_bytes=_capacity(cc, "memory", total_memory_bytes, device),
            compute_percent=_capacity(cc, "computePercent", 0, device),
            device=device,
            origin=LimitsOrigin.CONSUMED_CAPACITY,
        )
        if grant is not None and (grant.memory_bytes, grant.compute_percent) != (
            limits.memory_bytes,
            limits.compute_percent,
        ):
            raise InvalidConfigError(
                f"{Kind.GPU_SHARE_GRANT} ({format_bytes(grant.memory_bytes)},"
                f" computePercent {grant.compute_percent}) disagrees with consumedCapacity"
                f" ({format_bytes(limits.memory_bytes)}, computePercent"
                f" {limits.compute_percent}) on {device}; allowed: equal values"
            )
    elif grant is not None:
        limits = Limits(
            memory_bytes=grant.memory_bytes,
            compute_percent=grant.compute_percent,
            device=device,
            origin=LimitsOrigin.GRANT,
        )
    else:
        return Limits(total_memory_bytes, 100, device, LimitsOrigin.WHOLE_GPU)
    if not 0 < limits.memory_bytes <= total_memory_bytes:
        raise InvalidConfigError(
            f"the allocation grants {format_bytes(limits.memory_bytes)} ({limits.origin})"
            f" on {device}, which has {format_bytes(total_memory_bytes)}; allowed: 1 byte"
            f" to {format_bytes(total_memory_bytes)}",
            field="memory",
        )
    if not 0 <= limits.compute_percent <= 100:
        raise InvalidConfigError(
            f"the allocation grants computePercent {limits.compute_percent}"
            f" ({limits.origin}) on {device}; allowed: 0 to 100",
            field="computePercent",
        )
    return limits


def _on(granted: Limits) -> str:
    return f" on {granted.device}" if granted.device else ""


def apply_overrides(granted: Limits, config: GpuConfig) -> Limits:
    """``granted`` lowered by ``config.mps``; asking for more is an :class:`InvalidConfigError`.

    ``mps.memorySoftLimit`` becomes :attr:`Limits.soft_memory_bytes`; one above the
    hard limit (the granted memory after any ``mps.memoryLimit``) is an error too.
    """
    if config.mps is None:
        return granted
    memory, percent = granted.memory_bytes, granted.compute_percent
    limit = config.mps.memory_limit_bytes
    if limit is not None:
        if limit > granted.memory_bytes:
            have = format_bytes(granted.memory_bytes)
            raise invalid(
                Kind.GPU_CONFIG,
                "mps.memoryLimit",
                f"{format_bytes(limit)} exceeds the {have} this claim was granted{_on(granted)}",
                f"1 to {have} (a config may only lower what was granted)",
            )
        memory = limit
    wanted = config.mps.compute_percent
    if wanted is not None:
        cap = granted.effective_compute_percent
        if wanted > cap:
            raise invalid(
                Kind.GPU_CONFIG,
                "mps.computePercent",
                f"{wanted} exceeds the {cap} this claim was granted{_on(granted)}",
                f"1 to {cap} (a config may only lower what was granted)",
            )
        percent = wanted
    soft = config.mps.memory_soft_limit_bytes
    if soft is not None and soft > memory:
        hard_is = (
            "mps.memoryLimit" if limit is not None else f"what this claim was granted{_on(granted)}"
        )
        raise soft_limit_above_hard(soft, memory, hard_is)
    return Limits(memory, percent, granted.device, granted.origin, soft_memory_bytes=soft)


def limits_for(result: DeviceResult, effective: EffectiveConfig, total_memory_bytes: int) -> Limits:
    """``granted_limits`` then ``apply_overrides``: what ``result`` may use."""
    return apply_overrides(
        granted_limits(result, effective.grant, total_memory_bytes), effective.gpu
    )
