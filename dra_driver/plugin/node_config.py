"""Node settings from flags and an optional file (the Helm chart fills one per node).

File format (YAML or JSON); every key optional, flags give the defaults::

    sharing: mps            # mps | timeslicing | exclusive, for every GPU
    allocator: scheduler    # scheduler | controller
    tenancy: namespace      # namespace | cooperative (legacy MPS and MPS inside MIG)
    memoryReserve: 1Gi      # kept back from shares on each GPU
    memoryStep: 256Mi       # share granularity
    maxClients: 48          # shares per GPU
    gpus:                   # per-GPU overrides, by index or UUID
      "1": {sharing: exclusive}
      "3": {sharing: mps}   # on a MIG-enabled GPU: its MIG instances are MPS-shared
      GPU-5ed1b7c8-...: {allocator: controller}
      "4": {sharing: mps, tenancy: cooperative}  # claims of any namespace share its instances

``tenancy`` matters only where a GPU's MPS daemon cannot keep its clients apart
(legacy MPS; a MIG instance's daemon is always legacy): ``namespace`` (default)
lets it serve the claims of one Kubernetes namespace only, ``cooperative`` any
namespace's (:class:`~dra_driver.core.settings.Tenancy` says what that gives up).

The node-wide ``sharing`` applies to GPUs without MIG only; a MIG-enabled GPU's
instances are exclusive unless its own ``gpus`` entry says ``sharing: mps``
(``timeslicing`` there means exclusive instances: time-slicing inside a MIG
instance is not offered).

Unknown keys are errors that list the allowed ones: a typo must not silently
give a GPU the wrong strategy.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import yaml

from dra_driver.base.errors import ConfigError
from dra_driver.base.quantity import parse_whole
from dra_driver.core.settings import Allocator, GpuSettings, NodeSettings, Sharing, Tenancy

_TOP_KEYS = (
    "sharing",
    "allocator",
    "tenancy",
    "memoryReserve",
    "memoryStep",
    "maxClients",
    "gpus",
)
_GPU_KEYS = ("sharing", "allocator", "tenancy")


@dataclass(frozen=True)
class NodeFlags:
    """The node-setting flags as given on the command line (or their env twins)."""

    sharing: str = Sharing.MPS.value
    allocator: str = Allocator.SCHEDULER.value
    tenancy: str = Tenancy.NAMESPACE.value
    legacy_mps: bool = False
    """Whole GPUs' MPS daemons speak legacy MPS (resolved from ``--mps-protocol``)."""
    memory_reserve: str = "0"
    memory_step: str = "256Mi"
    max_clients: int = 48
    config_file: str | None = None


def _choice(enum: type[Sharing] | type[Allocator] | type[Tenancy], value: Any, where: str) -> Any:
    try:
        return enum(str(value))
    except ValueError:
        allowed = ", ".join(member.value for member in enum)
        raise ConfigError(f"{where}: {value!r} is not one of {allowed}") from None


def _bytes(value: Any, where: str) -> int:
    try:
        amount = parse_whole(str(value))
    except ValueError as err:
        raise ConfigError(f"{where}: {err}") from None
    if amount < 0:
        raise ConfigError(f"{where}: must not be negative")
    return amount


def _check_keys(doc: Mapping[str, Any], allowed: tuple[str, ...], where: str) -> None:
    unknown = sorted(set(doc) - set(allowed))
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {unknown}; allowed: {', '.join(allowed)}")


def _read(path: str) -> Mapping[str, Any]:
    try:
        with open(path, encoding="utf-8") as handle:
            doc = yaml.safe_load(handle) or {}
    except (OSError, yaml.YAMLError) as err:
        raise ConfigError(f"--node-config {path}: cannot read it: {err}") from err
    if not isinstance(doc, dict):
        raise ConfigError(f"--node-config {path}: expected a mapping at the top")
    return doc


def load_node_settings(flags: NodeFlags) -> NodeSettings:
    doc: Mapping[str, Any] = _read(flags.config_file) if flags.config_file else {}
    where = f"--node-config {flags.config_file}" if flags.config_file else "flags"
    _check_keys(doc, _TOP_KEYS, where)
    default = GpuSettings(
        sharing=_choice(Sharing, doc.get("sharing", flags.sharing), f"{where}: sharing"),
        allocator=_choice(Allocator, doc.get("allocator", flags.allocator), f"{where}: allocator"),
        tenancy=_choice(Tenancy, doc.get("tenancy", flags.tenancy), f"{where}: tenancy"),
    )
    per_gpu: dict[str, GpuSettings] = {}
    gpus = doc.get("gpus") or {}
    if not isinstance(gpus, dict):
        raise ConfigError(f"{where}: gpus must map a GPU index or UUID to its settings")
    for key, entry in gpus.items():
        at = f"{where}: gpus[{key!r}]"
        if not isinstance(entry, dict):
            raise ConfigError(f"{at}: expected a mapping with {', '.join(_GPU_KEYS)}")
        _check_keys(entry, _GPU_KEYS, at)
        sharing = _choice(Sharing, entry.get("sharing", default.sharing), f"{at}.sharing")
        per_gpu[str(key)] = GpuSettings(
            sharing=sharing,
            allocator=_choice(
                Allocator, entry.get("allocator", default.allocator), f"{at}.allocator"
            ),
            tenancy=_choice(Tenancy, entry.get("tenancy", default.tenancy), f"{at}.tenancy"),
            # Only this GPU's own explicit setting shares its MIG instances.
            mig_sharing=(
                Sharing.MPS if "sharing" in entry and sharing is Sharing.MPS else Sharing.EXCLUSIVE
            ),
        )
    step = _bytes(doc.get("memoryStep", flags.memory_step), f"{where}: memoryStep")
    if step <= 0:
        raise ConfigError(f"{where}: memoryStep must be positive, e.g. 256Mi")
    clients = doc.get("maxClients", flags.max_clients)
    if not isinstance(clients, int) or isinstance(clients, bool) or clients < 1:
        raise ConfigError(f"{where}: maxClients must be a positive integer, not {clients!r}")
    return NodeSettings(
        default=default,
        per_gpu=per_gpu,
        memory_reserve_bytes=_bytes(
            doc.get("memoryReserve", flags.memory_reserve), f"{where}: memoryReserve"
        ),
        memory_step_bytes=step,
        max_clients=clients,
        legacy_mps=flags.legacy_mps,
    )
