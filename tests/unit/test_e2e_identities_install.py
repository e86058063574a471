"""Host-process e2e's :func:`install` against the fake API server, whose deleted
namespaces stay ``Terminating`` as a real server's do: what it replaces is waited out
(404) before it is created again, instead of failing with ``409 object is being
deleted`` (issue 32)."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from tests.support import cluster as cluster_support
from tests.support.e2e_identities import E2E_NAMESPACE, install
from tests.support.eventually import eventually_sync
from tests.support.fakekube import FakeKubeApi
from tests.support.http import send_json


@dataclasses.dataclass
class _Resource:
    """The slice of the dynamic client's resource that :func:`install` uses, over HTTP."""

    fake: FakeKubeApi
    collection: str
    """The collection's path; ``{ns}`` stands for the namespace."""
    namespaced: bool

    def _call(self, method: str, path: str, body: Any = None) -> Any:
        code, answer = send_json(self.fake, method, path, body)
        if code >= 400:
            raise ApiException(status=code, reason=answer.get("message"))
        return answer

    def create(self, body: Any, namespace: str = "") -> Any:
        return self._call("POST", self.collection.format(ns=namespace), body)

    def delete(self, name: str, namespace: str = "") -> Any:
        return self._call("DELETE", f"{self.collection.format(ns=namespace)}/{name}")

    def get(self, name: str, namespace: str = "") -> Any:
        return self._call("GET", f"{self.collection.format(ns=namespace)}/{name}")


@dataclasses.dataclass
class _Cluster:
    """What :func:`install` and :func:`tests.support.cluster.delete_namespace` read of
    a cluster: ``resource``, ``core`` (the official client) and ``delete_timeout_s``."""

    fake: FakeKubeApi
    core: client.CoreV1Api
    delete_timeout_s: float = 10.0

    def resource(self, api_version: str, kind: str) -> _Resource:
        paths = {
            ("v1", "Namespace"): ("/api/v1/namespaces", False),
            ("coordination.k8s.io/v1", "Lease"): (
                "/apis/coordination.k8s.io/v1/namespaces/{ns}/leases",
                True,
            ),
        }
        path, namespaced = paths[(api_version, kind)]
        return _Resource(self.fake, path, namespaced)


@pytest.fixture
def cluster(fake_kube: FakeKubeApi, monkeypatch: pytest.MonkeyPatch) -> Iterator[_Cluster]:
    monkeypatch.setattr(cluster_support, "POLL_S", 0.05)  # delete_namespace's polls
    with client.ApiClient(client.Configuration(host=fake_kube.url)) as api_client:
        yield _Cluster(fake_kube, client.CoreV1Api(api_client))


NAMESPACE: dict[str, Any] = {
    "apiVersion": "v1",
    "kind": "Namespace",
    "metadata": {"name": E2E_NAMESPACE},
}
LEASE_NAME = "fgd-e2e-controller"
LEASE: dict[str, Any] = {
    "apiVersion": "coordination.k8s.io/v1",
    "kind": "Lease",
    "metadata": {"name": LEASE_NAME, "namespace": E2E_NAMESPACE},
    "spec": {},
}


def namespace_posts(fake: FakeKubeApi) -> list[int]:
    """The answers to the creates of a namespace so far."""
    return [
        a.code
        for a in fake.answer_log
        if (a.request.method, a.request.path) == ("POST", "/api/v1/namespaces")
    ]


def test_install_waits_out_a_namespace_left_terminating(
    cluster: _Cluster, fake_kube: FakeKubeApi
) -> None:
    """The previous module's uninstall deleted the namespace; a finalizer on what is in
    it holds it ``Terminating`` until install has been refused and is waiting."""
    held = {**LEASE, "metadata": {**LEASE["metadata"], "finalizers": ["example.com/keep"]}}
    old = fake_kube.create(NAMESPACE)
    fake_kube.create(held)
    fake_kube.delete("Namespace", E2E_NAMESPACE)

    def release_once_refused() -> None:
        eventually_sync(lambda: 409 in namespace_posts(fake_kube), "install refused")
        fake_kube.patch("Lease", LEASE_NAME, {"metadata": {"finalizers": None}}, E2E_NAMESPACE)

    releaser = threading.Thread(target=release_once_refused)
    releaser.start()
    try:
        assert [d["kind"] for d in install(cluster, [LEASE])] == ["Namespace", "Lease"]
    finally:
        releaser.join()
    assert namespace_posts(fake_kube) == [409, 201]
    namespace = fake_kube.get("Namespace", E2E_NAMESPACE)
    assert namespace["status"]["phase"] == "Active"
    assert namespace["metadata"]["uid"] != old["metadata"]["uid"]
    lease = fake_kube.get("Lease", LEASE_NAME, E2E_NAMESPACE)
    assert "deletionTimestamp" not in lease["metadata"]
    assert "finalizers" not in lease["metadata"]  # ours, not the one that went


def test_install_replaces_a_namespace_left_active(
    cluster: _Cluster, fake_kube: FakeKubeApi
) -> None:
    old = fake_kube.create(NAMESPACE)
    assert [d["kind"] for d in install(cluster, [LEASE])] == ["Namespace", "Lease"]
    assert fake_kube.get("Namespace", E2E_NAMESPACE)["metadata"]["uid"] != old["metadata"]["uid"]


def test_install_gives_up_on_a_namespace_that_does_not_go(
    cluster: _Cluster, fake_kube: FakeKubeApi
) -> None:
    cluster.delete_timeout_s = 0.3
    held = {**LEASE, "metadata": {**LEASE["metadata"], "finalizers": ["example.com/keep"]}}
    fake_kube.create(NAMESPACE)
    fake_kube.create(held)
    with pytest.raises(RuntimeError, match="still there"):
        list(install(cluster, []))
