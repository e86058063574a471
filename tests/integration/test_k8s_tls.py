"""The client over HTTPS, as every real API server serves: the in-cluster configuration
(service-account token and CA file, ``https://$KUBERNETES_SERVICE_HOST``), a kubeconfig
naming the CA, and a server certificate nobody vouches for."""

from __future__ import annotations

import asyncio
import importlib
from pathlib import Path
from typing import Any

import pytest

from dra_driver.base.errors import ApiUnavailableError
from dra_driver.base.ids import ClaimRef, ClaimUID
from dra_driver.k8s import client as client_module
from dra_driver.k8s.claims import KubernetesClaimSource
from dra_driver.k8s.client import USER_AGENT, KubeClient, make_api_client
from dra_driver.k8s.official import Configuration
from dra_driver.k8s.transport import api_transport
from tests.support.fakekube import FakeKubeApi
from tests.support.tls import SelfSigned, openssl_missing, self_signed

pytestmark = pytest.mark.skipif(openssl_missing() is not None, reason=str(openssl_missing()))

TOKEN = "service-account-token"


def trusting(url: str, ca_file: str, **kwargs: Any) -> KubeClient:
    """A client of ``url`` that trusts the CA in ``ca_file``, without credentials."""
    configuration = Configuration(host=url)
    configuration.ssl_ca_cert = ca_file
    return KubeClient(configuration, **kwargs)


def read_claim(client: KubeClient) -> str:
    http = api_transport(client)

    async def read() -> str:
        source = KubernetesClaimSource(http, request_timeout_s=5)
        try:
            claim = await source.get_claim(ClaimRef("default", "c1", ClaimUID("uid-1")))
        finally:
            await http.close()
        return claim.ref.name

    return asyncio.run(read())


def test_in_cluster_configuration_talks_https_with_the_token(
    https_kube: FakeKubeApi, pair: SelfSigned, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The pod's path: the official in-cluster loader, the service account's files."""
    token = tmp_path / "token"
    token.write_text(TOKEN)
    loader = importlib.import_module("kubernetes.config.incluster_config")
    monkeypatch.setattr(loader, "SERVICE_TOKEN_FILENAME", str(token))
    monkeypatch.setattr(loader, "SERVICE_CERT_FILENAME", pair.cert)
    port = https_kube.url.rsplit(":", 1)[1]
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "127.0.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", port)
    client = make_api_client(None)
    assert client.configuration.host == f"https://127.0.0.1:{port}"
    assert read_claim(client) == "c1"
    (request,) = [r for r in https_kube.request_log if r.path.endswith("/resourceclaims/c1")]
    # The official loader writes the scheme in lower case; HTTP auth schemes are
    # case-insensitive (RFC 9110), and the API server reads them so.
    assert request.authorization is not None
    scheme, _, sent = request.authorization.partition(" ")
    assert (scheme.lower(), sent) == ("bearer", TOKEN)
    assert request.user_agent == USER_AGENT


def test_kubeconfig_with_the_ca_talks_https(
    https_kube: FakeKubeApi, pair: SelfSigned, tmp_path: Path
) -> None:
    """The host-process path: a kubeconfig naming the server, its CA and a token."""
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\n"
        f"clusters: [{{name: c, cluster: {{server: '{https_kube.url}', "
        f"certificate-authority: '{pair.cert}'}}}}]\n"
        f"users: [{{name: u, user: {{token: {TOKEN}}}}}]\n"
        "contexts: [{name: x, context: {cluster: c, user: u}}]\ncurrent-context: x\n"
    )
    client = make_api_client(str(kubeconfig))
    assert read_claim(client) == "c1"
    assert {r.authorization for r in https_kube.request_log} == {f"Bearer {TOKEN}"}


def test_a_server_certificate_nobody_vouches_for_is_refused(
    https_kube: FakeKubeApi, tmp_path: Path
) -> None:
    """Another CA than the server's: the TLS handshake fails, and it is a transport
    error of that claim, not a crash."""
    other = self_signed(str(tmp_path / "other"))
    client = trusting(https_kube.url, other.cert)
    with pytest.raises(ApiUnavailableError, match="transport error"):
        read_claim(client)


def test_a_rotated_token_is_sent_once_the_reuse_window_ends(
    https_kube: FakeKubeApi, pair: SelfSigned
) -> None:
    """The credentials' headers are computed once per window, not per request (the
    in-cluster hook costs a scan of the environment), and a new token goes out after."""
    clock = [1000.0]
    asked: list[str] = []

    def refresh(configuration: Any) -> None:
        asked.append(configuration.api_key["BearerToken"])

    fresh = trusting(https_kube.url, pair.cert, clock=lambda: clock[0])
    fresh.configuration.api_key = {"BearerToken": "old"}
    fresh.configuration.api_key_prefix = {"BearerToken": "Bearer"}
    settings: Any = fresh.configuration  # the client's attributes are typed too narrowly
    settings.refresh_api_key_hook = refresh
    for _ in range(3):
        assert read_claim(fresh) == "c1"
    fresh.configuration.api_key = {"BearerToken": "new"}  # the loader re-read the file
    assert read_claim(fresh) == "c1"  # still inside the window
    clock[0] += client_module.AUTH_REUSE_S
    assert read_claim(fresh) == "c1"
    sent = [r.authorization for r in https_kube.request_log]
    assert sent == ["Bearer old"] * 4 + ["Bearer new"]
    assert len(asked) == 2
