"""Socket names of the registration and DRA services, and stale-socket cleanup."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from dra_driver.base.errors import ConfigError
from dra_driver.kubeletplugin.sockets import remove_stale_socket, socket_paths

DRIVER = "gpu.fractional.dev"
REGISTRY = "/var/lib/kubelet/plugins_registry"
PLUGIN = "/var/lib/kubelet/plugins/gpu.fractional.dev"
POD_UID = "5f0d1c2b-3a49-4e8f-b6a7-9c0d1e2f3a4b"
LIMIT = 107  # sun_path is 108 bytes with the terminating NUL


def size(path: str) -> int:
    return len(os.fsencode(path))


def dir_of_length(n: int) -> str:
    """An absolute directory path exactly ``n`` bytes long."""
    path = "/" + "r" * (n - 1)
    assert size(path) == n
    return path


def test_default_names() -> None:
    paths = socket_paths(DRIVER, REGISTRY, PLUGIN)
    assert paths.registration == f"{REGISTRY}/{DRIVER}-reg.sock"
    assert paths.dra == f"{PLUGIN}/dra.sock"


def test_relative_dirs_become_absolute(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)
    paths = socket_paths(DRIVER, "reg", "plug")
    assert paths.registration == str(tmp_path / "reg" / f"{DRIVER}-reg.sock")
    assert paths.dra == str(tmp_path / "plug" / "dra.sock")


@pytest.mark.parametrize("uid", [None, ""], ids=["none", "empty"])
def test_no_uid_means_default_names(uid: str | None) -> None:
    assert socket_paths(DRIVER, REGISTRY, PLUGIN, uid) == socket_paths(DRIVER, REGISTRY, PLUGIN)


def test_rolling_update_names() -> None:
    paths = socket_paths(DRIVER, REGISTRY, PLUGIN, POD_UID)
    assert paths.registration == f"{REGISTRY}/{DRIVER}-{POD_UID}-reg.sock"
    assert paths.dra == f"{PLUGIN}/dra-{POD_UID}.sock"
    other = socket_paths(DRIVER, REGISTRY, PLUGIN, "another-pod-uid")
    assert other.registration != paths.registration
    assert other.dra != paths.dra


FULL_NAME = f"/{DRIVER}-{POD_UID}-reg.sock"
FULL_FITS = LIMIT - len(FULL_NAME)
SHORTEST_FITS = LIMIT - len("/dra-") - 22 - len("-reg.sock")  # 22: base64 of 16 bytes


@pytest.mark.parametrize(
    ("registry_length", "form"),
    [
        (FULL_FITS, "full"),
        (FULL_FITS + 1, "driver-hash"),
        (60, "driver-hash"),
        (SHORTEST_FITS, "shortest-hash"),
    ],
    ids=["full-just-fits", "full-one-over", "60", "shortest-just-fits"],
)
def test_long_registry_dir_falls_back_to_hashed_names(registry_length: int, form: str) -> None:
    registry = dir_of_length(registry_length)
    paths = socket_paths(DRIVER, registry, PLUGIN, POD_UID)
    assert size(paths.registration) <= LIMIT
    assert os.path.dirname(paths.registration) == registry
    name = os.path.basename(paths.registration)
    assert name.endswith("-reg.sock")
    got = (
        "full"
        if POD_UID in name
        else "driver-hash"
        if name.startswith(f"{DRIVER}-")
        else "shortest-hash"
    )
    assert got == form
    # Deterministic (a restarted pod finds its own socket) and per-pod.
    assert socket_paths(DRIVER, registry, PLUGIN, POD_UID) == paths
    assert socket_paths(DRIVER, registry, PLUGIN, POD_UID + "x").registration != (
        paths.registration
    )


def test_every_length_that_fits_gets_a_name() -> None:
    for length in range(2, SHORTEST_FITS + 1):
        registration = socket_paths(DRIVER, dir_of_length(length), PLUGIN, POD_UID).registration
        assert size(registration) <= LIMIT, length


def test_hashed_names_differ_per_driver() -> None:
    registry = dir_of_length(SHORTEST_FITS)
    a = socket_paths("gpu.fractional.dev", registry, PLUGIN, POD_UID).registration
    b = socket_paths("gpu.other.dev", registry, PLUGIN, POD_UID).registration
    assert a != b


def test_registry_dir_too_long_even_for_hashed_name() -> None:
    with pytest.raises(ConfigError, match="--registry-dir"):
        socket_paths(DRIVER, dir_of_length(SHORTEST_FITS + 1), PLUGIN, POD_UID)


@pytest.mark.parametrize("uid", [None, POD_UID], ids=["default", "rolling-update"])
def test_dra_socket_path_too_long(uid: str | None) -> None:
    plugin_dir = dir_of_length(LIMIT - len("/dra.sock") + 1)
    with pytest.raises(ConfigError) as info:
        socket_paths(DRIVER, REGISTRY, plugin_dir, uid)
    message = str(info.value)
    assert "--plugin-dir" in message
    assert "DRA socket" in message
    assert str(LIMIT) in message


def test_dra_socket_path_at_the_limit() -> None:
    plugin_dir = dir_of_length(LIMIT - len("/dra.sock"))
    assert size(socket_paths(DRIVER, REGISTRY, plugin_dir).dra) == LIMIT


# --- remove_stale_socket --------------------------------------------------------------


@pytest.fixture
def bound_socket(tmp_path: Path) -> Iterator[str]:
    """A real unix socket file, as a previous plugin run leaves it behind."""
    path = str(tmp_path / "dra.sock")
    assert size(path) <= LIMIT, "tmp_path too long for a unix socket"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(path)
    sock.close()  # closing does not remove the file: that is the stale socket
    yield path


def test_remove_stale_socket(bound_socket: str) -> None:
    # Binding over a stale socket file fails; that is why it must go.
    with socket.socket(socket.AF_UNIX) as again, pytest.raises(OSError):
        again.bind(bound_socket)
    assert remove_stale_socket(bound_socket) is True
    assert not os.path.lexists(bound_socket)
    with socket.socket(socket.AF_UNIX) as again:
        again.bind(bound_socket)


def test_remove_stale_socket_absent(tmp_path: Path) -> None:
    assert remove_stale_socket(str(tmp_path / "dra.sock")) is False


@pytest.mark.parametrize("kind", ["file", "directory", "symlink"])
def test_remove_stale_socket_refuses_other_files(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "dra.sock"
    if kind == "file":
        path.write_text("not a socket")
    elif kind == "directory":
        path.mkdir()
    else:
        path.symlink_to(tmp_path / "elsewhere")
    with pytest.raises(ConfigError) as info:
        remove_stale_socket(str(path))
    assert str(path) in str(info.value)
    assert "not a socket" in str(info.value)
    assert os.path.lexists(path)


def test_a_live_socket_is_not_taken_over(tmp_path: Path) -> None:
    path = str(tmp_path / "dra.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(1)
    try:
        with pytest.raises(ConfigError, match="--rolling-update-uid"):
            remove_stale_socket(path)
        assert os.path.exists(path)
    finally:
        listener.close()
    assert remove_stale_socket(path)  # closed now: stale
    assert not os.path.exists(path)
