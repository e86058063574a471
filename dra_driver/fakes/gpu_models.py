"""Known GPU models for the fake backend, read from ``fakes/gpu_profiles/*.yaml``.

One file per model, named by the key ``--fake-gpus`` uses (``h100-80gb.yaml``).
A file holds what NVML would report about an empty GPU of that model: product
name, total memory, architecture, compute capability, default driver versions
and, for MIG-capable models, the MIG geometry and every GPU-instance profile
with its possible placements. The loader rejects unknown keys and checks the
geometry (placements inside the memory slices, sizes matching the profile), so
a typo in a profile file fails at import, naming the file and the field.

The figures are public geometry or plausible values, not measurements (each
file's header says which); the NVML backend never reads these files.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from importlib import resources
from importlib.resources.abc import Traversable
from typing import Any

import yaml

from dra_driver.base.errors import ConfigError
from dra_driver.core.model import MigPlacement, MigProfile

MIB = 1024 * 1024

DEFAULT_DRIVER_VERSION = "580.65.06"
DEFAULT_CUDA_DRIVER_VERSION = "13.0"

ARCHITECTURES = ("ampere", "hopper", "ada", "blackwell")


@dataclass(frozen=True)
class MigProfileSpec:
    """A GPU-instance profile plus what NVML says about how many fit."""

    profile: MigProfile
    max_instances: int
    """NVML's ``instanceCount`` on an empty GPU (1 for the ``+me`` profiles,
    which share the GPU's only OFA engine)."""


@dataclass(frozen=True)
class MigGeometry:
    """How a MIG-capable model divides: slices and GPU-instance profiles."""

    compute_slices: int
    memory_slices: int
    profiles: tuple[MigProfileSpec, ...]

    def profile(self, name: str) -> MigProfileSpec | None:
        for spec in self.profiles:
            if spec.profile.name == name:
                return spec
        return None

    @property
    def profile_names(self) -> tuple[str, ...]:
        return tuple(spec.profile.name for spec in self.profiles)


@dataclass(frozen=True)
class GpuModel:
    key: str
    """Shorthand used by ``--fake-gpus``, e.g. ``h100-80gb``."""
    product_name: str
    """As ``nvmlDeviceGetName`` reports it."""
    memory_mib: int
    """Total memory as NVML reports it."""
    architecture: str = ""
    cuda_compute_capability: str = ""
    driver_version: str = DEFAULT_DRIVER_VERSION
    cuda_driver_version: str = DEFAULT_CUDA_DRIVER_VERSION
    mig: MigGeometry | None = None
    """None when the model cannot do MIG."""

    @property
    def memory_bytes(self) -> int:
        return self.memory_mib * MIB

    @property
    def mig_capable(self) -> bool:
        return self.mig is not None

    @property
    def mig_profiles(self) -> tuple[MigProfile, ...]:
        return tuple(spec.profile for spec in self.mig.profiles) if self.mig else ()


# --- loading -------------------------------------------------------------------------

_TOP_REQUIRED = (
    "productName",
    "memoryMiB",
    "architecture",
    "cudaComputeCapability",
    "driverVersion",
    "cudaDriverVersion",
    "migCapable",
)
_MIG_KEYS = ("computeSlices", "memorySlices", "profiles")
_PROFILE_INTS = (
    "id",
    "computeSlices",
    "memorySlices",
    "memoryMiB",
    "multiprocessors",
    "copyEngines",
    "decoders",
    "encoders",
    "jpegEngines",
    "ofaEngines",
    "maxInstances",
)
_PROFILE_KEYS = ("name", *_PROFILE_INTS, "placements")


def _child(where: str, key: str) -> str:
    """``GPU profile x.yaml`` + ``mig`` → ``GPU profile x.yaml: mig``; deeper levels use dots."""
    return f"{where}.{key}" if ": " in where else f"{where}: {key}"


def _mapping(
    value: object, where: str, required: Iterable[str], optional: Iterable[str] = ()
) -> Mapping[str, Any]:
    required = tuple(required)
    allowed = (*required, *optional)
    if not isinstance(value, dict):
        raise ConfigError(f"{where} must be a mapping with keys {', '.join(allowed)}")
    unknown = sorted(str(k) for k in value if k not in allowed)
    if unknown:
        raise ConfigError(
            f"{where}: unknown keys {', '.join(unknown)}; allowed: {', '.join(allowed)}"
        )
    missing = [k for k in required if k not in value]
    if missing:
        raise ConfigError(f"{where}: missing {', '.join(missing)}")
    return value


def _int(doc: Mapping[str, Any], key: str, where: str, minimum: int = 0) -> int:
    value = doc[key]
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ConfigError(f"{_child(where, key)} must be an integer >= {minimum}, not {value!r}")
    return value


def _str(doc: Mapping[str, Any], key: str, where: str) -> str:
    value = doc[key]
    if not isinstance(value, str) or not value:
        # YAML reads an unquoted 9.0 as a float: say how to fix it.
        raise ConfigError(
            f"{_child(where, key)} must be a non-empty string (quote it), not {value!r}"
        )
    return value


def _profile(raw: object, where: str, geometry: tuple[int, int]) -> MigProfileSpec:
    compute_slices, memory_slices = geometry
    doc = _mapping(raw, where, _PROFILE_KEYS)
    ints = {key: _int(doc, key, where) for key in _PROFILE_INTS}
    size = ints["memorySlices"]
    if not 1 <= size <= memory_slices:
        raise ConfigError(f"{where}.memorySlices must be 1..{memory_slices}, not {size}")
    if not 1 <= ints["computeSlices"] <= compute_slices:
        raise ConfigError(
            f"{where}.computeSlices must be 1..{compute_slices}, not {ints['computeSlices']}"
        )
    if not isinstance(doc["placements"], list) or not doc["placements"]:
        raise ConfigError(f"{where}.placements must be a non-empty list of {{start, size}}")
    placements = []
    for i, item in enumerate(doc["placements"]):
        at = f"{where}.placements[{i}]"
        place = _mapping(item, at, ("start", "size"))
        start, placed = _int(place, "start", at), _int(place, "size", at, minimum=1)
        if placed != size:
            raise ConfigError(f"{at}.size is {placed}; the profile's memorySlices is {size}")
        if start + size > memory_slices:
            raise ConfigError(
                f"{at}: start {start} + size {size} exceeds the {memory_slices} memory slices"
            )
        placements.append(MigPlacement(start=start, size=size))
    return MigProfileSpec(
        profile=MigProfile(
            id=ints["id"],
            name=_str(doc, "name", where),
            compute_slices=ints["computeSlices"],
            memory_mib=ints["memoryMiB"],
            multiprocessors=ints["multiprocessors"],
            copy_engines=ints["copyEngines"],
            decoders=ints["decoders"],
            encoders=ints["encoders"],
            jpeg_engines=ints["jpegEngines"],
            ofa_engines=ints["ofaEngines"],
            placements=tuple(placements),
        ),
        max_instances=_int(doc, "maxInstances", where, minimum=1),
    )


def _geometry(raw: object, where: str) -> MigGeometry:
    doc = _mapping(raw, where, _MIG_KEYS)
    compute_slices = _int(doc, "computeSlices", where, minimum=1)
    memory_slices = _int(doc, "memorySlices", where, minimum=1)
    if not isinstance(doc["profiles"], list) or not doc["profiles"]:
        raise ConfigError(f"{where}.profiles must be a non-empty list")
    profiles = tuple(
        _profile(item, f"{where}.profiles[{i}]", (compute_slices, memory_slices))
        for i, item in enumerate(doc["profiles"])
    )
    for kind, values in (
        ("id", [str(p.profile.id) for p in profiles]),
        ("name", [p.profile.name for p in profiles]),
    ):
        duplicates = sorted({v for v in values if values.count(v) > 1})
        if duplicates:
            raise ConfigError(f"{where}.profiles: duplicate profile {kind} {', '.join(duplicates)}")
    return MigGeometry(compute_slices, memory_slices, profiles)


def parse_model(text: str, key: str, source: str) -> GpuModel:
    """Parse one profile file's ``text`` into the model ``key``; ``source`` names it in errors."""
    where = f"GPU profile {source}"
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise ConfigError(f"{where}: cannot parse it: {err}") from err
    doc = _mapping(raw, where, _TOP_REQUIRED, ("mig",))
    architecture = _str(doc, "architecture", where)
    if architecture not in ARCHITECTURES:
        raise ConfigError(
            f"{where}: architecture {architecture!r} is not one of {', '.join(ARCHITECTURES)}"
        )
    capable = doc["migCapable"]
    if not isinstance(capable, bool):
        raise ConfigError(f"{where}: migCapable must be true or false, not {capable!r}")
    if capable != ("mig" in doc):
        raise ConfigError(f"{where}: a 'mig' section is required exactly when migCapable is true")
    memory_mib = _int(doc, "memoryMiB", where, minimum=1)
    geometry = _geometry(doc["mig"], f"{where}: mig") if capable else None
    if geometry:
        too_big = [p.profile.name for p in geometry.profiles if p.profile.memory_mib > memory_mib]
        if too_big:
            raise ConfigError(
                f"{where}: profiles {', '.join(too_big)} have more memory than the GPU "
                f"({memory_mib} MiB)"
            )
    return GpuModel(
        key=key,
        product_name=_str(doc, "productName", where),
        memory_mib=memory_mib,
        architecture=architecture,
        cuda_compute_capability=_str(doc, "cudaComputeCapability", where),
        driver_version=_str(doc, "driverVersion", where),
        cuda_driver_version=_str(doc, "cudaDriverVersion", where),
        mig=geometry,
    )


def profile_files() -> list[Traversable]:
    """The packaged profile files, sorted by name."""
    folder = resources.files("dra_driver.fakes").joinpath("gpu_profiles")
    return sorted((f for f in folder.iterdir() if f.name.endswith(".yaml")), key=lambda f: f.name)


def load_models(files: Iterable[Traversable] | None = None) -> dict[str, GpuModel]:
    """Models keyed by file name without ``.yaml``; the packaged files by default."""
    models: dict[str, GpuModel] = {}
    for file in profile_files() if files is None else files:
        key = file.name.removesuffix(".yaml")
        models[key] = parse_model(file.read_text(encoding="utf-8"), key, f"{key}.yaml")
    return models


KNOWN_MODELS: dict[str, GpuModel] = load_models()
"""Every model the fake backend knows, by ``--fake-gpus`` key."""
