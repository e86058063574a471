"""Fixtures for integration tests: real sockets, real files, in short temp dirs.

Unix socket paths are limited to 107 bytes, and pytest's tmp_path is long, so
plugin directories live under a short ``/tmp/dra-*`` directory instead.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from dra_driver.fakes.mps_control import shell_control_path
from dra_driver.fakes.objects import resource_claim
from dra_driver.k8s.transport import ApiTransport
from tests.support.chart import plugin_transport
from tests.support.fake_mps_clients import NativeBuild, build_native_client
from tests.support.fakekube import FakeKubeApi
from tests.support.mps import Node, cleanup, make_node
from tests.support.node import NodeDirs
from tests.support.tls import SelfSigned, openssl_missing, self_signed, server_context


@pytest.fixture
def node_dirs() -> Iterator[NodeDirs]:
    root = tempfile.mkdtemp(prefix="dra-", dir="/tmp")
    dirs = NodeDirs(
        root=root,
        registry=os.path.join(root, "reg"),
        plugin=os.path.join(root, "plugin"),
        cdi=os.path.join(root, "cdi"),
        boot_id_file=os.path.join(root, "boot_id"),
    )
    for folder in (dirs.registry, dirs.plugin, dirs.cdi):
        os.makedirs(folder)
    dirs.set_boot_id("boot-1")
    yield dirs
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def native_build(tmp_path_factory: pytest.TempPathFactory) -> NativeBuild:
    """The fake MPS control's native client, built once for the session where a C
    compiler exists (``hack/build-fake-mps-client.sh``)."""
    return build_native_client(str(tmp_path_factory.mktemp("native-mps-client")))


@pytest.fixture(params=["sh", "native"])
def fifo_client(request: pytest.FixtureRequest, native_build: NativeBuild) -> str:
    """Each FIFO client of the fake MPS control in turn: the sh launcher, and the native
    client (skipped, with the build's reason, where none could be built)."""
    if request.param == "sh":
        return shell_control_path()
    if native_build.path is None:
        pytest.skip(f"no native client: {native_build.why_not}")
    return native_build.path


@pytest.fixture
def api(fake_kube: FakeKubeApi) -> ApiTransport:
    """The kubelet plugin's API transport on node-a: as its ServiceAccount where the module
    marks ``fake_kube`` with the chart (``pytest.mark.chart``), else without credentials.
    A module may define its own ``api`` (a fake API server, say) instead."""
    return plugin_transport(fake_kube)


@pytest.fixture
def v3_node() -> Iterator[Node]:
    """A node whose fake MPS speaks v3 (driver 615+), cleaned up after the test."""
    made = make_node("v3")
    yield made
    cleanup(made)


@pytest.fixture
def legacy_node() -> Iterator[Node]:
    """A node whose fake MPS speaks the legacy protocol, cleaned up after the test."""
    made = make_node("legacy")
    yield made
    cleanup(made)


@pytest.fixture
def pair(tmp_path: Path) -> SelfSigned:
    """A self-signed CA and server certificate (skips without openssl)."""
    if openssl_missing() is not None:
        pytest.skip(str(openssl_missing()))
    return self_signed(str(tmp_path / "tls"))


@pytest.fixture
def https_kube(pair: SelfSigned) -> Iterator[FakeKubeApi]:
    """The fake API server over HTTPS with ``pair``, holding claim default/c1 (uid-1)."""
    with FakeKubeApi(tls=server_context(pair)) as api:
        api.create(resource_claim("default", "c1", uid="uid-1"))
        yield api
