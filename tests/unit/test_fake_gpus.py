"""The fake GPU backend: shorthand and file descriptions of GPUs."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import pytest

from dra_driver.core.errors import ConfigError
from dra_driver.core.model import Inventory
from dra_driver.gpu.fake import FakeGpuBackend, build_inventory, load_spec, parse_shorthand
from dra_driver.gpu.models import KNOWN_MODELS

GPU_UUID = re.compile(r"^GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


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
        pytest.param("l4:x", "is not MODEL[:COUNT]", id="not-a-number"),
        pytest.param("l4:1.5", "is not MODEL[:COUNT]", id="fraction"),
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
