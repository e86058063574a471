"""MIG capability nodes read from a /proc fixture tree (tests/fixtures/proc)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from dra_driver.base.errors import InventoryError
from dra_driver.core.cdi import CapNode
from dra_driver.gpu.mig_caps import MigCapabilities, parse_access, parse_char_major

PROC = Path(__file__).resolve().parents[1] / "fixtures" / "proc"


def test_caps_major_from_the_character_devices() -> None:
    assert MigCapabilities(PROC).caps_major() == 509


def test_cap_nodes() -> None:
    gi, ci = MigCapabilities(str(PROC)).cap_nodes(parent_minor=0, gi_id=1, ci_id=0)
    assert gi == CapNode("/dev/nvidia-caps/nvidia-cap12", major=509, minor=12, mode=0o444)
    assert ci == CapNode("/dev/nvidia-caps/nvidia-cap13", major=509, minor=13, mode=0o444)
    gi, ci = MigCapabilities(PROC).cap_nodes(parent_minor=1, gi_id=7, ci_id=0)
    assert (gi.minor, ci.minor, gi.mode) == (147, 148, 0o400)


def test_default_proc_root() -> None:
    caps = MigCapabilities()
    assert caps.proc_root == Path("/proc")
    assert caps.access_file(3, 2, 1) == Path(
        "/proc/driver/nvidia/capabilities/gpu3/mig/gi2/ci1/access"
    )


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Character devices:\n509 nvidia-caps\n\nBlock devices:\n 7 loop\n", 509),
        ("Character devices:\n510 nvidia-uvm\n511 nvidia-caps-imex-channels\n", None),
        ("Character devices:\n 1 mem\n\nBlock devices:\n508 nvidia-caps\n", None),
        ("", None),
    ],
    ids=["found", "only-similar-names", "block-section-ignored", "empty"],
)
def test_parse_char_major(text: str, expected: int | None) -> None:
    assert parse_char_major(text, "nvidia-caps") == expected


def test_parse_access() -> None:
    text = "DeviceFileMinor: 7\nDeviceFileMode: 256\nDeviceFileModify: 1\n"
    assert parse_access(text) == (7, 0o400)
    with pytest.raises(ValueError, match="no DeviceFileMinor line"):
        parse_access("DeviceFileMode: 256\n")


@pytest.mark.parametrize(
    ("gi_id", "fragment"),
    [
        (3, r"gi3/ci0/access does not exist: is the MIG device gone"),
        (5, r"gi5/access does not exist: is the MIG device gone .* --proc-root"),
        (4, r"gi4/access: no DeviceFileMinor line \(expected 'DeviceFileMinor: N'"),
    ],
    ids=["no-ci", "no-gi", "garbled"],
)
def test_missing_or_bad_access_files(gi_id: int, fragment: str) -> None:
    with pytest.raises(InventoryError, match=fragment):
        MigCapabilities(PROC).cap_nodes(0, gi_id, 0)


def test_proc_root_that_is_not_proc(tmp_path: Path) -> None:
    with pytest.raises(InventoryError, match=r"cannot read .*devices: .*is --proc-root the host"):
        MigCapabilities(tmp_path).caps_major()
    (tmp_path / "devices").write_text("Character devices:\n195 nvidia-frontend\n")
    with pytest.raises(InventoryError, match="lists no 'nvidia-caps' character device"):
        MigCapabilities(tmp_path).cap_nodes(0, 1, 0)


def test_unreadable_access_file(tmp_path: Path) -> None:
    shutil.copytree(PROC, tmp_path / "proc")
    access = tmp_path / "proc/driver/nvidia/capabilities/gpu0/mig/gi1/access"
    access.unlink()
    access.mkdir()  # reading a directory fails with an OSError other than "not found"
    with pytest.raises(InventoryError, match=r"cannot read .*gi1/access: "):
        MigCapabilities(tmp_path / "proc").cap_nodes(0, 1, 0)
