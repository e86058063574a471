"""``CdiStore``: the transient CDI spec files under ``--cdi-root``."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

from dra_driver.plugin.cdi_store import CdiStore
from dra_driver.state.filesystems import on_memory_filesystem


def test_the_store_says_whether_a_spec_file_exists(tmp_path: Path) -> None:
    cdi = CdiStore(str(tmp_path / "cdi"), "k8s.gpu.fractional.dev/claim", fsync=False)
    path = cdi.path_for("uid-1")
    assert not cdi.exists(path)
    assert cdi.write("uid-1", {"cdiVersion": "0.6.0"}) == path
    assert cdi.exists(path)
    assert cdi.remove(path)
    assert not cdi.exists(path)


def test_a_store_on_a_memory_filesystem_says_so(tmp_path: Path) -> None:
    """The chart's /var/run/cdi is a tmpfs: writes there are made from the event loop."""
    if not on_memory_filesystem("/dev/shm"):
        pytest.skip("/dev/shm is not a tmpfs here")
    shm = tempfile.mkdtemp(dir="/dev/shm")
    try:
        assert CdiStore(os.path.join(shm, "cdi"), "k8s.gpu.fractional.dev/claim").in_memory
    finally:
        shutil.rmtree(shm)
    on_disk = CdiStore(str(tmp_path / "cdi"), "k8s.gpu.fractional.dev/claim")
    assert on_disk.in_memory == on_memory_filesystem(str(tmp_path))
