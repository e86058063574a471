"""Driver edits: the toolkit's spec, our discovery under a driver root, fake stand-ins."""

from __future__ import annotations

import json
import os
import pathlib
from typing import Any

import pytest
import yaml

from dra_driver.base.errors import ConfigError, InventoryError
from dra_driver.core.cdi import (
    CdiDevice,
    CdiSpec,
    ContainerEdits,
    DeviceNode,
    DriverFile,
    DriverFiles,
    FoundNode,
    Hook,
    Mount,
    cdi_spec_problems,
    edits_from_driver_files,
    edits_from_toolkit_spec,
    fake_common_edits,
    fake_device_node,
    merge_edits,
    render_spec,
)
from dra_driver.gpu.driver_files import (
    discover_driver_files,
    find_toolkit_spec,
    load_toolkit_spec,
)

FIXTURE = pathlib.Path(__file__).parents[1] / "fixtures" / "toolkit-cdi" / "nvidia.yaml"
VERSION = "580.65.06"
LIB = "/usr/lib/x86_64-linux-gnu"
UUID = "GPU-4f0d6c1e-9a2b-4c3d-8e7f-0a1b2c3d4e5f"
RO = ("ro", "nosuid", "nodev", "bind")
HOOK = "/usr/bin/nvidia-cdi-hook"
DEBUG = ("NVIDIA_CTK_DEBUG=false",)


def toolkit_doc() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(FIXTURE.read_text())
    return doc


# --- the toolkit's spec --------------------------------------------------------------------


def test_toolkit_common_edits_field_by_field() -> None:
    common = edits_from_toolkit_spec(toolkit_doc()).common
    assert common.env == ("NVIDIA_VISIBLE_DEVICES=void",)
    assert common.device_nodes == tuple(
        DeviceNode(p, type="")
        for p in (
            "/dev/nvidia-modeset",
            "/dev/nvidia-uvm",
            "/dev/nvidia-uvm-tools",
            "/dev/nvidiactl",
        )
    )
    assert common.hooks == (
        Hook("createContainer", HOOK, ("nvidia-cdi-hook", "create-symlinks", "--link",
                                       f"libcuda.so.1::{LIB}/libcuda.so"), DEBUG),
        Hook("createContainer", HOOK, ("nvidia-cdi-hook", "enable-cuda-compat",
                                       f"--host-driver-version={VERSION}"), DEBUG),
        Hook("createContainer", HOOK, ("nvidia-cdi-hook", "update-ldcache", "--folder", LIB),
             DEBUG),
    )  # fmt: skip
    assert common.mounts[0] == Mount(
        "/run/nvidia-persistenced/socket",
        "/run/nvidia-persistenced/socket",
        (*RO, "noexec"),
    )
    by_path = {m.container_path: m for m in common.mounts}
    for path in (
        f"{LIB}/libcuda.so.{VERSION}",
        f"{LIB}/libnvidia-ml.so.{VERSION}",
        f"{LIB}/libnvidia-ptxjitcompiler.so.{VERSION}",
        f"/lib/firmware/nvidia/{VERSION}/gsp_ga10x.bin",
        "/usr/bin/nvidia-smi",
    ):
        assert by_path[path] == Mount(path, path, RO)
    # The MPS control tool is withheld (issue 33): no client runs it.
    assert "/usr/bin/nvidia-cuda-mps-control" not in by_path
    assert len(common.mounts) == 1 + 5 + 11 + 2 - 1
    assert common.additional_gids == ()


def test_toolkit_per_device_edits() -> None:
    edits = edits_from_toolkit_spec(toolkit_doc())
    assert sorted(edits.per_device) == ["0", UUID, "all"]
    gpu = ContainerEdits(device_nodes=(DeviceNode("/dev/nvidia0", type=""),))
    assert all(e == gpu for e in edits.per_device.values())
    assert edits.for_gpu(UUID) == gpu
    assert edits.for_gpu("GPU-other", index=0) == gpu
    assert edits.skipped == (WITHHELD,)
    with pytest.raises(
        InventoryError, match=r"has no device 'GPU-other' or 3.*nvidia-ctk cdi generate"
    ):
        edits.for_gpu("GPU-other", index=3)


def test_toolkit_edits_render_back_to_the_same_document() -> None:
    """Nothing is lost or invented on the way through our types, but the withheld tool."""
    doc = toolkit_doc()
    edits = edits_from_toolkit_spec(doc)
    doc["containerEdits"]["mounts"] = [
        m
        for m in doc["containerEdits"]["mounts"]
        if m["containerPath"] != "/usr/bin/nvidia-cuda-mps-control"
    ]
    spec = CdiSpec(
        kind="nvidia.com/gpu",
        devices=tuple(CdiDevice(name, e) for name, e in edits.per_device.items()),
        common_edits=edits.common,
    )
    assert render_spec(spec) == doc


def test_toolkit_skips_foreign_edits_with_a_reason() -> None:
    doc = toolkit_doc()
    doc["cdiVersion"] = "1.1.0"
    doc["containerEdits"]["netDevices"] = [{"hostInterfaceName": "eth1", "name": "net1"}]
    edits = edits_from_toolkit_spec(doc)
    assert edits.skipped == ("containerEdits.netDevices: not a GPU edit; left out", WITHHELD)


@pytest.mark.parametrize(
    ("change", "words"),
    [
        pytest.param({"kind": "acme.com/gpu"}, "is not the NVIDIA Container Toolkit's", id="kind"),
        pytest.param({"cdiVersion": "0.3.0"}, r"cdiVersion: 0.3.0 is below 0.5.0", id="version"),
        pytest.param({"devices": []}, "devices: a spec needs", id="no-devices"),
    ],
)
def test_toolkit_spec_rejected(change: dict[str, Any], words: str) -> None:
    with pytest.raises(InventoryError, match=words):
        edits_from_toolkit_spec({**toolkit_doc(), **change}, "/etc/cdi/nvidia.yaml")


def test_merge_with_plan_edits_keeps_the_plans_nodes() -> None:
    toolkit = edits_from_toolkit_spec(toolkit_doc()).common
    plan = ContainerEdits(device_nodes=(DeviceNode("/dev/nvidiactl", major=195, minor=255),))
    merged = merge_edits(plan, toolkit)
    assert merged.device_nodes[0] == DeviceNode("/dev/nvidiactl", major=195, minor=255)
    assert [n.path for n in merged.device_nodes].count("/dev/nvidiactl") == 1
    assert merged.mounts == toolkit.mounts and merged.hooks == toolkit.hooks


# --- toolkit spec files --------------------------------------------------------------------


def test_load_toolkit_spec_from_dirs(tmp_path: pathlib.Path) -> None:
    static, dynamic = tmp_path / "etc-cdi", tmp_path / "run-cdi"
    static.mkdir()
    dynamic.mkdir()
    dirs = (str(static), str(dynamic))
    assert load_toolkit_spec(dirs) is None
    (static / "nvidia.yaml").write_text(FIXTURE.read_text())
    (static / "other.yaml").write_text("kind: acme.com/gpu\n")
    (static / "broken.yaml").write_text("{ not yaml")
    (static / "ignored.txt").write_text("kind: nvidia.com/gpu\n")
    assert load_toolkit_spec(dirs) == toolkit_doc()
    # A later directory has the higher priority.
    newer = {**toolkit_doc(), "cdiVersion": "0.6.0"}
    (dynamic / "nvidia.json").write_text(json.dumps(newer))
    assert find_toolkit_spec(dirs) == (str(dynamic / "nvidia.json"), newer)
    (dynamic / "nvidia2.yaml").write_text(FIXTURE.read_text())
    with pytest.raises(InventoryError, match=r"several nvidia.com/gpu CDI specs in .*run-cdi"):
        load_toolkit_spec(dirs)


def test_missing_cdi_dirs_mean_no_spec(tmp_path: pathlib.Path) -> None:
    assert load_toolkit_spec((str(tmp_path / "nope"),)) is None


# --- discovery under a driver root ---------------------------------------------------------

LIBS = [
    "libcuda", "libnvidia-ml", "libnvidia-ptxjitcompiler", "libnvidia-nvvm",
    "libnvidia-gpucomp", "libnvidia-allocator", "libnvidia-cfg", "libcudadebugger",
    "libnvidia-opencl", "libnvidia-pkcs11", "libnvidia-pkcs11-openssl3",
]  # fmt: skip
BINS = [
    "nvidia-smi", "nvidia-debugdump", "nvidia-persistenced", "nvidia-cuda-mps-control",
    "nvidia-cuda-mps-server",
]  # fmt: skip


MOUNTED_BINS = [b for b in BINS if b != "nvidia-cuda-mps-control"]
"""What a claim's container gets of BINS: not the MPS control tool (issue 33)."""
WITHHELD = "containerEdits.mounts /usr/bin/nvidia-cuda-mps-control: the MPS control tool; left out"


def touch(path: pathlib.Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"")


def driver_root(tmp_path: pathlib.Path, libs: list[str] = LIBS) -> pathlib.Path:
    """A driver root laid out like a host install, with empty files."""
    root = tmp_path / "driver"
    for lib in libs:
        touch(root / "usr/lib/x86_64-linux-gnu" / f"{lib}.so.{VERSION}")
        touch(root / "usr/lib/x86_64-linux-gnu" / f"{lib}.so.1")  # a SONAME name: not taken
    touch(root / "usr/lib64" / f"libcuda.so.{VERSION}")  # later dir: first one wins
    for fw in ("gsp_ga10x.bin", "gsp_tu10x.bin", "README"):
        touch(root / "lib/firmware/nvidia" / VERSION / fw)
    for name in BINS:
        touch(root / "usr/bin" / name)
    touch(root / "usr/bin/ls")
    return root


def dev_root(tmp_path: pathlib.Path, names: tuple[str, ...] = ("nvidiactl",)) -> str:
    dev = tmp_path / "dev"
    for name in names:
        touch(dev / name)
    return str(dev)


def test_discovery_finds_the_documented_files(tmp_path: pathlib.Path) -> None:
    root = driver_root(tmp_path)
    files = discover_driver_files(str(root), dev_root=dev_root(tmp_path))
    assert files.driver_version == VERSION
    assert files.driver_root == str(root)
    assert files.libraries == tuple(
        DriverFile(f"{root}{LIB}/{lib}.so.{VERSION}", f"{LIB}/{lib}.so.{VERSION}") for lib in LIBS
    )
    fw = f"/lib/firmware/nvidia/{VERSION}"
    assert files.firmware == (
        DriverFile(f"{root}{fw}/gsp_ga10x.bin", f"{fw}/gsp_ga10x.bin"),
        DriverFile(f"{root}{fw}/gsp_tu10x.bin", f"{fw}/gsp_tu10x.bin"),
    )
    assert files.binaries == tuple(
        DriverFile(f"{root}/usr/bin/{b}", f"/usr/bin/{b}") for b in MOUNTED_BINS
    )
    # Regular files in the test, so no numbers: the runtime will stat the host's nodes.
    assert files.device_nodes == (FoundNode("/dev/nvidiactl"),)
    assert any("nvidia-uvm" in note and "nvidia-modprobe" in note for note in files.notes)


def test_discovery_edits(tmp_path: pathlib.Path) -> None:
    root = driver_root(tmp_path)
    files = discover_driver_files(
        str(root), VERSION, dev_root(tmp_path, ("nvidiactl", "nvidia-uvm"))
    )
    edits = edits_from_driver_files(files)
    assert edits.mounts[0] == Mount(
        f"{root}{LIB}/libcuda.so.{VERSION}", f"{LIB}/libcuda.so.{VERSION}", RO
    )
    assert len(edits.mounts) == len(LIBS) + 2 + len(MOUNTED_BINS)
    assert all(m.options == RO and m.type is None for m in edits.mounts)
    assert edits.device_nodes == (
        DeviceNode("/dev/nvidiactl", type=""),
        DeviceNode("/dev/nvidia-uvm", type=""),
    )
    ldcache = ("nvidia-cdi-hook", "update-ldcache", "--folder", LIB)
    assert edits.hooks == (Hook("createContainer", HOOK, ldcache),)
    assert edits.env == ()
    spec = CdiSpec("acme.com/gpu", (CdiDevice("gpu0", edits),), common_edits=edits)
    assert cdi_spec_problems(render_spec(spec)) == []


def test_discovery_edits_custom_or_no_hook(tmp_path: pathlib.Path) -> None:
    files = discover_driver_files(str(driver_root(tmp_path)), dev_root=dev_root(tmp_path))
    hooked = edits_from_driver_files(files, hook_path="/opt/fgd/nvidia-cdi-hook")
    assert hooked.hooks[0].path == "/opt/fgd/nvidia-cdi-hook"
    assert edits_from_driver_files(files, hook_path=None).hooks == ()


def test_hook_folders_once_each_in_order() -> None:
    files = DriverFiles(
        driver_root="/run/nvidia/driver",
        driver_version=VERSION,
        libraries=(
            *(
                DriverFile("/run/nvidia/driver" + path, path)
                for path in (
                    "/usr/lib64/libcuda.so.1.2",
                    "/lib/x/libnvidia-ml.so.1.2",
                    "/usr/lib64/libnvidia-cfg.so.1.2",
                )
            ),
        ),
        device_nodes=(FoundNode("/dev/nvidiactl", 195, 255),),
    )  # fmt: skip
    edits = edits_from_driver_files(files)
    assert edits.hooks[0].args == (
        "nvidia-cdi-hook", "update-ldcache", "--folder", "/usr/lib64", "--folder", "/lib/x",
    )  # fmt: skip
    assert edits.device_nodes == (DeviceNode("/dev/nvidiactl", "c", 195, 255),)


def test_discovery_only_required_libraries(tmp_path: pathlib.Path) -> None:
    root = driver_root(tmp_path, ["libcuda", "libnvidia-ml"])
    files = discover_driver_files(str(root), VERSION, dev_root(tmp_path))
    assert [os.path.basename(f.container_path) for f in files.libraries] == [
        f"libcuda.so.{VERSION}",
        f"libnvidia-ml.so.{VERSION}",
    ]
    assert f"optional library libnvidia-ptxjitcompiler.so.{VERSION} not found" in files.notes


def test_missing_libcuda_is_a_clear_error(tmp_path: pathlib.Path) -> None:
    root = tmp_path / "empty-root"
    (root / "usr/lib/x86_64-linux-gnu").mkdir(parents=True)
    with pytest.raises(
        InventoryError, match=r"no libcuda.so.<version> under .*empty-root.*--driver-root"
    ):
        discover_driver_files(str(root), dev_root=dev_root(tmp_path))
    with pytest.raises(InventoryError, match=rf"no libcuda.so.{VERSION} under .*--driver-root"):
        discover_driver_files(str(root), VERSION, dev_root(tmp_path))


def test_required_library_of_another_version(tmp_path: pathlib.Path) -> None:
    root = driver_root(tmp_path, ["libcuda"])
    with pytest.raises(InventoryError, match=rf"no libnvidia-ml.so.{VERSION} under"):
        discover_driver_files(str(root), dev_root=dev_root(tmp_path))


def test_two_driver_versions_are_ambiguous(tmp_path: pathlib.Path) -> None:
    root = driver_root(tmp_path)
    touch(root / "usr/lib/x86_64-linux-gnu/libcuda.so.570.1.2")
    with pytest.raises(InventoryError, match=f"several driver versions .*570.1.2, {VERSION}"):
        discover_driver_files(str(root), dev_root=dev_root(tmp_path))
    # Given the version (from NVML), there is no question.
    assert discover_driver_files(str(root), VERSION, dev_root(tmp_path)).driver_version == VERSION


def test_missing_nvidiactl(tmp_path: pathlib.Path) -> None:
    with pytest.raises(
        InventoryError, match="nvidiactl does not exist: is the NVIDIA kernel module"
    ):
        discover_driver_files(str(driver_root(tmp_path)), dev_root=dev_root(tmp_path, ()))


@pytest.mark.parametrize("bad", ["relative/root", "/does/not/exist"])
def test_bad_driver_root_is_config_error(bad: str) -> None:
    with pytest.raises(ConfigError, match=r"--driver-root .* install root"):
        discover_driver_files(bad)


def test_real_char_device_gets_its_numbers(tmp_path: pathlib.Path) -> None:
    """``/dev/null`` stands in for a GPU node: discovery reads a char device's numbers."""
    dev = tmp_path / "dev"
    dev.mkdir()
    (dev / "nvidiactl").symlink_to("/dev/null")
    files = discover_driver_files(str(driver_root(tmp_path)), dev_root=str(dev))
    assert files.device_nodes == (FoundNode("/dev/nvidiactl", 1, 3),)


# --- fake stand-ins ------------------------------------------------------------------------


def test_fake_stand_ins() -> None:
    node = fake_device_node("/dev/nvidia3")
    assert node.render() == {"path": "/dev/nvidia3", "type": "c", "major": 1, "minor": 3}
    common = fake_common_edits()
    assert [n.path for n in common.device_nodes] == [
        "/dev/nvidiactl",
        "/dev/nvidia-uvm",
        "/dev/nvidia-uvm-tools",
    ]
    assert all((n.type, n.major, n.minor) == ("c", 1, 3) for n in common.device_nodes)
    assert common.mounts == () and common.hooks == ()
    spec = CdiSpec("acme.com/gpu", (CdiDevice("gpu3", ContainerEdits((node,))),), common)
    assert cdi_spec_problems(render_spec(spec)) == []
