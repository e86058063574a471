"""Node settings from flags and the per-node file."""

from __future__ import annotations

from pathlib import Path

import pytest

from dra_driver.base.errors import ConfigError
from dra_driver.core.settings import Allocator, GpuSettings, Sharing
from dra_driver.plugin.node_config import NodeFlags, load_node_settings


def test_flags_alone() -> None:
    settings = load_node_settings(
        NodeFlags(sharing="exclusive", allocator="controller", memory_reserve="1Gi", max_clients=8)
    )
    assert settings.default == GpuSettings(Sharing.EXCLUSIVE, Allocator.CONTROLLER)
    assert settings.memory_reserve_bytes == 2**30
    assert settings.memory_step_bytes == 256 * 2**20
    assert settings.max_clients == 8
    assert settings.per_gpu == {}


def test_file_overrides_flags_and_sets_per_gpu(tmp_path: Path) -> None:
    path = tmp_path / "node.yaml"
    path.write_text(
        "sharing: timeslicing\nmemoryStep: 512Mi\n"
        "gpus:\n  1: {sharing: exclusive}\n  GPU-abc: {allocator: controller}\n"
    )
    settings = load_node_settings(NodeFlags(sharing="mps", config_file=str(path)))
    assert settings.default.sharing is Sharing.TIMESLICING
    assert settings.memory_step_bytes == 512 * 2**20
    assert settings.for_gpu(1, "GPU-x") == GpuSettings(Sharing.EXCLUSIVE, Allocator.SCHEDULER)
    assert settings.for_gpu(0, "GPU-abc") == GpuSettings(Sharing.TIMESLICING, Allocator.CONTROLLER)
    assert settings.for_gpu(0, "GPU-other") == settings.default


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("sharingg: mps\n", "unknown key(s) ['sharingg']; allowed: sharing"),
        ("sharing: mig\n", "'mig' is not one of mps, timeslicing, exclusive"),
        ("allocator: me\n", "allocator: 'me' is not one of scheduler, controller"),
        ("memoryReserve: lots\n", "memoryReserve: 'lots' is not a quantity"),
        ("memoryStep: 0\n", "memoryStep must be positive"),
        ("maxClients: 0\n", "maxClients must be a positive integer"),
        ("gpus: [0]\n", "gpus must map a GPU index or UUID"),
        ("gpus: {0: {shares: 2}}\n", "gpus[0]: unknown key(s) ['shares']"),
        ("gpus: {0: exclusive}\n", "gpus[0]: expected a mapping"),
        ("- a list\n", "expected a mapping at the top"),
    ],
    ids=lambda v: v[:18],
)
def test_bad_file(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "node.yaml"
    path.write_text(content)
    with pytest.raises(ConfigError) as info:
        load_node_settings(NodeFlags(config_file=str(path)))
    assert message in str(info.value)
    assert str(path) in str(info.value)


def test_missing_file() -> None:
    with pytest.raises(ConfigError, match="cannot read it"):
        load_node_settings(NodeFlags(config_file="/nonexistent/node.yaml"))


@pytest.mark.parametrize(
    ("content", "gpu0", "gpu1"),
    [
        ("sharing: mps\n", Sharing.EXCLUSIVE, Sharing.EXCLUSIVE),
        ("gpus: {0: {sharing: mps}}\n", Sharing.MPS, Sharing.EXCLUSIVE),
        ("sharing: mps\ngpus: {0: {allocator: controller}}\n", Sharing.EXCLUSIVE,
         Sharing.EXCLUSIVE),
        ("gpus: {0: {sharing: timeslicing}, 1: {sharing: exclusive}}\n", Sharing.EXCLUSIVE,
         Sharing.EXCLUSIVE),
    ],
    ids=["node-wide", "per-gpu", "per-gpu-without-sharing", "timeslicing"],
)  # fmt: skip
def test_mig_sharing_only_from_the_gpus_own_sharing(
    tmp_path: Path, content: str, gpu0: Sharing, gpu1: Sharing
) -> None:
    """A MIG GPU's instances are MPS-shared only when its own entry says ``sharing: mps``."""
    path = tmp_path / "node.yaml"
    path.write_text(content)
    settings = load_node_settings(NodeFlags(config_file=str(path)))
    assert settings.for_gpu(0, "GPU-a").mig_sharing is gpu0
    assert settings.for_gpu(1, "GPU-b").mig_sharing is gpu1
