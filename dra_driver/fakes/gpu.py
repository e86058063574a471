"""Fake GPU backend: GPUs described by a shorthand or a file, no hardware needed.

Used by the demo, tests and kind CI. Each GPU is one of the models in
``fakes/gpu_profiles/`` (see :mod:`dra_driver.fakes.gpu_models`) and reports what NVML
would: product name, memory, architecture, versions, PCI bus id and, for
MIG-capable models, MIG mode, profiles and existing MIG devices.

The shorthand is ``MODEL[:COUNT[:mig]]`` items separated by commas; ``:mig``
turns MIG mode on for those GPUs (``MODEL:mig`` is short for ``MODEL:1:mig``).
Two H100s with MIG off and one with MIG on::

    h100-80gb:2,h100-80gb:1:mig

A file (YAML or JSON, named by a path with a ``/`` or a .yaml/.yml/.json
extension) lists GPUs explicitly; every key but ``model`` is optional::

    gpus:
    - model: h100-80gb
      uuid: GPU-00000000-0000-0000-0000-000000000001  # default: derived, see below
      minor: 4                 # /dev/nvidia4; default: the GPU's index
      mig: true                # MIG mode now (default false)
      migPending: true         # MIG mode after the next GPU reset (default: = mig)
      migInstances:            # MIG devices that exist already (needs mig: true)
      - {profile: 3g.40gb, start: 0}
      - {profile: 1g.10gb, start: 4}
    - model: l4

UUIDs default to a deterministic value derived from the node name and index,
so two nodes never share one and a restart keeps them stable. A pre-existing
MIG device gets GPU-instance id 1, 2, ... in listing order, compute-instance
id 0, and a MIG UUID derived from its GPU's UUID and GI id. As with NVML, a
GPU lists its MIG profiles only while MIG mode is enabled.

Dynamic MIG: :meth:`FakeGpuBackend.create_mig_device` and
:meth:`~FakeGpuBackend.destroy_mig_device` change the inventory as NVML would
change the GPU. A new GPU instance gets the lowest unused GI id from 1,
compute-instance id 0 and the :func:`fake_mig_uuid` of its GPU and GI id.
Creation checks what NVML checks: MIG on, a known profile, one of its
placements, no overlap with an existing instance, the profile's instance
limit and the GPU's compute slices; :meth:`FakeGpuBackend.fail_next_create`
makes the next creation fail, for tests.

Health: :meth:`FakeGpuBackend.inject_xid` reports an XID as NVML would;
:meth:`~FakeGpuBackend.mark_lost` makes the liveness probe find a GPU gone
(fallen off the bus) until :meth:`~FakeGpuBackend.restore`;
:meth:`~FakeGpuBackend.inject_reset` resets a GPU as the hardware does: the
next probe finds it unreachable, the one after answers again. The inventory
keeps listing a lost GPU (NVML would fail the whole discovery instead).
With ``health_dir`` the same faults come from files dropped in a directory, for
a plugin running elsewhere (a pod on kind): see :mod:`dra_driver.fakes.gpu_faults`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import uuid
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import yaml

from dra_driver.base.errors import ConfigError, InventoryError, MigPlacementBusyError
from dra_driver.base.ids import GpuUUID, MigUUID
from dra_driver.core.model import (
    GpuInfo,
    HealthEvent,
    Inventory,
    MigDevice,
    MigPlacement,
    MigProfile,
)
from dra_driver.fakes.gpu_faults import (
    POLL_S,
    Fault,
    FaultDirWatcher,
    FaultKind,
    describe,
    gpu_index,
    mig_uuid,
)
from dra_driver.fakes.gpu_models import KNOWN_MODELS, GpuModel, MigGeometry, MigProfileSpec

_UUID_NAMESPACE = uuid.UUID("5b3f0c8e-1d7a-4c62-9a0e-6f1f2b9d7c41")

_ENTRY_KEYS = ("model", "uuid", "minor", "mig", "migPending", "migInstances")
_INSTANCE_KEYS = ("profile", "start")
_SHORTHAND = "MODEL[:COUNT[:mig]]"


def _model(key: str, where: str) -> GpuModel:
    try:
        return KNOWN_MODELS[key.strip().lower()]
    except KeyError:
        raise ConfigError(
            f"{where}: unknown fake GPU model {key!r}; known models: {', '.join(KNOWN_MODELS)}"
        ) from None


def _mig_models() -> str:
    return ", ".join(key for key, model in KNOWN_MODELS.items() if model.mig_capable)


def _fake_uuid(node_name: str, index: int) -> GpuUUID:
    return GpuUUID(f"GPU-{uuid.uuid5(_UUID_NAMESPACE, f'{node_name}/{index}')}")


def fake_mig_uuid(gpu_uuid: str, gi_id: int, ci_id: int = 0) -> MigUUID:
    """The MIG UUID the fake gives the device (GI ``gi_id``, CI ``ci_id``) on ``gpu_uuid``."""
    return MigUUID(f"MIG-{uuid.uuid5(_UUID_NAMESPACE, f'{gpu_uuid}/{gi_id}/{ci_id}')}")


def fake_pci_bus_id(index: int) -> str:
    """A distinct, stable PCI bus id per GPU index: ``0000:18:00.0``, ``0000:28:00.0``, ...

    Bus numbers past 0xff continue in the next PCI domain.
    """
    domain, bus = divmod(0x18 + 0x10 * index, 0x100)
    return f"{domain:04x}:{bus:02x}:00.0"


# --- shorthand ---------------------------------------------------------------------------


def parse_shorthand(spec: str) -> list[Mapping[str, Any]]:
    """``h100-80gb:2,l4,a100-80gb:1:mig`` → one entry per GPU."""
    entries: list[Mapping[str, Any]] = []
    for item in filter(None, (part.strip() for part in spec.split(","))):
        parts = [part.strip() for part in item.split(":")]
        if len(parts) == 2 and parts[1].lower() == "mig":
            parts.insert(1, "1")
        if len(parts) > 3 or (len(parts) == 3 and parts[2].lower() != "mig"):
            raise ConfigError(f"--fake-gpus: {item!r} is not {_SHORTHAND}, e.g. h100-80gb:2:mig")
        key, count_text = parts[0], parts[1] if len(parts) > 1 else ""
        try:
            count = int(count_text) if count_text else 1
        except ValueError:
            raise ConfigError(
                f"--fake-gpus: {item!r} is not {_SHORTHAND}, e.g. h100-80gb:2"
            ) from None
        if count < 1:
            raise ConfigError(f"--fake-gpus: count in {item!r} must be at least 1")
        model = _model(key, "--fake-gpus")
        mig = len(parts) == 3
        if mig and not model.mig_capable:
            raise ConfigError(
                f"--fake-gpus: {item!r}: {model.key} ({model.product_name}) does not support "
                f"MIG; MIG-capable models: {_mig_models()}"
            )
        entries.extend({"model": key, "mig": True} if mig else {"model": key} for _ in range(count))
    if not entries:
        raise ConfigError("--fake-gpus: no GPUs given; use e.g. h100-80gb:2")
    return entries


# --- one GPU's description, validated ----------------------------------------------------


@dataclass(frozen=True)
class _Instance:
    spec: MigProfileSpec
    start: int

    @property
    def placement(self) -> MigPlacement:
        return MigPlacement(start=self.start, size=self.spec.profile.memory_slices)

    def __str__(self) -> str:
        first, last = self.start, self.start + self.spec.profile.memory_slices - 1
        slices = f"memory slice {first}" if first == last else f"memory slices {first}-{last}"
        return f"{self.spec.profile.name} at start {self.start} ({slices})"


@dataclass(frozen=True)
class _GpuSpec:
    model: GpuModel
    uuid: str | None
    minor: int | None
    mig: bool
    mig_pending: bool
    instances: tuple[_Instance, ...]


def _bool(entry: Mapping[str, Any], key: str, where: str, default: bool) -> bool:
    value = entry.get(key, default)
    if not isinstance(value, bool):
        raise ConfigError(f"{where}.{key} must be true or false, not {value!r}")
    return value


def _instance(raw: object, model: GpuModel, geometry: MigGeometry, where: str) -> _Instance:
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{where} must be a mapping such as {{profile: 3g.40gb, start: 0}}")
    unknown = sorted(str(k) for k in raw if k not in _INSTANCE_KEYS)
    missing = [k for k in _INSTANCE_KEYS if k not in raw]
    if unknown or missing:
        raise ConfigError(
            f"{where} needs exactly the keys profile and start"
            + (f"; unknown: {', '.join(unknown)}" if unknown else "")
            + (f"; missing: {', '.join(missing)}" if missing else "")
        )
    name, start = raw["profile"], raw["start"]
    spec = geometry.profile(name) if isinstance(name, str) else None
    if spec is None:
        raise ConfigError(
            f"{where}.profile: {name!r} is not a MIG profile of {model.key}; "
            f"its profiles: {', '.join(geometry.profile_names)}"
        )
    starts = [p.start for p in spec.profile.placements]
    if not isinstance(start, int) or isinstance(start, bool) or start not in starts:
        raise ConfigError(
            f"{where}.start: {start!r} is not a placement of {spec.profile.name} on "
            f"{model.key}; allowed starts: {', '.join(map(str, starts))}"
        )
    return _Instance(spec=spec, start=start)


def _instances(raw: object, model: GpuModel, mig: bool, where: str) -> tuple[_Instance, ...]:
    """Validate ``migInstances``: known profiles, real placements, and a layout that fits."""
    if raw is None or raw == []:
        return ()
    where = f"{where}.migInstances"
    if not isinstance(raw, list):
        raise ConfigError(f"{where} must be a list of {{profile, start}}")
    geometry = model.mig
    if geometry is None:
        raise ConfigError(f"{where}: {model.key} ({model.product_name}) does not support MIG")
    if not mig:
        raise ConfigError(f"{where}: MIG devices exist only while MIG is enabled; set mig: true")
    instances: list[_Instance] = []
    used_compute = 0
    for j, item in enumerate(raw):
        at = f"{where}[{j}]"
        new = _instance(item, model, geometry, at)
        profile = new.spec.profile
        same = sum(1 for old in instances if old.spec is new.spec)
        if same >= new.spec.max_instances:
            raise ConfigError(
                f"{at}: at most {new.spec.max_instances} instance(s) of {profile.name} "
                f"fit on {model.key}"
            )
        for i, old in enumerate(instances):
            if old.placement.overlaps(new.placement):
                raise ConfigError(f"{at}: {new} overlaps migInstances[{i}], {old}")
        used_compute += profile.compute_slices
        if used_compute > geometry.compute_slices:
            raise ConfigError(
                f"{at}: {profile.name} would bring the GPU to {used_compute} compute slices; "
                f"{model.key} has {geometry.compute_slices}"
            )
        instances.append(new)
    return tuple(instances)


def _gpu_spec(entry: object, where: str) -> _GpuSpec:
    """Validate one ``gpus[i]`` entry; ``where`` names it in errors (``... gpus[2]``)."""
    if not isinstance(entry, Mapping) or "model" not in entry:
        raise ConfigError(f"{where} needs a 'model'")
    unknown = sorted(str(k) for k in entry if k not in _ENTRY_KEYS)
    if unknown:
        raise ConfigError(
            f"{where}: unknown keys {', '.join(unknown)}; allowed: {', '.join(_ENTRY_KEYS)}"
        )
    model = _model(str(entry["model"]), where)
    gpu_uuid = entry.get("uuid")
    if gpu_uuid is not None and (not isinstance(gpu_uuid, str) or not gpu_uuid):
        raise ConfigError(f"{where}.uuid must be a non-empty string, not {gpu_uuid!r}")
    minor = entry.get("minor")
    if minor is not None and (not isinstance(minor, int) or isinstance(minor, bool) or minor < 0):
        raise ConfigError(f"{where}.minor must be a non-negative integer, not {minor!r}")
    mig = _bool(entry, "mig", where, default=False)
    pending = _bool(entry, "migPending", where, default=mig)
    if (mig or pending) and not model.mig_capable:
        key = "mig" if mig else "migPending"
        raise ConfigError(
            f"{where}.{key}: {model.key} ({model.product_name}) does not support MIG; "
            f"MIG-capable models: {_mig_models()}"
        )
    return _GpuSpec(
        model=model,
        uuid=gpu_uuid,
        minor=minor,
        mig=mig,
        mig_pending=pending,
        instances=_instances(entry.get("migInstances"), model, mig, where),
    )


# --- files -------------------------------------------------------------------------------


def _looks_like_path(spec: str) -> bool:
    # So that a shorthand such as "l4" is never read from a file named l4.
    return "/" in spec or spec.endswith((".yaml", ".yml", ".json"))


def load_spec(spec: str) -> list[Mapping[str, Any]]:
    """A shorthand, or the path of a YAML/JSON file with a ``gpus`` list.

    A file is named by a path with a ``/`` or a .yaml/.yml/.json extension.
    Every entry is validated here, so errors name the file and ``gpus[i]``.
    """
    if not _looks_like_path(spec):
        return parse_shorthand(spec)
    if not os.path.isfile(spec):
        raise ConfigError(f"--fake-gpus file {spec} does not exist")
    try:
        with open(spec, encoding="utf-8") as handle:
            doc = yaml.safe_load(handle)
    except (OSError, yaml.YAMLError) as err:
        raise ConfigError(f"--fake-gpus file {spec}: cannot read it: {err}") from err
    gpus = doc.get("gpus") if isinstance(doc, dict) else None
    if not isinstance(gpus, list) or not gpus:
        raise ConfigError(f"--fake-gpus file {spec}: expected a non-empty 'gpus' list")
    for i, entry in enumerate(gpus):
        _gpu_spec(entry, f"--fake-gpus file {spec}: gpus[{i}]")
    return gpus


# --- inventory ---------------------------------------------------------------------------


def _gpu_info(spec: _GpuSpec, index: int, node_name: str) -> GpuInfo:
    model = spec.model
    gpu_uuid = GpuUUID(spec.uuid or _fake_uuid(node_name, index))
    devices = tuple(
        MigDevice(
            uuid=fake_mig_uuid(gpu_uuid, gi_id),
            gi_id=gi_id,
            ci_id=0,
            profile_id=instance.spec.profile.id,
            profile_name=instance.spec.profile.name,
            placement=instance.placement,
            memory_mib=instance.spec.profile.memory_mib,
        )
        for gi_id, instance in enumerate(spec.instances, start=1)
    )
    return GpuInfo(
        index=index,
        uuid=gpu_uuid,
        product_name=model.product_name,
        memory_bytes=model.memory_bytes,
        minor=index if spec.minor is None else spec.minor,
        architecture=model.architecture,
        cuda_compute_capability=model.cuda_compute_capability,
        driver_version=model.driver_version,
        cuda_driver_version=model.cuda_driver_version,
        pci_bus_id=fake_pci_bus_id(index),
        mig_capable=model.mig_capable,
        mig_enabled=spec.mig,
        mig_pending=spec.mig_pending,
        # NVML lists GPU-instance profiles only while MIG mode is on.
        mig_profiles=model.mig_profiles if spec.mig else (),
        mig_devices=devices,
    )


def build_inventory(entries: Iterable[Mapping[str, Any]], node_name: str) -> Inventory:
    """The inventory ``entries`` (from :func:`load_spec`, or written by hand) describe."""
    gpus = [
        _gpu_info(_gpu_spec(entry, f"--fake-gpus: gpus[{index}]"), index, node_name)
        for index, entry in enumerate(entries)
    ]
    return Inventory(gpus=tuple(gpus))


def _describe(device: MigDevice) -> str:
    first, last = device.placement.start, device.placement.start + device.placement.size - 1
    slices = f"memory slice {first}" if first == last else f"memory slices {first}-{last}"
    return f"{device.profile_name} GPU instance {device.gi_id} at start {first} ({slices})"


class FakeGpuBackend:
    """A :class:`~dra_driver.core.ports.GpuBackend` over a description, with dynamic MIG.

    ``health_dir``: a directory of fault-injection files
    (:mod:`~dra_driver.fakes.gpu_faults`), checked every ``health_poll_s`` from
    when :meth:`health_events` is first read until :meth:`close`.
    """

    def __init__(
        self,
        spec: str,
        node_name: str,
        *,
        health_dir: str | None = None,
        health_poll_s: float = POLL_S,
    ) -> None:
        entries = load_spec(spec)
        self._inventory = build_inventory(entries, node_name)
        self._models = [
            _gpu_spec(entry, f"--fake-gpus: gpus[{i}]").model for i, entry in enumerate(entries)
        ]
        self._events: asyncio.Queue[HealthEvent | None] = asyncio.Queue()
        self._next_create_error: Exception | None = None
        self._lost: dict[GpuUUID, str] = {}
        self._resetting: set[GpuUUID] = set()
        self.health_dir = health_dir
        self._health_poll_s = health_poll_s
        self._watcher: asyncio.Task[None] | None = None
        self._closed = False

    # -- dynamic MIG ---------------------------------------------------------

    def fail_next_create(self, error: Exception) -> None:
        """Make the next :meth:`create_mig_device` raise ``error`` (once), changing nothing."""
        self._next_create_error = error

    def _find(self, gpu_uuid: GpuUUID) -> tuple[int, GpuInfo]:
        for position, gpu in enumerate(self._inventory.gpus):
            if gpu.uuid == gpu_uuid:
                return position, gpu
        known = ", ".join(gpu.uuid for gpu in self._inventory.gpus)
        raise InventoryError(f"no GPU {gpu_uuid} on this node; its GPUs: {known}")

    def _store(self, position: int, gpu: GpuInfo) -> None:
        gpus = list(self._inventory.gpus)
        gpus[position] = gpu
        self._inventory = Inventory(gpus=tuple(gpus))

    async def create_mig_device(
        self, gpu_uuid: GpuUUID, profile_id: int, placement: MigPlacement
    ) -> MigDevice:
        if (error := self._next_create_error) is not None:
            self._next_create_error = None
            raise error
        position, gpu = self._find(gpu_uuid)
        where = f"GPU {gpu.index} ({gpu.uuid})"
        if not gpu.mig_enabled:
            raise InventoryError(
                f"{where}: cannot create a MIG device: MIG mode is disabled"
                + ("" if gpu.mig_capable else f" and {gpu.product_name} does not support MIG")
            )
        profile = next((p for p in gpu.mig_profiles if p.id == profile_id), None)
        if profile is None:
            known = ", ".join(f"{p.id} ({p.name})" for p in gpu.mig_profiles)
            raise InventoryError(
                f"{where}: no MIG profile with id {profile_id}; its profiles: {known}"
            )
        if placement not in profile.placements:
            allowed = ", ".join(f"{p.start}/{p.size}" for p in profile.placements)
            raise InventoryError(
                f"{where}: start {placement.start} size {placement.size} is not a placement of "
                f"{profile.name}; its placements (start/size): {allowed}"
            )
        for device in gpu.mig_devices:
            if device.profile_id == profile_id and device.placement == placement:
                return device  # made already (a retried prepare): the fake's CI always exists
        wanted = f"{profile.name} at start {placement.start} (size {placement.size})"
        for device in gpu.mig_devices:
            if device.placement.overlaps(placement):
                raise MigPlacementBusyError(
                    f"{where}: cannot create {wanted}: it overlaps the existing {_describe(device)}"
                )
        self._check_room(gpu, position, profile, where, wanted)
        used = {device.gi_id for device in gpu.mig_devices}
        gi_id = next(i for i in range(1, len(used) + 2) if i not in used)
        device = MigDevice(
            uuid=fake_mig_uuid(gpu.uuid, gi_id),
            gi_id=gi_id,
            ci_id=0,
            profile_id=profile.id,
            profile_name=profile.name,
            placement=placement,
            memory_mib=profile.memory_mib,
        )
        self._store(position, replace(gpu, mig_devices=(*gpu.mig_devices, device)))
        return device

    def _check_room(
        self, gpu: GpuInfo, position: int, profile: MigProfile, where: str, wanted: str
    ) -> None:
        """NVML's other refusals: the profile's instance limit and the GPU's compute slices."""
        geometry = self._models[position].mig
        if geometry is None:  # MIG enabled on a model without MIG cannot be built
            raise InventoryError(f"{where}: the fake model has no MIG geometry")
        spec = next(s for s in geometry.profiles if s.profile.id == profile.id)
        same = sum(1 for device in gpu.mig_devices if device.profile_id == profile.id)
        if same >= spec.max_instances:
            raise MigPlacementBusyError(
                f"{where}: cannot create {wanted}: at most {spec.max_instances} instance(s) of "
                f"{profile.name} fit and {same} exist"
            )
        slices = {p.id: p.compute_slices for p in gpu.mig_profiles}
        used = sum(slices.get(device.profile_id, 0) for device in gpu.mig_devices)
        if used + profile.compute_slices > geometry.compute_slices:
            raise MigPlacementBusyError(
                f"{where}: cannot create {wanted}: existing instances use {used} of "
                f"{geometry.compute_slices} compute slices and it needs {profile.compute_slices}"
            )

    async def destroy_mig_device(self, gpu_uuid: GpuUUID, gi_id: int) -> None:
        position, gpu = self._find(gpu_uuid)
        kept = tuple(device for device in gpu.mig_devices if device.gi_id != gi_id)
        if len(kept) != len(gpu.mig_devices):
            self._store(position, replace(gpu, mig_devices=kept))

    # -- health and lifecycle -------------------------------------------------

    def inject(self, event: HealthEvent) -> None:
        """Report ``event`` as if NVML had (tests, the demo)."""
        self._events.put_nowait(event)

    def inject_xid(
        self, gpu_index: int, xid: int, message: str = "", *, mig_uuid: MigUUID | None = None
    ) -> HealthEvent:
        """Report XID ``xid`` on the GPU at ``gpu_index`` (optionally on one of its MIG devices).

        Returns the event injected. Raises IndexError for an index or MIG UUID
        the fake does not have: that is a mistake in the test, not in the GPU.
        """
        gpu = self._gpu_at(gpu_index)
        if mig_uuid is not None and mig_uuid not in {d.uuid for d in gpu.mig_devices}:
            raise IndexError(f"GPU {gpu_index} ({gpu.uuid}) has no MIG device {mig_uuid}")
        event = HealthEvent(gpu_uuid=gpu.uuid, xid=xid, message=message, mig_uuid=mig_uuid)
        self.inject(event)
        return event

    def _gpu_at(self, gpu_index: int) -> GpuInfo:
        gpus: Sequence[GpuInfo] = self._inventory.gpus
        if not 0 <= gpu_index < len(gpus):
            raise IndexError(f"no fake GPU with index {gpu_index}; there are {len(gpus)}")
        return gpus[gpu_index]

    def mark_lost(
        self, gpu_index: int, why: str = "GPU is lost: it has fallen off the bus"
    ) -> GpuUUID:
        """Make the probe find the GPU at ``gpu_index`` unreachable until :meth:`restore`."""
        gpu = self._gpu_at(gpu_index)
        self._lost[gpu.uuid] = why
        return gpu.uuid

    def restore(self, gpu_index: int) -> GpuUUID:
        """The GPU answers again (after a reset or a reboot of the node)."""
        gpu = self._gpu_at(gpu_index)
        self._lost.pop(gpu.uuid, None)
        return gpu.uuid

    def inject_reset(self, gpu_index: int) -> GpuUUID:
        """Reset the GPU: the next probe finds it resetting, the one after answering."""
        gpu = self._gpu_at(gpu_index)
        self._resetting.add(gpu.uuid)
        return gpu.uuid

    async def probe(self) -> Mapping[GpuUUID, str | None]:
        results: dict[GpuUUID, str | None] = {}
        for gpu in self._inventory.gpus:
            if gpu.uuid in self._lost:
                results[gpu.uuid] = self._lost[gpu.uuid]
            elif gpu.uuid in self._resetting:
                self._resetting.discard(gpu.uuid)
                results[gpu.uuid] = "the GPU is being reset"
            else:
                results[gpu.uuid] = None
        return results

    # -- fault-injection files ----------------------------------------------

    def apply_fault(self, fault: Fault) -> str:
        """Apply one request of the fault directory; returns what was done, for the log.

        Raises FaultFileError for a GPU or MIG device the fake does not have.
        """
        gpus = self._inventory.gpus
        indexes = range(len(gpus)) if fault.gpu is None else [gpu_index(gpus, fault.gpu)]
        named = None if fault.gpu is None else gpus[indexes[0]].device_name
        if fault.kind is FaultKind.XID:
            (index,) = indexes
            mig = None if fault.mig is None else mig_uuid(gpus[index], fault.mig)
            self.inject_xid(index, fault.xid, fault.message, mig_uuid=mig)
            return describe(fault, named, mig)
        for index in indexes:
            if fault.kind is FaultKind.LOST:
                self.mark_lost(index, fault.message or "GPU is lost: it has fallen off the bus")
            elif fault.kind is FaultKind.RESTORE:
                self.restore(index)
            else:
                self.inject_reset(index)
        return describe(fault, named)

    def _start_watcher(self) -> None:
        if self.health_dir is None or self._watcher is not None or self._closed:
            return
        watcher = FaultDirWatcher(self.health_dir, self.apply_fault, self._health_poll_s)
        self._watcher = asyncio.create_task(watcher.run(), name="fake-health-dir")

    async def health_events(self) -> AsyncIterator[HealthEvent]:
        self._start_watcher()
        while (event := await self._events.get()) is not None:
            yield event

    @property
    def name(self) -> str:
        return "fake"

    # Capabilities (GpuBackend): fake GPUs have no device nodes, no driver, made-up
    # bus ids (no dmem regions) and no MIG capability files.
    @property
    def has_device_nodes(self) -> bool:
        return False

    @property
    def has_driver_files(self) -> bool:
        return False

    @property
    def supports_dmem(self) -> bool:
        return False

    @property
    def reads_mig_capabilities(self) -> bool:
        return False

    async def inventory(self) -> Inventory:
        return self._inventory

    async def close(self) -> None:
        self._closed = True
        if self._watcher is not None:
            self._watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watcher
            self._watcher = None
        self._events.put_nowait(None)
