"""Strict decoding of one opaque ``parameters`` object, and its encoding.

What users write is decoded strictly (STYLE 4): an unknown ``apiVersion``,
``kind`` or field, a JSON value of the wrong type, or a value out of range is an
:class:`InvalidConfigError` that names the field path (``mps.computePercent``)
and lists what is allowed. Decisions:

* ``apiVersion`` must be exactly ``<driver name>/v1alpha1``; the driver name is
  a parameter because it is configurable.
* Integers must be JSON integers (``true`` and ``25.0`` are refused).
  Quantities (``memory``, ``memoryLimit``, ``memorySoftLimit``) accept a Kubernetes quantity string
  (``"10Gi"``) or a JSON integer (bytes), and must be whole bytes.
* ``null`` is not "absent": a section or field written as ``null`` is refused
  as the wrong type, so a typo cannot silently drop a limit.
* There is no field for the sharing strategy: it is the GPU's (a node setting);
  writing ``sharing`` or ``strategy`` gets a message saying so.

:func:`encode_config` is the inverse (canonical quantities via
:func:`~dra_driver.base.quantity.format_bytes`); the controller uses it to write
a :class:`GpuShareGrant`, and ``decode_config(encode_config(x)) == x``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dra_driver.api.types import (
    DEFAULT_DRIVER_NAME,
    ApiObject,
    GpuConfig,
    GpuShare,
    GpuShareGrant,
    Kind,
    MigConfig,
    MpsConfig,
    TimeSliceInterval,
    TimeSlicingConfig,
    api_version,
)
from dra_driver.api.validate import invalid, validate
from dra_driver.base.errors import InvalidConfigError
from dra_driver.base.quantity import format_bytes, parse_whole

_HEADER = ("apiVersion", "kind")
_FIELDS: dict[Kind, tuple[str, ...]] = {
    Kind.GPU_CONFIG: ("mig", "mps", "timeSlicing"),
    Kind.GPU_SHARE: ("computePercent", "memory"),
    Kind.GPU_SHARE_GRANT: ("computePercent", "device", "memory", "shareID"),
}
_MPS_FIELDS = ("computePercent", "memoryLimit", "memorySoftLimit")
_TIME_SLICING_FIELDS = ("interval",)
_STRATEGY_HINT = (
    "none: the sharing strategy is the GPU's (a node setting, published as the"
    " device attribute 'sharing'), never a claim's"
)
_JSON_TYPES: tuple[tuple[type | tuple[type, ...], str], ...] = (
    (bool, "a boolean"),  # before int: a bool is an int
    ((int, float), "a number"),
    (str, "a string"),
    (Mapping, "an object"),
    ((list, tuple), "a list"),
)
_QUANTITY_ALLOWED = "a quantity string such as 10Gi or 512Mi, or an integer number of bytes"


def _json_type(value: object) -> str:
    if value is None:
        return "null"
    for types, name in _JSON_TYPES:
        if isinstance(value, types):
            return name
    return type(value).__name__


def _object(kind: Kind, path: str, value: object, fields: tuple[str, ...]) -> Mapping[str, Any]:
    """``value`` as an object whose keys are all in ``fields``."""
    if not isinstance(value, Mapping):
        raise invalid(kind, path, f"expected an object, got {_json_type(value)}", "an object")
    for key in sorted(value, key=str):
        if key in fields:
            continue
        full = f"{path}.{key}" if path else str(key)
        if key in ("sharing", "strategy"):
            raise invalid(kind, full, "unknown field", _STRATEGY_HINT)
        where = f"fields of {path}" if path else f"fields of {kind}"
        allowed = f"{where}: {', '.join(fields)}" if fields else f"no fields in {path} (reserved)"
        raise invalid(kind, full, "unknown field", allowed)
    return value


def _int(kind: Kind, path: str, value: object, allowed: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise invalid(kind, path, f"expected an integer, got {_json_type(value)}", allowed)
    return value


def _quantity(kind: Kind, path: str, value: object) -> int:
    try:
        return parse_whole(value)
    except ValueError as err:
        raise invalid(
            kind, path, f"{value!r} is not a whole number of bytes", _QUANTITY_ALLOWED
        ) from err


def _string(kind: Kind, path: str, value: object, allowed: str) -> str:
    if not isinstance(value, str):
        raise invalid(kind, path, f"expected a string, got {_json_type(value)}", allowed)
    return value


def _required(kind: Kind, body: Mapping[str, Any], name: str, allowed: str) -> object:
    if name not in body:
        raise invalid(kind, name, "required field is missing", allowed)
    return body[name]


def _decode_gpu_config(body: Mapping[str, Any]) -> GpuConfig:
    kind = Kind.GPU_CONFIG
    mps = time_slicing = mig = None
    if "mps" in body:
        raw = _object(kind, "mps", body["mps"], _MPS_FIELDS)
        percent = memory = soft = None
        if "computePercent" in raw:
            percent = _int(kind, "mps.computePercent", raw["computePercent"], "1 to 100")
        if "memoryLimit" in raw:
            memory = _quantity(kind, "mps.memoryLimit", raw["memoryLimit"])
        if "memorySoftLimit" in raw:
            soft = _quantity(kind, "mps.memorySoftLimit", raw["memorySoftLimit"])
        mps = MpsConfig(
            compute_percent=percent, memory_limit_bytes=memory, memory_soft_limit_bytes=soft
        )
    if "timeSlicing" in body:
        raw = _object(kind, "timeSlicing", body["timeSlicing"], _TIME_SLICING_FIELDS)
        interval = None
        if "interval" in raw:
            names = ", ".join(TimeSliceInterval)
            text = _string(kind, "timeSlicing.interval", raw["interval"], names)
            if text not in TimeSliceInterval.__members__.values():
                raise invalid(kind, "timeSlicing.interval", f"{text!r} is not an interval", names)
            interval = TimeSliceInterval(text)
        time_slicing = TimeSlicingConfig(interval=interval)
    if "mig" in body:
        _object(kind, "mig", body["mig"], ())
        mig = MigConfig()
    return GpuConfig(mps=mps, time_slicing=time_slicing, mig=mig)


def _decode_gpu_share(body: Mapping[str, Any]) -> GpuShare:
    kind = Kind.GPU_SHARE
    memory = _quantity(kind, "memory", _required(kind, body, "memory", _QUANTITY_ALLOWED))
    percent = _int(kind, "computePercent", body.get("computePercent", 0), "0 to 100")
    return GpuShare(memory_bytes=memory, compute_percent=percent)


def _decode_gpu_share_grant(body: Mapping[str, Any]) -> GpuShareGrant:
    kind = Kind.GPU_SHARE_GRANT
    device = _string(kind, "device", _required(kind, body, "device", "a device name"), "a name")
    share_id = _string(kind, "shareID", _required(kind, body, "shareID", "a UUID"), "a UUID")
    memory = _quantity(kind, "memory", _required(kind, body, "memory", _QUANTITY_ALLOWED))
    raw_percent = _required(kind, body, "computePercent", "0 to 100")
    percent = _int(kind, "computePercent", raw_percent, "0 to 100")
    return GpuShareGrant(
        device=device, share_id=share_id, memory_bytes=memory, compute_percent=percent
    )


def decode_config(
    parameters: Mapping[str, Any], driver_name: str = DEFAULT_DRIVER_NAME
) -> ApiObject:
    """Decode, default and validate one opaque ``parameters`` object.

    Raises :class:`InvalidConfigError` naming the field and what is allowed.
    """
    expected = api_version(driver_name)
    kinds = ", ".join(Kind)
    if not isinstance(parameters, Mapping):
        raise InvalidConfigError(
            f"opaque parameters: expected an object, got {_json_type(parameters)};"
            f" allowed: an object with apiVersion {expected} and kind {kinds}"
        )
    if "apiVersion" not in parameters:
        raise invalid("opaque config", "apiVersion", "required field is missing", expected)
    version = parameters["apiVersion"]
    if version != expected:
        raise invalid("opaque config", "apiVersion", f"{version!r} is not supported", expected)
    if "kind" not in parameters:
        raise invalid("opaque config", "kind", "required field is missing", kinds)
    name = parameters["kind"]
    if name not in Kind.__members__.values():
        raise invalid("opaque config", "kind", f"unknown kind {name!r}", kinds)
    kind = Kind(name)
    body = {key: value for key, value in parameters.items() if key not in _HEADER}
    _object(kind, "", body, _FIELDS[kind])
    obj: ApiObject
    match kind:
        case Kind.GPU_CONFIG:
            obj = _decode_gpu_config(body)
        case Kind.GPU_SHARE:
            obj = _decode_gpu_share(body)
        case Kind.GPU_SHARE_GRANT:
            obj = _decode_gpu_share_grant(body)
    validate(obj)
    return obj


def encode_config(obj: ApiObject, driver_name: str = DEFAULT_DRIVER_NAME) -> dict[str, Any]:
    """``obj`` as the ``parameters`` object to write (absent sections and fields omitted)."""
    body: dict[str, Any]
    match obj:
        case GpuConfig():
            kind, body = Kind.GPU_CONFIG, {}
            if obj.mps is not None:
                mps: dict[str, Any] = {}
                if obj.mps.compute_percent is not None:
                    mps["computePercent"] = obj.mps.compute_percent
                if obj.mps.memory_limit_bytes is not None:
                    mps["memoryLimit"] = format_bytes(obj.mps.memory_limit_bytes)
                if obj.mps.memory_soft_limit_bytes is not None:
                    mps["memorySoftLimit"] = format_bytes(obj.mps.memory_soft_limit_bytes)
                body["mps"] = mps
            if obj.time_slicing is not None:
                interval = obj.time_slicing.interval
                body["timeSlicing"] = {} if interval is None else {"interval": str(interval)}
            if obj.mig is not None:
                body["mig"] = {}
        case GpuShare():
            kind = Kind.GPU_SHARE
            body = {
                "memory": format_bytes(obj.memory_bytes),
                "computePercent": obj.compute_percent,
            }
        case GpuShareGrant():
            kind = Kind.GPU_SHARE_GRANT
            body = {
                "device": obj.device,
                "shareID": obj.share_id,
                "memory": format_bytes(obj.memory_bytes),
                "computePercent": obj.compute_percent,
            }
    return {"apiVersion": api_version(driver_name), "kind": str(kind), **body}
