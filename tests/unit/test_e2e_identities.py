"""What host-process e2e installs and hands its processes: the chart's identities
under the e2e release, TokenRequests bound to the node, kubeconfigs with the tokens."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.support.chart import helm_binary
from tests.support.e2e_identities import (
    E2E_LEASE,
    E2E_NAMESPACE,
    E2E_RELEASE,
    IDENTITY_KINDS,
    account_name,
    identity_manifests,
    kubeconfig_with_token,
    token_request,
)

DRIVER = "gpu.fractional.dev"


@pytest.mark.skipif(helm_binary() is None, reason="helm not found: run hack/install-helm.sh")
@pytest.mark.parametrize("guard", [False, True])
def test_the_chart_identities_for_host_processes(guard: bool) -> None:
    docs = identity_manifests(DRIVER, E2E_LEASE, guard=guard)
    kinds = [d["kind"] for d in docs]
    assert kinds == sorted(kinds, key=IDENTITY_KINDS.index), "bindings after what they bind"
    assert set(kinds) == set(IDENTITY_KINDS)
    plugin, controller = account_name(docs, "kubelet-plugin"), account_name(docs, "controller")
    assert account_name(docs, "mps-agent")  # created, with no token mounted and no RBAC
    namespaced = [d for d in docs if d["kind"] in ("ServiceAccount", "Role", "RoleBinding")]
    assert {d["metadata"]["namespace"] for d in namespaced} == {E2E_NAMESPACE}
    (role,) = [d for d in docs if d["kind"] == "Role"]
    assert {n for r in role["rules"] for n in r.get("resourceNames", [])} == {E2E_LEASE}
    policies = [d for d in docs if d["kind"] == "ValidatingAdmissionPolicy"]
    # The users' claims policy comes along: it checks whoever writes a claim.
    (claims,) = [p for p in policies if p["metadata"]["name"].endswith("-mps-shares-one-daemon")]
    assert claims["metadata"]["name"] == f"{E2E_RELEASE}-fractional-gpu-dra-mps-shares-one-daemon"
    user = f"system:serviceaccount:{E2E_NAMESPACE}:{plugin}"
    narrowing = [p for p in policies if p is not claims]
    assert narrowing and all(
        user in p["spec"]["matchConditions"][0]["expression"] for p in narrowing
    )
    assert any("pod-disruption-guard" in p["metadata"]["name"] for p in policies) == guard
    bound = [
        d["spec"]["policyName"] for d in docs if d["kind"] == "ValidatingAdmissionPolicyBinding"
    ]
    assert sorted(bound) == sorted(p["metadata"]["name"] for p in policies), "one binding each"
    names = [(d["kind"], d["metadata"]["name"]) for d in docs]
    assert len(set(names)) == len(names), "fgd.component cut no two names to one"
    subjects = {
        s["name"] for d in docs if d["kind"].endswith("Binding") for s in d.get("subjects", [])
    }
    assert subjects == {plugin, controller}


def test_the_plugins_token_is_bound_to_its_node() -> None:
    node = {"metadata": {"name": "kind-worker", "uid": "u-1"}}
    assert token_request(node)["spec"] == {
        "audiences": [],
        "expirationSeconds": 3600,
        "boundObjectRef": {"kind": "Node", "apiVersion": "v1", "name": "kind-worker", "uid": "u-1"},
    }
    assert "boundObjectRef" not in token_request(None)["spec"]


def test_a_kubeconfig_keeps_the_cluster_and_carries_only_the_token(tmp_path: Path) -> None:
    admin = tmp_path / "admin"
    server = {"server": "https://127.0.0.1:6443", "certificate-authority-data": "Q0E="}
    cluster = {"name": "kind", "cluster": server}
    admin.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [cluster, {"name": "other", "cluster": {"server": "https://x"}}],
                "users": [{"name": "admin", "user": {"client-key-data": "secret"}}],
                "contexts": [{"name": "kind", "context": {"cluster": "kind", "user": "admin"}}],
                "current-context": "kind",
            }
        )
    )
    path = kubeconfig_with_token(str(admin), "t0ken", tmp_path / "plugin")
    config = yaml.safe_load(Path(path).read_text())
    assert config["clusters"] == [cluster]
    assert config["users"] == [{"name": "sa", "user": {"token": "t0ken"}}]
    assert "secret" not in Path(path).read_text()
