"""The local e2e modes' fake GPUs and node config (``tests/support/e2e_local_modes.py``).

They mirror the kind install: the same GPU set, and the MIG-enabled GPU
``MPS_MIG_GPU`` with MPS-shared MIG instances, the scheduler's even where the local
modes publish every other GPU for the controller (``--allocator controller``). An
``E2E_FAKE_GPUS`` without such a GPU skips the MIG case it cannot run, saying why.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from types import SimpleNamespace
from typing import cast

import pytest

from dra_driver.allocator import allocate
from dra_driver.core.settings import Allocator, Capabilities, NodeSettings, Sharing
from dra_driver.core.slices import build_slices
from dra_driver.fakes.gpu import build_inventory, load_spec
from dra_driver.plugin.node_config import NodeFlags, load_node_settings
from tests.support.allocator import CLASSES
from tests.support.cluster import Cluster
from tests.support.e2e_local_modes import (
    CASES,
    KIND_FAKE_GPUS,
    MPS_MIG_GPU,
    Case,
    fake_gpus,
    node_config_args,
    require_case,
)
from tests.support.examples import PLACEHOLDER, claim_of_template

CLUSTER_1_36 = cast(Cluster, SimpleNamespace(version=(1, 36)))


def settings(tmp_path: Path, allocator: str) -> NodeSettings:
    """What the local plugin reads: its flags (``--allocator``) and ``--node-config``."""
    args = node_config_args(str(tmp_path))
    assert args[:1] == ["--node-config"], args
    return load_node_settings(NodeFlags(allocator=allocator, config_file=args[1]))


def case(name: str) -> Case:
    (found,) = [c for c in CASES if c.name == name]
    return found


def test_the_default_gpus_are_the_kind_installs(monkeypatch: pytest.MonkeyPatch) -> None:
    """The defaults of hack/kind/common.sh (FAKE_GPUS, MPS_MIG_GPU) are these modes'."""
    monkeypatch.delenv("E2E_FAKE_GPUS", raising=False)
    root = Path(__file__).resolve().parents[2]
    env = {k: v for k, v in os.environ.items() if k not in ("FAKE_GPUS", "MPS_MIG_GPU")}
    done = subprocess.run(
        ["bash", "-c", 'source hack/kind/common.sh && echo "${FAKE_GPUS} ${MPS_MIG_GPU}"'],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [KIND_FAKE_GPUS, str(MPS_MIG_GPU)]
    assert fake_gpus() == KIND_FAKE_GPUS


@pytest.mark.parametrize("allocator", ["scheduler", "controller"])
def test_the_mps_mig_gpu_is_shared_and_the_schedulers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, allocator: str
) -> None:
    monkeypatch.delenv("E2E_FAKE_GPUS", raising=False)
    got = settings(tmp_path, allocator)
    mps_gpu = got.for_gpu(MPS_MIG_GPU, "GPU-4")
    assert (mps_gpu.allocator, mps_gpu.mig_sharing) == (Allocator.SCHEDULER, Sharing.MPS)
    other = got.for_gpu(3, "GPU-3")
    assert (other.allocator, other.mig_sharing) == (Allocator(allocator), Sharing.EXCLUSIVE)


def test_the_controller_share_stays_on_a_whole_gpu(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Host-process mode publishes the GPUs for its controller: the controller-path
    share goes to a whole GPU, never to the MPS-shared MIG GPU's partitions."""
    monkeypatch.delenv("E2E_FAKE_GPUS", raising=False)
    built = build_slices(
        build_inventory(load_spec(fake_gpus()), "node-a"),
        driver_name=PLACEHOLDER,
        node_name="node-a",
        settings=settings(tmp_path, "controller"),
        capabilities=Capabilities.for_version(36),
    )
    claim = claim_of_template("controller-path-share", "ns")
    outcome = allocate(
        claim,
        slices=[{"spec": s.spec} for s in built],
        classes=CLASSES,
        allocated_claims=[],
        driver_name=PLACEHOLDER,
    )
    assert outcome.allocation is not None, outcome.reason
    (result,) = outcome.allocation.results
    assert result.device in {"gpu-0", "gpu-1", "gpu-2"}, result


@pytest.mark.parametrize(
    ("gpus", "skipped", "reason"),
    [
        pytest.param(KIND_FAKE_GPUS, set(), "", id="kind"),
        pytest.param(
            "h100-80gb:3,h100-80gb:1:mig",
            {"mig-mps-shares"},
            f"no MIG-enabled GPU {MPS_MIG_GPU} (MPS_MIG_GPU)",
            id="one-mig-gpu",
        ),
        pytest.param(
            "h100-80gb:4,h100-80gb:1:mig",
            {"mig-1g-by-cel"},
            "no MIG-enabled fake GPU with exclusive instances",
            id="only-the-mps-mig-gpu",
        ),
        pytest.param("h100-80gb:5", {"mig-mps-shares", "mig-1g-by-cel"}, "", id="no-mig"),
    ],
)
def test_a_gpu_set_without_the_mig_gpus_skips_their_cases(
    monkeypatch: pytest.MonkeyPatch, gpus: str, skipped: set[str], reason: str
) -> None:
    monkeypatch.setenv("E2E_FAKE_GPUS", gpus)
    monkeypatch.setenv("E2E_MODE", "host-process")
    got = set()
    for name in ("mig-1g-by-cel", "mig-mps-shares"):
        try:
            require_case(case(name), CLUSTER_1_36)
        except pytest.skip.Exception as skip:
            got.add(name)
            assert gpus in str(skip), skip
            if reason and name in skipped:
                assert reason in str(skip), skip
    assert got == skipped


def test_no_node_config_without_the_mps_mig_gpu(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("E2E_FAKE_GPUS", "h100-80gb:3,h100-80gb:1:mig")
    assert node_config_args(str(tmp_path)) == []
    assert not list(tmp_path.iterdir())
