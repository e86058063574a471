"""KubernetesClaimSource and its error boundary against the fake API server over HTTP."""

from __future__ import annotations

import asyncio
import socket
import ssl
from pathlib import Path

import pytest

from dra_driver.base.errors import (
    ApiConflictError,
    ApiError,
    ApiNotFoundError,
    ApiUnavailableError,
    ClaimError,
    ClaimNotFoundError,
    ClaimReplacedError,
    ConfigError,
)
from dra_driver.base.ids import ClaimRef, ClaimUID, DeviceName, PoolName
from dra_driver.core.model import DeviceResult, OpaqueConfig, ResourceClaim
from dra_driver.core.ports import ClaimSource
from dra_driver.fakes.objects import Allocated, resource_claim
from dra_driver.k8s.claims import KubernetesClaimSource
from dra_driver.k8s.client import KubeClient, make_api_client
from dra_driver.k8s.errors import BODY_MAX_CHARS, translate_api_errors
from dra_driver.k8s.official import ApiException, Configuration
from dra_driver.k8s.transport import target_of
from tests.support.chart import plugin_transport
from tests.support.fakekube import DEFAULT_KINDS, FakeKubeApi
from tests.support.transport import transport_to

DRIVER = "gpu.fractional.dev"

CLAIM_PATH = "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims/c1"
GPU_CONFIG = {"apiVersion": "gpu.fractional.dev/v1alpha1", "kind": "GpuConfig"}

pytestmark = pytest.mark.chart(())
"""Claims read as the plugin reads them: its ServiceAccount, the chart's RBAC."""


@pytest.fixture
def source(fake_kube: FakeKubeApi) -> KubernetesClaimSource:
    return KubernetesClaimSource(plugin_transport(fake_kube), request_timeout_s=5)


def ref(uid: str, name: str = "c1") -> ClaimRef:
    return ClaimRef("default", name, ClaimUID(uid))


def get(source: ClaimSource, claim_ref: ClaimRef) -> ResourceClaim:
    return asyncio.run(source.get_claim(claim_ref))


# --- Reading claims ---------------------------------------------------------------


def test_allocated_claim_is_converted(
    fake_kube: FakeKubeApi, source: KubernetesClaimSource
) -> None:
    fake_kube.create(
        resource_claim(
            "default",
            "c1",
            uid="uid-1",
            node="node-a",
            devices=[
                Allocated("gpu-0", share_id="share-0", consumed_capacity={"memory": "10Gi"}),
                Allocated("gpu-1", consumed_capacity={"memory": "10Gi"}),
            ],
            configs=[{**GPU_CONFIG, "sharing": {"strategy": "MPS"}}],
        )
    )
    claim = get(source, ref("uid-1"))
    assert claim == ResourceClaim(
        ref=ref("uid-1"),
        allocated=True,
        results=(
            DeviceResult(
                request="gpu",
                driver=DRIVER,
                pool=PoolName("node-a"),
                device=DeviceName("gpu-0"),
                share_id="share-0",
                consumed_capacity={"memory": "10Gi"},
            ),
            DeviceResult(
                request="gpu",
                driver=DRIVER,
                pool=PoolName("node-a"),
                device=DeviceName("gpu-1"),
                consumed_capacity={"memory": "10Gi"},
            ),
        ),
        configs=(
            OpaqueConfig(
                source="FromClaim",
                requests=("gpu",),
                driver=DRIVER,
                parameters={**GPU_CONFIG, "sharing": {"strategy": "MPS"}},
            ),
        ),
        node_names=frozenset({"node-a"}),
    )
    assert fake_kube.requests == [("GET", CLAIM_PATH)]


def test_unallocated_claim(fake_kube: FakeKubeApi, source: KubernetesClaimSource) -> None:
    fake_kube.create(resource_claim("default", "c1", uid="uid-1", allocated=False))
    assert get(source, ref("uid-1")) == ResourceClaim(ref=ref("uid-1"), allocated=False)


def test_claims_are_read_concurrently(
    fake_kube: FakeKubeApi, source: KubernetesClaimSource
) -> None:
    refs = [ref(f"uid-{i}", f"c{i}") for i in range(6)]
    for claim_ref in refs:
        fake_kube.create(resource_claim("default", claim_ref.name, uid=claim_ref.uid))

    async def read_all() -> list[ResourceClaim]:
        return list(await asyncio.gather(*(source.get_claim(r) for r in refs)))

    assert [c.ref for c in asyncio.run(read_all())] == refs


def test_deleted_claim_is_not_found(fake_kube: FakeKubeApi, source: KubernetesClaimSource) -> None:
    fake_kube.create(resource_claim("default", "c1", uid="uid-1"))
    fake_kube.delete("ResourceClaim", "c1", "default")
    with pytest.raises(ClaimNotFoundError) as err:
        get(source, ref("uid-1"))
    assert err.value.claim == ref("uid-1")
    assert "does not exist" in str(err.value)
    assert "deleted?" in str(err.value)
    assert isinstance(err.value.__cause__, ApiNotFoundError)


def test_recreated_claim_is_replaced(fake_kube: FakeKubeApi, source: KubernetesClaimSource) -> None:
    fake_kube.create(resource_claim("default", "c1", uid="uid-new"))
    with pytest.raises(ClaimReplacedError) as err:
        get(source, ref("uid-old"))
    assert "uid-new" in str(err.value)


def test_malformed_allocation_is_a_claim_error(
    fake_kube: FakeKubeApi, source: KubernetesClaimSource
) -> None:
    claim = resource_claim("default", "c1", uid="uid-1")
    del claim["status"]["allocation"]["devices"]["results"][0]["device"]
    fake_kube.create(claim)
    with pytest.raises(ClaimError, match=r"malformed status\.allocation"):
        get(source, ref("uid-1"))


@pytest.mark.parametrize(
    ("status", "error", "retryable"),
    [
        (500, ApiUnavailableError, True),
        (503, ApiUnavailableError, True),
        (429, ApiUnavailableError, True),
        (403, ApiError, False),
        (401, ApiError, False),
        (409, ApiConflictError, False),
    ],
    ids=["500", "503", "429", "403", "401", "409"],
)
def test_api_failures_are_translated(
    fake_kube: FakeKubeApi,
    source: KubernetesClaimSource,
    status: int,
    error: type[ApiError],
    retryable: bool,
) -> None:
    fake_kube.create(resource_claim("default", "c1", uid="uid-1"))
    fake_kube.fail_next("GET", "/resourceclaims/c1", status, message=f"injected {status}")
    with pytest.raises(ApiError) as err:
        get(source, ref("uid-1"))
    assert type(err.value) is error
    assert isinstance(err.value, ApiUnavailableError) == retryable
    assert err.value.status == status
    assert str(err.value).startswith("GET resourceclaims default/c1: HTTP ")
    assert f"injected {status}" in str(err.value)
    assert isinstance(err.value.__cause__, ApiException)
    assert get(source, ref("uid-1")).allocated  # the next call goes through


def test_unserved_api_is_not_a_missing_claim() -> None:
    nodes_only = tuple(k for k in DEFAULT_KINDS if k.plural == "nodes")
    with FakeKubeApi(nodes_only) as fake:
        claims = KubernetesClaimSource(transport_to(fake.url))
        with pytest.raises(ApiNotFoundError, match=r"resource\.k8s\.io/v1 served") as err:
            get(claims, ref("uid-1"))
    assert not isinstance(err.value, ClaimNotFoundError)


def test_dropped_connections_are_unavailable(
    fake_kube: FakeKubeApi, source: KubernetesClaimSource
) -> None:
    fake_kube.drop_next("GET", "/resourceclaims/c1", times=10)  # beyond the one resend
    with pytest.raises(ApiUnavailableError, match="transport error") as err:
        get(source, ref("uid-1"))
    assert err.value.status is None


def test_unreachable_server_is_unavailable() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed again before the call: nothing listens
    claims = KubernetesClaimSource(transport_to(f"http://127.0.0.1:{port}"))
    with pytest.raises(ApiUnavailableError, match="GET resourceclaims default/c1"):
        get(claims, ref("uid-1"))


# --- The error boundary (pure mapping) -------------------------------------------------


@pytest.mark.parametrize(
    ("status", "expected"),
    [
        (404, ApiNotFoundError),
        (409, ApiConflictError),
        (429, ApiUnavailableError),
        (500, ApiUnavailableError),
        (504, ApiUnavailableError),
        (0, ApiUnavailableError),
        (400, ApiError),
        (403, ApiError),
        (422, ApiError),
    ],
)
def test_status_mapping(status: int, expected: type[ApiError]) -> None:
    with pytest.raises(ApiError) as err, translate_api_errors("PUT nodes n1"):
        raise ApiException(status=status, reason="Some Reason")
    assert type(err.value) is expected
    assert str(err.value).startswith("PUT nodes n1: ")


@pytest.mark.parametrize(
    "transport_error",
    [
        ConnectionRefusedError(111, "Connection refused"),
        ConnectionError("ServerDisconnectedError: Server disconnected"),  # aiohttp's, as OSError
        ssl.SSLCertVerificationError("certificate verify failed"),
        TimeoutError("timed out"),
    ],
    ids=["refused", "server-disconnected", "tls", "timeout"],
)
def test_transport_errors_are_unavailable(transport_error: Exception) -> None:
    with pytest.raises(ApiUnavailableError) as err, translate_api_errors("GET nodes n1"):
        raise transport_error
    assert err.value.__cause__ is transport_error
    assert type(transport_error).__name__ in str(err.value)


def test_long_bodies_are_truncated() -> None:
    body = "x" * 5000
    with pytest.raises(ApiError) as err, translate_api_errors("GET nodes n1"):
        raise ApiException(status=403, reason="Forbidden", body=body)
    message = str(err.value)
    assert len(message) < BODY_MAX_CHARS + 100
    assert "more chars" in message


def test_status_message_is_preferred_over_raw_body() -> None:
    body = '{"kind": "Status", "apiVersion": "v1", "message": "nodes is forbidden", "code": 403}'
    with pytest.raises(ApiError) as err, translate_api_errors("GET nodes n1"):
        raise ApiException(status=403, reason="Forbidden", body=body)
    assert str(err.value) == "GET nodes n1: HTTP 403: Forbidden: nodes is forbidden"


# --- make_api_client ------------------------------------------------------------------

KUBECONFIG = """\
apiVersion: v1
kind: Config
clusters:
- name: test
  cluster: {server: "https://10.0.0.1:6443", insecure-skip-tls-verify: true}
users:
- name: test
  user: {token: abc}
contexts:
- name: test
  context: {cluster: test, user: test}
current-context: test
"""


@pytest.fixture
def no_cluster_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.kube/config
    return tmp_path


def test_explicit_host_needs_no_configuration(no_cluster_env: Path) -> None:
    api = make_api_client(None, host="http://127.0.0.1:1/")
    assert api.configuration.host == "http://127.0.0.1:1"


@pytest.mark.parametrize("via", ["flag", "env"])
def test_kubeconfig_file(no_cluster_env: Path, monkeypatch: pytest.MonkeyPatch, via: str) -> None:
    path = no_cluster_env / "config"
    path.write_text(KUBECONFIG)
    if via == "env":
        monkeypatch.setenv("KUBECONFIG", str(path))
    api = make_api_client(str(path) if via == "flag" else None)
    assert api.configuration.host == "https://10.0.0.1:6443"


def test_missing_configuration_names_the_flag(no_cluster_env: Path) -> None:
    with pytest.raises(ConfigError, match="--kubeconfig") as err:
        make_api_client(None)
    assert "KUBECONFIG" in str(err.value)
    assert "KUBERNETES_SERVICE_HOST" in str(err.value)


def test_missing_explicit_kubeconfig(no_cluster_env: Path) -> None:
    with pytest.raises(ConfigError, match=r"'/nonexistent/config' \(--kubeconfig\)"):
        make_api_client("/nonexistent/config")


def test_broken_kubeconfig(no_cluster_env: Path) -> None:
    path = no_cluster_env / "config"
    path.write_text("apiVersion: v1\nkind: Config\ncurrent-context: nowhere\n")
    with pytest.raises(ConfigError, match="is unusable"):
        make_api_client(str(path))


def test_in_cluster_without_service_account(
    no_cluster_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    with pytest.raises(ConfigError, match="in-cluster"):
        make_api_client(None)


def test_a_host_with_a_path_keeps_it_before_every_api_path() -> None:
    """A proxy in front of the API server (``https://rancher/k8s/clusters/c-1``)."""
    api = make_api_client(None, host="https://rancher.example/k8s/clusters/c-1/")
    target = target_of(api.configuration)
    assert target is not None and target.base_url.endswith("/k8s/clusters/c-1")
    api = make_api_client(None, host="https://10.0.0.1:6443")
    target = target_of(api.configuration)
    assert target is not None and target.base_url == "https://10.0.0.1:6443"


def test_behind_an_http_proxy_the_requests_go_through_it() -> None:
    configuration = Configuration(host="https://10.0.0.1:6443")
    configuration.proxy = "http://127.0.0.1:3128"
    target = target_of(KubeClient(configuration).configuration)
    assert target is not None and target.proxy == "http://127.0.0.1:3128"
