"""The fake GPU backend: shorthand and file descriptions of GPUs."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import pytest

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
from dra_driver.fakes.gpu import (
    FakeGpuBackend,
    build_inventory,
    fake_mig_uuid,
    fake_pci_bus_id,
    load_spec,
    parse_shorthand,
)
from dra_driver.fakes.gpu_models import KNOWN_MODELS, GpuModel, MigGeometry, MigProfileSpec

GPU_UUID = re.compile(r"^GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
MIG_UUID = re.compile(r"^MIG-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


def inventory(spec: str, node: str = "node-a") -> Inventory:
    return build_inventory(load_spec(spec), node)


SHORTHAND_CASES = [
    pytest.param("h100-80gb:2,l4", ["h100-80gb", "h100-80gb", "l4"], id="count-and-default"),
    pytest.param("l4", ["l4"], id="single"),
    pytest.param("a100-40gb:1,a100-80gb:1", ["a100-40gb", "a100-80gb"], id="explicit-ones"),
    pytest.param(" H100-80GB : 2 , L4 ,", ["h100-80gb", "h100-80gb", "l4"], id="spaces-case"),
]


@pytest.mark.parametrize(("spec", "models"), SHORTHAND_CASES)
def test_shorthand(spec: str, models: list[str]) -> None:
    inv = inventory(spec)
    assert [g.index for g in inv.gpus] == list(range(len(models)))
    assert [g.device_name for g in inv.gpus] == [f"gpu-{i}" for i in range(len(models))]
    assert [g.minor for g in inv.gpus] == list(range(len(models)))
    assert [g.device_node for g in inv.gpus] == [f"/dev/nvidia{i}" for i in range(len(models))]
    assert [g.product_name for g in inv.gpus] == [KNOWN_MODELS[m].product_name for m in models]
    assert [g.memory_bytes for g in inv.gpus] == [
        KNOWN_MODELS[m].memory_mib * 1024 * 1024 for m in models
    ]
    assert all(GPU_UUID.match(g.uuid) for g in inv.gpus)
    assert len({g.uuid for g in inv.gpus}) == len(models)


def test_h100_figures() -> None:
    (gpu,) = inventory("h100-80gb").gpus
    assert gpu.product_name == "NVIDIA H100 80GB HBM3"
    assert gpu.memory_bytes == 81559 * 1024 * 1024


def test_unknown_model_lists_known_models() -> None:
    with pytest.raises(ConfigError) as info:
        parse_shorthand("h100-80gb:1,v100:2")
    message = str(info.value)
    assert "'v100'" in message
    assert "--fake-gpus" in message
    for key in KNOWN_MODELS:
        assert key in message


@pytest.mark.parametrize(
    ("spec", "fragment"),
    [
        # The grammar grew ":mig"; the message names the whole grammar.
        pytest.param("l4:x", "is not MODEL[:COUNT[:mig]]", id="not-a-number"),
        pytest.param("l4:1.5", "is not MODEL[:COUNT[:mig]]", id="fraction"),
        pytest.param("h100-80gb:2:on", "is not MODEL[:COUNT[:mig]]", id="not-mig"),
        pytest.param("h100-80gb:2:mig:x", "is not MODEL[:COUNT[:mig]]", id="too-many-parts"),
        pytest.param("h100-80gb:x:mig", "is not MODEL[:COUNT[:mig]]", id="mig-bad-count"),
        pytest.param("h100-80gb:0:mig", "at least 1", id="mig-zero"),
        pytest.param("l4:0", "at least 1", id="zero"),
        pytest.param("l4:-2", "at least 1", id="negative"),
        pytest.param("", "no GPUs given", id="empty"),
        pytest.param(" , ,", "no GPUs given", id="only-commas"),
    ],
)
def test_bad_shorthand(spec: str, fragment: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(fragment)):
        parse_shorthand(spec)


# --- files ----------------------------------------------------------------------------

EXPLICIT_UUID = "GPU-00000000-0000-0000-0000-000000000001"


def test_yaml_file(tmp_path: Path) -> None:
    path = tmp_path / "gpus.yaml"
    path.write_text(
        "gpus:\n"
        "- model: h100-80gb\n"
        "- model: l4\n"
        f"  uuid: {EXPLICIT_UUID}\n"
        "- model: h200-141gb\n"
        "  minor: 6\n"
    )
    inv = inventory(str(path))
    assert [g.product_name for g in inv.gpus] == [
        "NVIDIA H100 80GB HBM3",
        "NVIDIA L4",
        "NVIDIA H200",
    ]
    assert inv.gpus[1].uuid == EXPLICIT_UUID
    assert GPU_UUID.match(inv.gpus[0].uuid)
    assert [g.minor for g in inv.gpus] == [0, 1, 6]
    assert inv.gpus[2].device_node == "/dev/nvidia6"
    assert inv.gpus[2].device_name == "gpu-2"


def test_json_file(tmp_path: Path) -> None:
    path = tmp_path / "gpus.json"
    path.write_text(json.dumps({"gpus": [{"model": "a100-40gb"}, {"model": "a100-80gb"}]}))
    assert [g.memory_bytes // 1024**2 for g in inventory(str(path)).gpus] == [40960, 81920]


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        pytest.param("gpu: []\n", "non-empty 'gpus' list", id="no-gpus-key"),
        pytest.param("gpus: []\n", "non-empty 'gpus' list", id="empty-list"),
        pytest.param("gpus: l4\n", "non-empty 'gpus' list", id="not-a-list"),
        pytest.param("- model: l4\n", "non-empty 'gpus' list", id="top-level-list"),
        pytest.param("", "non-empty 'gpus' list", id="empty-file"),
        pytest.param("gpus:\n- uuid: x\n", "gpus[0] needs a 'model'", id="entry-without-model"),
        pytest.param("gpus:\n- l4\n", "gpus[0] needs a 'model'", id="entry-a-string"),
        pytest.param("gpus: [model: l4\n", "cannot read it", id="invalid-yaml"),
    ],
)
def test_bad_file(tmp_path: Path, content: str, fragment: str) -> None:
    path = tmp_path / "gpus.yaml"
    path.write_text(content)
    with pytest.raises(ConfigError) as info:
        load_spec(str(path))
    assert fragment in str(info.value)
    assert str(path) in str(info.value)


def test_unknown_model_in_file(tmp_path: Path) -> None:
    path = tmp_path / "gpus.yaml"
    path.write_text("gpus:\n- model: k80\n")
    with pytest.raises(ConfigError, match="unknown fake GPU model 'k80'"):
        inventory(str(path))


def test_bad_minor_in_file(tmp_path: Path) -> None:
    path = tmp_path / "gpus.yaml"
    path.write_text("gpus:\n- model: l4\n  minor: first\n")
    with pytest.raises(ConfigError):
        inventory(str(path))


# --- deterministic UUIDs ------------------------------------------------------------------


def test_uuids_are_stable_per_node() -> None:
    first = [g.uuid for g in inventory("h100-80gb:2,l4", "node-a").gpus]
    again = [g.uuid for g in inventory("h100-80gb:2,l4", "node-a").gpus]
    assert first == again


def test_uuids_differ_between_nodes() -> None:
    a = {g.uuid for g in inventory("h100-80gb:2,l4", "node-a").gpus}
    b = {g.uuid for g in inventory("h100-80gb:2,l4", "node-b").gpus}
    assert not a & b


def test_uuid_depends_on_position_not_model() -> None:
    """A restart with the same description keeps the same UUID per index."""
    assert inventory("l4", "n").gpus[0].uuid == inventory("h100-80gb", "n").gpus[0].uuid


def test_backend() -> None:
    backend = FakeGpuBackend("l4:2", "node-a")
    assert backend.name == "fake"
    inv = asyncio.run(backend.inventory())
    assert inv == inventory("l4:2", "node-a")
    asyncio.run(backend.close())


def test_backend_rejects_bad_spec() -> None:
    with pytest.raises(ConfigError):
        FakeGpuBackend("nope:1", "node-a")


def test_shorthand_is_never_read_from_a_same_named_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "l4").write_text("gpus:\n- model: a100-80gb\n")
    assert [g.product_name for g in inventory("l4").gpus] == ["NVIDIA L4"]


def test_missing_file_is_config_error() -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        inventory("/nonexistent/gpus.yaml")


# --- what each GPU reports ------------------------------------------------------------------


@pytest.mark.parametrize("key", sorted(KNOWN_MODELS))
def test_gpu_reports_its_model(key: str) -> None:
    (gpu,) = inventory(key).gpus
    model = KNOWN_MODELS[key]
    assert gpu.architecture == model.architecture
    assert gpu.cuda_compute_capability == model.cuda_compute_capability
    assert gpu.driver_version == "580.65.06"
    assert gpu.cuda_driver_version == "13.0"
    assert gpu.mig_capable == model.mig_capable
    assert (gpu.mig_enabled, gpu.mig_pending) == (False, False)
    assert gpu.mig_profiles == ()
    assert gpu.mig_devices == ()


def test_versions_and_architecture_by_model() -> None:
    inv = inventory("a100-40gb,h200-141gb,l4")
    assert [(g.architecture, g.cuda_compute_capability, g.mig_capable) for g in inv.gpus] == [
        ("ampere", "8.0", True),
        ("hopper", "9.0", True),
        ("ada", "8.9", False),
    ]


def test_pci_bus_ids() -> None:
    inv = inventory("h100-80gb:2,l4")
    assert [g.pci_bus_id for g in inv.gpus] == ["0000:18:00.0", "0000:28:00.0", "0000:38:00.0"]
    assert fake_pci_bus_id(14) == "0000:f8:00.0"
    assert fake_pci_bus_id(15) == "0001:08:00.0"
    many = [g.pci_bus_id for g in inventory("l4:64").gpus]
    assert len(set(many)) == 64
    assert all(re.fullmatch(r"[0-9a-f]{4}:[0-9a-f]{2}:00\.0", bus) for bus in many)


# --- MIG mode from the shorthand ------------------------------------------------------------


def test_shorthand_mig() -> None:
    gpus = inventory("h100-80gb:2:mig").gpus
    assert [(g.mig_enabled, g.mig_pending) for g in gpus] == [(True, True), (True, True)]
    for gpu in gpus:
        assert gpu.mig_profiles == KNOWN_MODELS["h100-80gb"].mig_profiles
        assert [p.name for p in gpu.mig_profiles][:2] == ["1g.10gb", "1g.10gb+me"]
        assert gpu.mig_devices == ()


def test_mix_of_mig_off_and_on() -> None:
    """Two H100s with MIG off, one with MIG on."""
    gpus = inventory("h100-80gb:2,h100-80gb:1:mig").gpus
    assert [g.mig_enabled for g in gpus] == [False, False, True]
    assert [g.mig_capable for g in gpus] == [True, True, True]
    assert [len(g.mig_profiles) for g in gpus] == [0, 0, 7]
    assert [g.device_name for g in gpus] == ["gpu-0", "gpu-1", "gpu-2"]


@pytest.mark.parametrize(
    ("spec", "mig"),
    [
        pytest.param("a100-80gb:mig", [True], id="mig-without-count"),
        pytest.param("A100-80GB : 2 : MIG", [True, True], id="spaces-case"),
        pytest.param("a100-80gb::mig,l4", [True, False], id="empty-count"),
    ],
)
def test_shorthand_mig_forms(spec: str, mig: list[bool]) -> None:
    assert [g.mig_enabled for g in inventory(spec).gpus] == mig


@pytest.mark.parametrize("spec", ["l4:1:mig", "l4:mig", "h100-80gb,l4:2:mig"])
def test_shorthand_mig_on_a_model_without_mig(spec: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_shorthand(spec)
    message = str(info.value)
    assert "l4 (NVIDIA L4) does not support MIG" in message
    assert "MIG-capable models: a100-40gb, a100-80gb, h100-80gb, h200-141gb" in message


# --- MIG in files ---------------------------------------------------------------------------


def write(tmp_path: Path, content: str) -> str:
    path = tmp_path / "gpus.yaml"
    path.write_text(content)
    return str(path)


MIG_FILE = """\
gpus:
- model: h100-80gb
  mig: true
  migInstances:
  - {profile: 3g.40gb, start: 4}
  - {profile: 2g.20gb, start: 0}
  - {profile: 1g.10gb+me, start: 2}
  - {profile: 1g.10gb, start: 3}
- model: h100-80gb
  mig: true
- model: h100-80gb
- model: a100-80gb
  mig: false
  migPending: true
- model: h200-141gb
  mig: true
  migPending: false
  migInstances: [{profile: 7g.141gb, start: 0}]
"""


def test_file_with_mig_instances(tmp_path: Path) -> None:
    gpus = inventory(write(tmp_path, MIG_FILE)).gpus
    assert [(g.mig_enabled, g.mig_pending) for g in gpus] == [
        (True, True),
        (True, True),
        (False, False),
        (False, True),
        (True, False),
    ]
    assert [len(g.mig_profiles) for g in gpus] == [7, 7, 0, 0, 7]
    first = gpus[0]
    assert [(d.gi_id, d.ci_id) for d in first.mig_devices] == [(1, 0), (2, 0), (3, 0), (4, 0)]
    assert [(d.profile_name, d.profile_id) for d in first.mig_devices] == [
        ("3g.40gb", 9),
        ("2g.20gb", 14),
        ("1g.10gb+me", 20),
        ("1g.10gb", 19),
    ]
    assert [d.placement for d in first.mig_devices] == [
        MigPlacement(4, 4),
        MigPlacement(0, 2),
        MigPlacement(2, 1),
        MigPlacement(3, 1),
    ]
    assert [d.memory_mib for d in first.mig_devices] == [40192, 19968, 9856, 9856]
    assert all(MIG_UUID.match(d.uuid) for d in first.mig_devices)
    assert len({d.uuid for d in first.mig_devices}) == 4
    (full,) = gpus[4].mig_devices
    assert (full.profile_name, full.profile_id, full.placement) == (
        "7g.141gb",
        0,
        MigPlacement(0, 8),
    )
    assert full.memory_mib == 143360
    assert gpus[1].mig_devices == ()


def test_mig_uuids_are_deterministic(tmp_path: Path) -> None:
    path = write(tmp_path, MIG_FILE)
    a = inventory(path, "node-a").gpus
    again = inventory(path, "node-a").gpus
    b = inventory(path, "node-b").gpus
    assert [d.uuid for d in a[0].mig_devices] == [d.uuid for d in again[0].mig_devices]
    assert not {d.uuid for d in a[0].mig_devices} & {d.uuid for d in b[0].mig_devices}
    # Derived from the GPU UUID and the GI id, nothing else.
    assert [d.uuid for d in a[0].mig_devices] == [
        fake_mig_uuid(a[0].uuid, gi) for gi in (1, 2, 3, 4)
    ]
    assert a[4].mig_devices[0].uuid == fake_mig_uuid(a[4].uuid, 1)
    assert fake_mig_uuid(a[0].uuid, 1) != fake_mig_uuid(a[0].uuid, 1, ci_id=1)


def test_mig_uuid_follows_an_explicit_gpu_uuid(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        f"gpus:\n- model: a100-40gb\n  uuid: {EXPLICIT_UUID}\n  mig: true\n"
        "  migInstances: [{profile: 1g.5gb, start: 6}]\n",
    )
    (gpu,) = inventory(path, "node-a").gpus
    (device,) = gpu.mig_devices
    assert device.uuid == fake_mig_uuid(EXPLICIT_UUID, 1)
    assert device.uuid == inventory(path, "node-b").gpus[0].mig_devices[0].uuid


def test_fully_packed_gpu(tmp_path: Path) -> None:
    starts = ", ".join(f"{{profile: 1g.10gb, start: {i}}}" for i in range(7))
    path = write(tmp_path, f"gpus:\n- model: a100-80gb\n  mig: true\n  migInstances: [{starts}]\n")
    (gpu,) = inventory(path).gpus
    assert [d.gi_id for d in gpu.mig_devices] == [1, 2, 3, 4, 5, 6, 7]


def test_build_inventory_validates_hand_written_entries() -> None:
    inv = build_inventory(
        [{"model": "h100-80gb", "mig": True, "migInstances": [{"profile": "4g.40gb", "start": 0}]}],
        "node-a",
    )
    assert inv.gpus[0].mig_devices[0].profile_name == "4g.40gb"
    with pytest.raises(ConfigError) as info:
        build_inventory([{"model": "l4"}, {"model": "l4", "mig": True}], "node-a")
    assert str(info.value).startswith("--fake-gpus: gpus[1].mig: l4 (NVIDIA L4)")


H100 = "gpus:\n- model: h100-80gb\n  mig: true\n  migInstances:\n"
H100_PROFILES = "1g.10gb, 1g.10gb+me, 1g.20gb, 2g.20gb, 3g.40gb, 4g.40gb, 7g.80gb"


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        pytest.param(
            H100 + "  - {profile: 5g.50gb, start: 0}\n",
            f"gpus[0].migInstances[0].profile: '5g.50gb' is not a MIG profile of h100-80gb; "
            f"its profiles: {H100_PROFILES}",
            id="unknown-profile",
        ),
        pytest.param(
            H100 + "  - {profile: 1g.5gb, start: 0}\n",
            "gpus[0].migInstances[0].profile: '1g.5gb' is not a MIG profile of h100-80gb",
            id="profile-of-another-model",
        ),
        pytest.param(
            H100 + "  - {profile: 1g.10gb, start: 0}\n  - {profile: 3g.40gb, start: 2}\n",
            "gpus[0].migInstances[1].start: 2 is not a placement of 3g.40gb on h100-80gb; "
            "allowed starts: 0, 4",
            id="bad-start",
        ),
        pytest.param(
            H100 + "  - {profile: 1g.10gb, start: 7}\n",
            "allowed starts: 0, 1, 2, 3, 4, 5, 6",
            id="1g-on-the-last-slice",
        ),
        pytest.param(
            H100 + "  - {profile: 2g.20gb, start: '0'}\n",
            "gpus[0].migInstances[0].start: '0' is not a placement of 2g.20gb",
            id="start-a-string",
        ),
        pytest.param(
            H100 + "  - {profile: 3g.40gb, start: 0}\n  - {profile: 2g.20gb, start: 2}\n",
            "gpus[0].migInstances[1]: 2g.20gb at start 2 (memory slices 2-3) overlaps "
            "migInstances[0], 3g.40gb at start 0 (memory slices 0-3)",
            id="overlap",
        ),
        pytest.param(
            H100 + "  - {profile: 1g.10gb, start: 5}\n  - {profile: 1g.10gb, start: 5}\n",
            "gpus[0].migInstances[1]: 1g.10gb at start 5 (memory slice 5) overlaps migInstances[0]",
            id="same-placement-twice",
        ),
        pytest.param(
            H100 + "  - {profile: 1g.10gb, start: 0}\n  - {profile: 7g.80gb, start: 0}\n",
            "gpus[0].migInstances[1]: 7g.80gb at start 0 (memory slices 0-7) overlaps",
            id="full-over-small",
        ),
        pytest.param(
            H100 + "  - {profile: 1g.10gb+me, start: 0}\n  - {profile: 1g.10gb+me, start: 1}\n",
            "gpus[0].migInstances[1]: at most 1 instance(s) of 1g.10gb+me fit on h100-80gb",
            id="two-media-extensions",
        ),
        pytest.param(
            "gpus:\n- model: h100-80gb\n  migInstances: [{profile: 1g.10gb, start: 0}]\n",
            "gpus[0].migInstances: MIG devices exist only while MIG is enabled; set mig: true",
            id="instances-without-mig",
        ),
        pytest.param(
            "gpus:\n- model: h100-80gb\n  mig: false\n  migPending: true\n"
            "  migInstances: [{profile: 1g.10gb, start: 0}]\n",
            "gpus[0].migInstances: MIG devices exist only while MIG is enabled",
            id="instances-while-only-pending",
        ),
        pytest.param(
            "gpus:\n- model: l4\n  migInstances: [{profile: 1g.10gb, start: 0}]\n",
            "gpus[0].migInstances: l4 (NVIDIA L4) does not support MIG",
            id="instances-on-l4",
        ),
        pytest.param(
            "gpus:\n- model: l4\n  mig: true\n",
            "gpus[0].mig: l4 (NVIDIA L4) does not support MIG; MIG-capable models: a100-40gb",
            id="mig-on-l4",
        ),
        pytest.param(
            "gpus:\n- model: l4\n- model: l4\n  migPending: true\n",
            "gpus[1].migPending: l4 (NVIDIA L4) does not support MIG",
            id="pending-on-l4",
        ),
        pytest.param(
            "gpus:\n- model: h100-80gb\n  mig: 'yes'\n",
            "gpus[0].mig must be true or false, not 'yes'",
            id="mig-not-bool",
        ),
        pytest.param(
            "gpus:\n- model: h100-80gb\n  mig: true\n  migPending: 1\n",
            "gpus[0].migPending must be true or false, not 1",
            id="pending-not-bool",
        ),
        pytest.param(
            "gpus:\n- model: h100-80gb\n  mig: true\n  migInstances: 3g.40gb\n",
            "gpus[0].migInstances must be a list of {profile, start}",
            id="instances-not-a-list",
        ),
        pytest.param(
            H100 + "  - 3g.40gb\n",
            "gpus[0].migInstances[0] must be a mapping such as {profile: 3g.40gb, start: 0}",
            id="instance-a-string",
        ),
        pytest.param(
            H100 + "  - {profile: 3g.40gb}\n",
            "gpus[0].migInstances[0] needs exactly the keys profile and start; missing: start",
            id="instance-without-start",
        ),
        pytest.param(
            H100 + "  - {profile: 3g.40gb, start: 0, gi: 3}\n",
            "gpus[0].migInstances[0] needs exactly the keys profile and start; unknown: gi",
            id="instance-unknown-key",
        ),
        pytest.param(
            "gpus:\n- model: h100-80gb\n  migInstance: []\n",
            "gpus[0]: unknown keys migInstance; allowed: model, uuid, minor, mig, migPending, "
            "migInstances",
            id="typo-in-a-gpu-key",
        ),
        pytest.param(
            "gpus:\n- model: h100-80gb\n  uuid: 7\n",
            "gpus[0].uuid must be a non-empty string, not 7",
            id="uuid-not-a-string",
        ),
    ],
)
def test_bad_mig_file(tmp_path: Path, content: str, fragment: str) -> None:
    path = write(tmp_path, content)
    with pytest.raises(ConfigError) as info:
        load_spec(path)
    message = str(info.value)
    assert fragment in message
    assert message.startswith(f"--fake-gpus file {path}: gpus[")


def test_empty_instance_list_is_fine_without_mig(tmp_path: Path) -> None:
    path = write(tmp_path, "gpus:\n- model: l4\n  migInstances: []\n")
    assert inventory(path).gpus[0].mig_devices == ()


def test_compute_slice_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    """The standard geometry cannot overrun 7 compute slices, so check the rule on a tiny GPU."""
    one_slice = MigProfile(
        id=1,
        name="1g.1gb",
        compute_slices=1,
        memory_mib=100,
        multiprocessors=1,
        copy_engines=1,
        decoders=0,
        encoders=0,
        jpeg_engines=0,
        ofa_engines=0,
        placements=tuple(MigPlacement(i, 1) for i in range(4)),
    )
    tiny = GpuModel(
        key="tiny",
        product_name="Tiny GPU",
        memory_mib=400,
        mig=MigGeometry(
            compute_slices=2, memory_slices=4, profiles=(MigProfileSpec(one_slice, 4),)
        ),
    )
    monkeypatch.setitem(KNOWN_MODELS, "tiny", tiny)
    instances = [{"profile": "1g.1gb", "start": i} for i in range(3)]
    with pytest.raises(ConfigError) as info:
        build_inventory([{"model": "tiny", "mig": True, "migInstances": instances}], "n")
    assert str(info.value) == (
        "--fake-gpus: gpus[0].migInstances[2]: 1g.1gb would bring the GPU to 3 compute slices; "
        "tiny has 2"
    )


# --- health events --------------------------------------------------------------------------


def test_inject_xid() -> None:
    async def scenario() -> tuple[Inventory, list[HealthEvent], HealthEvent]:
        backend = FakeGpuBackend("h100-80gb:2", "node-a")
        injected = backend.inject_xid(1, 79, "GPU has fallen off the bus")
        backend.inject_xid(0, 48)
        await backend.close()
        return await backend.inventory(), [e async for e in backend.health_events()], injected

    inv, events, injected = asyncio.run(scenario())
    assert events == [
        HealthEvent(gpu_uuid=inv.gpus[1].uuid, xid=79, message="GPU has fallen off the bus"),
        HealthEvent(gpu_uuid=inv.gpus[0].uuid, xid=48),
    ]
    assert injected == events[0]


def test_inject_xid_on_a_mig_device(tmp_path: Path) -> None:
    path = write(tmp_path, MIG_FILE)

    async def scenario() -> tuple[GpuInfo, list[HealthEvent]]:
        backend = FakeGpuBackend(path, "node-a")
        gpu = (await backend.inventory()).gpus[0]
        backend.inject_xid(0, 94, "contained ECC error", mig_uuid=gpu.mig_devices[2].uuid)
        await backend.close()
        return gpu, [e async for e in backend.health_events()]

    gpu, events = asyncio.run(scenario())
    assert events == [
        HealthEvent(
            gpu_uuid=gpu.uuid,
            xid=94,
            message="contained ECC error",
            mig_uuid=gpu.mig_devices[2].uuid,
        )
    ]


def test_inject_xid_rejects_what_the_fake_lacks(tmp_path: Path) -> None:
    backend = FakeGpuBackend(write(tmp_path, MIG_FILE), "node-a")
    with pytest.raises(IndexError, match="no fake GPU with index 5; there are 5"):
        backend.inject_xid(5, 79)
    with pytest.raises(IndexError, match="no fake GPU with index -1"):
        backend.inject_xid(-1, 79)
    other = fake_mig_uuid("GPU-other", 1)
    with pytest.raises(IndexError, match="has no MIG device"):
        backend.inject_xid(0, 79, mig_uuid=other)
    with pytest.raises(IndexError, match="has no MIG device"):
        backend.inject_xid(1, 79, mig_uuid=MigUUID(fake_mig_uuid("x", 1)))


# --- dynamic MIG ----------------------------------------------------------------------------

P_1G, P_2G, P_3G, P_4G, P_7G = 19, 14, 9, 5, 0  # H100 GPU-instance profile ids


def run_mig(
    spec: str, *steps: tuple[str, int, int, int] | Exception, gpu: int = 0
) -> tuple[list[MigDevice | Exception | None], GpuInfo]:
    """Apply ``("create", profile, start, size)`` / ``("destroy", gi, 0, 0)`` steps in order.

    An Exception step is armed with ``fail_next_create``. Returns each step's
    result (or the error it raised) and the GPU as the inventory shows it after.
    """

    async def scenario() -> tuple[list[MigDevice | Exception | None], GpuInfo]:
        backend = FakeGpuBackend(spec, "node-a")
        uuid = (await backend.inventory()).gpus[gpu].uuid
        results: list[MigDevice | Exception | None] = []
        for step in steps:
            if isinstance(step, Exception):
                backend.fail_next_create(step)
                continue
            verb, a, b, c = step
            try:
                if verb == "create":
                    results.append(await backend.create_mig_device(uuid, a, MigPlacement(b, c)))
                else:
                    await backend.destroy_mig_device(uuid, a)
                    results.append(None)
            except InventoryError as err:
                results.append(err)
        return results, (await backend.inventory()).gpus[gpu]

    return asyncio.run(scenario())


def test_create_mig_device_shows_in_the_inventory() -> None:
    (device,), gpu = run_mig("h100-80gb:mig", ("create", P_3G, 4, 4))
    assert device == MigDevice(
        uuid=fake_mig_uuid(gpu.uuid, 1),
        gi_id=1,
        ci_id=0,
        profile_id=P_3G,
        profile_name="3g.40gb",
        placement=MigPlacement(4, 4),
        memory_mib=40192,
    )
    assert gpu.mig_devices == (device,)


def test_create_mig_device_is_idempotent() -> None:
    (first, again), gpu = run_mig("h100-80gb:mig", ("create", P_2G, 2, 2), ("create", P_2G, 2, 2))
    assert first == again
    assert gpu.mig_devices == (first,)


def test_gi_ids_fill_the_lowest_gap(tmp_path: Path) -> None:
    instances = "  - {profile: 1g.10gb, start: 0}\n  - {profile: 1g.10gb, start: 1}\n"
    spec = write(tmp_path, f"gpus:\n- model: h100-80gb\n  mig: true\n  migInstances:\n{instances}")
    results, gpu = run_mig(
        spec, ("destroy", 1, 0, 0), ("create", P_1G, 2, 1), ("create", P_1G, 3, 1)
    )
    assert [r.gi_id for r in results if isinstance(r, MigDevice)] == [1, 3]
    assert sorted(d.gi_id for d in gpu.mig_devices) == [1, 2, 3]
    assert [d.placement.start for d in gpu.mig_devices] == [1, 2, 3]


def test_overlap_is_busy_and_names_both(tmp_path: Path) -> None:
    (err,), gpu = run_mig(write(tmp_path, MIG_FILE), ("create", P_1G, 5, 1))
    assert isinstance(err, MigPlacementBusyError)
    assert str(err) == (
        f"GPU 0 ({gpu.uuid}): cannot create 1g.10gb at start 5 (size 1): it overlaps the "
        "existing 3g.40gb GPU instance 1 at start 4 (memory slices 4-7)"
    )
    assert len(gpu.mig_devices) == 4


@pytest.mark.parametrize(
    ("steps", "fragment"),
    [
        ([("create", P_4G, 0, 4), ("create", P_3G, 4, 4), ("create", P_1G, 4, 1)], "overlaps"),
        ([("create", P_3G, 4, 4), ("create", 15, 6, 2)], "overlaps"),
        ([("create", P_3G, 0, 4), ("create", P_1G, 7, 1)], "not a placement"),
        (
            [("create", 20, 0, 1), ("create", 20, 1, 1)],
            "at most 1 instance(s) of 1g.10gb+me fit and 1 exist",
        ),
    ],
    # The compute-slice limit cannot be reached on Hopper geometry without an overlap.
    ids=["overlap", "overlap-1g20", "bad-start", "instance-limit"],
)
def test_create_refusals_when_full(steps: list[tuple[str, int, int, int]], fragment: str) -> None:
    results, gpu = run_mig("h100-80gb:mig", *steps)
    *made, last = results
    assert all(isinstance(r, MigDevice) for r in made)
    assert isinstance(last, InventoryError)
    assert fragment in str(last)
    busy = fragment != "not a placement"
    assert isinstance(last, MigPlacementBusyError) is busy
    assert len(gpu.mig_devices) == len(made)


@pytest.mark.parametrize(
    ("spec", "profile", "start", "size", "fragment"),
    [
        (
            "h100-80gb:mig",
            P_1G,
            7,
            1,
            "not a placement of 1g.10gb; its placements (start/size): 0/1",
        ),
        ("h100-80gb:mig", P_1G, 0, 2, "start 0 size 2 is not a placement of 1g.10gb"),
        ("h100-80gb:mig", 99, 0, 1, "no MIG profile with id 99; its profiles: 19 (1g.10gb)"),
        ("h100-80gb", P_1G, 0, 1, "cannot create a MIG device: MIG mode is disabled"),
        ("l4", P_1G, 0, 1, "MIG mode is disabled and NVIDIA L4 does not support MIG"),
    ],
    ids=["bad-start", "bad-size", "unknown-profile", "mig-off", "no-mig"],
)
def test_create_refusals(spec: str, profile: int, start: int, size: int, fragment: str) -> None:
    (err,), gpu = run_mig(spec, ("create", profile, start, size))
    assert type(err) is InventoryError
    assert fragment in str(err)
    assert gpu.mig_devices == ()


def test_unknown_gpu() -> None:
    async def scenario() -> None:
        backend = FakeGpuBackend("h100-80gb:mig", "node-a")
        with pytest.raises(InventoryError, match="no GPU GPU-nope on this node; its GPUs: GPU-"):
            await backend.create_mig_device(GpuUUID("GPU-nope"), P_1G, MigPlacement(0, 1))
        with pytest.raises(InventoryError, match="no GPU GPU-nope"):
            await backend.destroy_mig_device(GpuUUID("GPU-nope"), 1)

    asyncio.run(scenario())


def test_fail_next_create_fails_once() -> None:
    boom = MigPlacementBusyError("injected")
    (err, device), gpu = run_mig("h100-80gb:mig", boom, *[("create", P_7G, 0, 8)] * 2)
    assert err is boom
    assert isinstance(device, MigDevice)
    assert gpu.mig_devices == (device,)


def test_destroy(tmp_path: Path) -> None:
    results, gpu = run_mig(
        write(tmp_path, MIG_FILE), ("destroy", 1, 0, 0), ("destroy", 1, 0, 0), ("destroy", 9, 0, 0)
    )
    assert results == [None, None, None]  # gone already, never there: no error
    assert [d.gi_id for d in gpu.mig_devices] == [2, 3, 4]
    (_, device), gpu = run_mig(
        write(tmp_path, MIG_FILE), ("destroy", 1, 0, 0), ("create", 15, 4, 2)
    )  # the freed slices take another profile
    assert isinstance(device, MigDevice)
    assert device.gi_id == 1
