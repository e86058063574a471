"""``CdiStore``: the transient CDI spec files under ``--cdi-root``."""

from __future__ import annotations

from pathlib import Path

from dra_driver.plugin.cdi_store import CdiStore


def test_the_store_says_whether_a_spec_file_exists(tmp_path: Path) -> None:
    cdi = CdiStore(str(tmp_path / "cdi"), "k8s.gpu.fractional.dev/claim", fsync=False)
    path = cdi.path_for("uid-1")
    assert not cdi.exists(path)
    assert cdi.write("uid-1", {"cdiVersion": "0.6.0"}) == path
    assert cdi.exists(path)
    assert cdi.remove(path)
    assert not cdi.exists(path)
