"""Every MPS socket path fits a unix socket address (issue 26, finding 1)."""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
from pathlib import Path

import pytest

from dra_driver.mpsagent import commands as cmd
from dra_driver.mpsagent import layout
from dra_driver.mpsagent.daemon_files import DaemonDirs, DaemonError

CHART_STATE_DIR = "/run/fractional-gpu-dra/mps"
"""deploy/helm values.yaml mpsAgent.stateDir, also the CLI's --state-dir default."""
GPU = "GPU-ef25f851-0d3c-7a2b-91e4-5c6d7e8f9a0b"
MIG = "MIG-0b4c8a3e-12d4-5f6a-8b9c-0d1e2f3a4b5c"
K8S_UID = "7d3f52c1-9b1e-4a57-8d8e-2f0c6f1a9b10"


def _namespace_socket(state_dir: str, gpu: str, share_id: str) -> str:
    pipe = DaemonDirs.for_gpu(state_dir, gpu).pipe
    return os.path.join(cmd.v3_namespace_dir(pipe, cmd.namespace_name(share_id)), "control")


@pytest.mark.parametrize("gpu", [GPU, MIG])
@pytest.mark.parametrize("share_id", [K8S_UID, "s" * 128], ids=["k8s-uid", "longest-share-id"])
def test_namespace_socket_under_the_charts_state_dir_fits(gpu: str, share_id: str) -> None:
    path = _namespace_socket(CHART_STATE_DIR, gpu, share_id)
    # Before: /run/fractional-gpu-dra/mps/GPU-<36>/pipe/shares/s_<36>/control, 127 bytes.
    assert len(path.encode()) == len(CHART_STATE_DIR) + layout.LONGEST_SOCKET_SUFFIX
    assert len(path.encode()) <= layout.UNIX_PATH_MAX
    assert path.startswith(f"{CHART_STATE_DIR}/{layout.gpu_dir_name(gpu)}/pipe/shares/s_")


def test_the_longest_allowed_state_dir_still_binds() -> None:
    # The kernel is the judge: a socket at the deepest path under the longest state
    # dir check_state_dir accepts really binds.
    base = tempfile.mkdtemp(prefix="lay-", dir="/tmp")
    try:
        state_dir = (base + "/" + "d" * layout.MAX_STATE_DIR_BYTES)[: layout.MAX_STATE_DIR_BYTES]
        layout.check_state_dir(state_dir)
        path = _namespace_socket(state_dir, GPU, K8S_UID)
        assert len(path.encode()) == layout.UNIX_PATH_MAX
        os.makedirs(os.path.dirname(path))
        with socket.socket(socket.AF_UNIX) as sock:
            sock.bind(path)
        too_long = pytest.raises(OSError, match="AF_UNIX path too long")
        with socket.socket(socket.AF_UNIX) as sock, too_long:
            sock.bind(path + "x")
    finally:
        shutil.rmtree(base)


def test_a_state_dir_without_room_is_refused_naming_the_flag() -> None:
    too_long = "/" + "d" * layout.MAX_STATE_DIR_BYTES
    with pytest.raises(layout.StateDirTooLong) as err:
        layout.check_state_dir(too_long)
    message = str(err.value)
    assert too_long in message and "--state-dir" in message and "mpsAgent.stateDir" in message
    assert f"at most {layout.MAX_STATE_DIR_BYTES} bytes" in message


def test_a_namespace_path_over_the_limit_is_refused_where_it_is_made() -> None:
    pipe = "/" + "p" * 90
    with pytest.raises(layout.SocketPathTooLong) as err:
        cmd.v3_namespace_dir(pipe, cmd.namespace_name(K8S_UID))
    assert "107" in str(err.value) and pipe in str(err.value)


def test_a_daemon_dir_too_long_for_its_control_socket_is_a_daemon_error() -> None:
    with pytest.raises(layout.SocketPathTooLong, match="control"):
        DaemonDirs.for_gpu("/" + "d" * 90, GPU)


def test_gpu_dirs_are_short_fixed_and_record_their_uuid(tmp_path: Path) -> None:
    names = {layout.gpu_dir_name(GPU), layout.gpu_dir_name(MIG)}
    assert all(len(n) == 14 for n in names) and len(names) == 2
    assert layout.gpu_dir_name(MIG).startswith("mig-")
    dirs = DaemonDirs.for_gpu(str(tmp_path), GPU)
    dirs.create()
    with open(os.path.join(dirs.root, layout.GPU_UUID_FILE)) as f:
        assert f.read().strip() == GPU
    # Another UUID on the same short name (a collision) is refused, naming both.
    clash = DaemonDirs(MIG, dirs.root, dirs.pipe, dirs.log, dirs.shm)
    with pytest.raises(DaemonError, match=f"belongs to {GPU}.*not to {MIG}"):
        clash.create()


def test_old_layout_dirs_are_recognised() -> None:
    assert layout.is_old_gpu_dir(GPU) and layout.is_old_gpu_dir(MIG)
    assert not layout.is_old_gpu_dir(layout.gpu_dir_name(GPU))
    assert not layout.is_old_gpu_dir("retired-" + GPU)
    assert not layout.is_old_gpu_dir("mps-agent-state.json")
