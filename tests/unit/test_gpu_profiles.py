"""The fake GPU profile files: they load, and their MIG geometry is self-consistent."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from dra_driver.base.errors import ConfigError
from dra_driver.core.model import MigPlacement, MigProfile
from dra_driver.fakes.gpu_models import (
    KNOWN_MODELS,
    GpuModel,
    MigGeometry,
    MigProfileSpec,
    load_models,
    parse_model,
    profile_files,
)

MIG_MODELS = ["a100-40gb", "a100-80gb", "h100-80gb", "h200-141gb"]

# (product name, memory MiB, architecture, compute capability) per model.
WHOLE_GPU = {
    "a100-40gb": ("NVIDIA A100-SXM4-40GB", 40960, "ampere", "8.0"),
    "a100-80gb": ("NVIDIA A100-SXM4-80GB", 81920, "ampere", "8.0"),
    "h100-80gb": ("NVIDIA H100 80GB HBM3", 81559, "hopper", "9.0"),
    "h200-141gb": ("NVIDIA H200", 143771, "hopper", "9.0"),
    "l4": ("NVIDIA L4", 23034, "ada", "8.9"),
}

# Profile names in nvidia-smi order; ids are 19, 20, 15, 14, 9, 5, 0 on every model.
PROFILE_IDS = [19, 20, 15, 14, 9, 5, 0]
PROFILE_NAMES = {
    "a100-40gb": ["1g.5gb", "1g.5gb+me", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"],
    "a100-80gb": ["1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"],
    "h100-80gb": ["1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"],
    "h200-141gb": [
        "1g.18gb", "1g.18gb+me", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb",
    ],
}  # fmt: skip

# (compute slices, memory slices, placement starts, instances that fit) per profile, in
# the same order: 1g, 1g+me, 1g double memory, 2g, 3g, 4g, 7g.
GEOMETRY = [
    (1, 1, [0, 1, 2, 3, 4, 5, 6], 7),
    (1, 1, [0, 1, 2, 3, 4, 5, 6], 1),
    (1, 2, [0, 2, 4, 6], 4),
    (2, 2, [0, 2, 4], 3),
    (3, 4, [0, 4], 2),
    (4, 4, [0], 1),
    (7, 8, [0], 1),
]

ENGINES = ("multiprocessors", "copy_engines", "decoders", "encoders", "jpeg_engines", "ofa_engines")


def geometry(key: str) -> MigGeometry:
    mig = KNOWN_MODELS[key].mig
    assert mig is not None
    return mig


def full_profile(key: str) -> MigProfile:
    (spec,) = [s for s in geometry(key).profiles if s.profile.compute_slices == 7]
    return spec.profile


def max_disjoint(placements: tuple[MigPlacement, ...]) -> int:
    """Most placements that fit at once (equal sizes: greedy by start is optimal)."""
    chosen: list[MigPlacement] = []
    for placement in sorted(placements, key=lambda p: p.start):
        if not any(placement.overlaps(c) for c in chosen):
            chosen.append(placement)
    return len(chosen)


def layouts(mig: MigGeometry) -> Iterator[list[MigProfileSpec]]:
    """Every set of instances the fake accepts: disjoint memory, compute and count limits."""
    options = [(spec, p) for spec in mig.profiles for p in spec.profile.placements]

    def extend(
        start: int, chosen: list[tuple[MigProfileSpec, MigPlacement]]
    ) -> Iterator[list[MigProfileSpec]]:
        yield [spec for spec, _ in chosen]
        for i in range(start, len(options)):
            spec, placement = options[i]
            if any(placement.overlaps(p) for _, p in chosen):
                continue
            if sum(s is spec for s, _ in chosen) >= spec.max_instances:
                continue
            compute = sum(s.profile.compute_slices for s, _ in chosen)
            if compute + spec.profile.compute_slices > mig.compute_slices:
                continue
            yield from extend(i + 1, [*chosen, (spec, placement)])

    yield from extend(0, [])


# --- every file loads ----------------------------------------------------------------


def test_every_profile_file_is_a_known_model() -> None:
    names = [f.name for f in profile_files()]
    assert names == [f"{key}.yaml" for key in sorted(WHOLE_GPU)]
    assert sorted(KNOWN_MODELS) == sorted(WHOLE_GPU)


@pytest.mark.parametrize("key", sorted(WHOLE_GPU))
def test_profile_file_loads(key: str) -> None:
    model = KNOWN_MODELS[key]
    product, memory_mib, architecture, capability = WHOLE_GPU[key]
    assert model.key == key
    assert model.product_name == product
    assert model.memory_mib == memory_mib
    assert model.memory_bytes == memory_mib * 1024 * 1024
    assert model.architecture == architecture
    assert model.cuda_compute_capability == capability
    assert model.driver_version == "580.65.06"
    assert model.cuda_driver_version == "13.0"
    assert model.mig_capable == (key in MIG_MODELS)


def test_load_models_from_given_files(tmp_path: Path) -> None:
    (tmp_path / "l4.yaml").write_text(profile_files()[-1].read_text(encoding="utf-8"))
    assert load_models([tmp_path / "l4.yaml"]) == {"l4": KNOWN_MODELS["l4"]}


def test_l4_has_no_mig() -> None:
    model = KNOWN_MODELS["l4"]
    assert model.mig is None
    assert not model.mig_capable
    assert model.mig_profiles == ()


# --- MIG geometry invariants -----------------------------------------------------------


@pytest.mark.parametrize("key", MIG_MODELS)
def test_slices(key: str) -> None:
    mig = geometry(key)
    assert (mig.compute_slices, mig.memory_slices) == (7, 8)


@pytest.mark.parametrize("key", MIG_MODELS)
def test_profile_ids_and_names(key: str) -> None:
    profiles = KNOWN_MODELS[key].mig_profiles
    assert [p.id for p in profiles] == PROFILE_IDS
    assert [p.name for p in profiles] == PROFILE_NAMES[key]
    assert geometry(key).profile_names == tuple(PROFILE_NAMES[key])
    assert geometry(key).profile(PROFILE_NAMES[key][4]) is geometry(key).profiles[4]
    assert geometry(key).profile("9g.1tb") is None


@pytest.mark.parametrize("key", MIG_MODELS)
def test_placements_and_instance_counts(key: str) -> None:
    mig = geometry(key)
    for spec, (compute, memory, starts, fit) in zip(mig.profiles, GEOMETRY, strict=True):
        profile = spec.profile
        assert profile.compute_slices == compute, profile.name
        assert profile.memory_slices == memory, profile.name
        assert [p.start for p in profile.placements] == starts, profile.name
        for placement in profile.placements:
            assert placement.size == profile.memory_slices, profile.name
            assert placement.start >= 0
            assert placement.start + placement.size <= mig.memory_slices, profile.name
        implied = min(
            max_disjoint(profile.placements), mig.compute_slices // profile.compute_slices
        )
        media_extension = profile.name.endswith("+me")
        assert implied == (7 if media_extension else fit), profile.name
        assert spec.max_instances == fit, profile.name


@pytest.mark.parametrize("key", MIG_MODELS)
def test_full_profile_has_every_engine(key: str) -> None:
    full = full_profile(key)
    assert full.memory_slices == 8
    for engine in ENGINES:
        most = max(getattr(p, engine) for p in KNOWN_MODELS[key].mig_profiles)
        assert getattr(full, engine) == most, engine


@pytest.mark.parametrize("key", MIG_MODELS)
def test_only_the_media_profiles_have_the_ofa(key: str) -> None:
    with_ofa = [p.name for p in KNOWN_MODELS[key].mig_profiles if p.ofa_engines]
    assert with_ofa == [PROFILE_NAMES[key][1], PROFILE_NAMES[key][6]]
    assert full_profile(key).ofa_engines == 1


@pytest.mark.parametrize("key", MIG_MODELS)
def test_profile_memory_fits_the_gpu(key: str) -> None:
    model = KNOWN_MODELS[key]
    for profile in model.mig_profiles:
        assert 0 < profile.memory_mib <= full_profile(key).memory_mib <= model.memory_mib


@pytest.mark.parametrize("key", MIG_MODELS)
def test_no_layout_exceeds_the_gpu(key: str) -> None:
    """Whatever mix of instances fits, it never uses more than the whole GPU has."""
    full = full_profile(key)
    count = 0
    for chosen in layouts(geometry(key)):
        count += 1
        for engine in (*ENGINES, "memory_mib"):
            used = sum(getattr(s.profile, engine) for s in chosen)
            assert used <= getattr(full, engine), (engine, [s.profile.name for s in chosen])
    assert count > 100  # the enumeration really explored mixes


def test_seven_small_instances_fill_the_gpu() -> None:
    mig = geometry("h100-80gb")
    assert max(len(chosen) for chosen in layouts(mig)) == 7


# --- loader errors -----------------------------------------------------------------------

GOOD = """\
productName: Test GPU
memoryMiB: 1000
architecture: hopper
cudaComputeCapability: "9.0"
driverVersion: "580.65.06"
cudaDriverVersion: "13.0"
migCapable: true
mig:
  computeSlices: 7
  memorySlices: 8
  profiles:
  - {id: 19, name: 1g.1gb, computeSlices: 1, memorySlices: 1, memoryMiB: 100,
     multiprocessors: 1, copyEngines: 1, decoders: 0, encoders: 0, jpegEngines: 0,
     ofaEngines: 0, maxInstances: 7, placements: [{start: 0, size: 1}, {start: 6, size: 1}]}
"""


def test_good_document_parses() -> None:
    model = parse_model(GOOD, "test", "test.yaml")
    assert isinstance(model, GpuModel)
    assert model.mig_profiles[0].placements == (MigPlacement(0, 1), MigPlacement(6, 1))


@pytest.mark.parametrize(
    ("old", "new", "fragment"),
    [
        pytest.param(
            '"9.0"', "9.0", "cudaComputeCapability must be a non-empty string", id="float-version"
        ),
        pytest.param("productName", "product", "unknown keys product", id="unknown-key"),
        pytest.param("hopper", "kepler", "architecture 'kepler' is not one of", id="arch"),
        pytest.param("migCapable: true", "migCapable: false", "'mig' section", id="capable"),
        pytest.param("memoryMiB: 1000", "memoryMiB: 10", "more memory than the GPU", id="mem"),
        pytest.param(
            "{start: 6, size: 1}",
            "{start: 6, size: 2}",
            "mig.profiles[0].placements[1].size is 2",
            id="placement-size",
        ),
        pytest.param(
            "{start: 6, size: 1}",
            "{start: 8, size: 1}",
            "placements[1]: start 8 + size 1 exceeds the 8 memory slices",
            id="placement-outside",
        ),
        pytest.param(
            "maxInstances: 7", "maxInstances: 0", "maxInstances must be an integer >= 1", id="max"
        ),
        pytest.param("memorySlices: 1,", "memorySlices: 9,", "memorySlices must be 1..8", id="ms"),
        pytest.param("mig:\n", "mig: [\n", "cannot parse it", id="yaml"),
    ],
)
def test_bad_document(old: str, new: str, fragment: str) -> None:
    assert old in GOOD
    with pytest.raises(ConfigError) as info:
        parse_model(GOOD.replace(old, new, 1), "test", "test.yaml")
    assert fragment in str(info.value)
    assert "GPU profile test.yaml" in str(info.value)


def test_duplicate_profile_name() -> None:
    profile = GOOD[GOOD.index("  - {") :]
    with pytest.raises(ConfigError, match=r"duplicate profile name 1g\.1gb"):
        parse_model(GOOD + profile.replace("id: 19", "id: 20"), "test", "test.yaml")
