"""The chart's identities on a real cluster for the host-process e2e mode.

Host-process mode runs the plugin, the mps-agent and the controller here, not in
pods; run with the admin's kubeconfig they would never meet the RBAC and admission
policies the chart installs (the bug of 2026-12-01: the chart lacked the verb
``patch`` and nothing noticed). So this mode installs what the chart renders for
them (ServiceAccounts, Roles, ClusterRoles, their bindings, the
ValidatingAdmissionPolicies and their bindings: :func:`identity_manifests`, under
their own release name and namespace, so a chart install beside them is untouched)
and runs each process with a token of its ServiceAccount from the TokenRequest API
(:func:`service_account_token`). The plugin's token is bound to its Node: the API
server then puts the node's name in the token's user info
(``authentication.kubernetes.io/node-name``), as it does for a pod's token, which the
chart's policies need (Kubernetes docs, "Managing Service Accounts": tokens bound to
a Node, GA in 1.33).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import subprocess
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import yaml

from tests.support.chart import CHART, helm_binary
from tests.support.cluster import delete_and_wait, delete_namespace
from tests.support.examples import Obj

E2E_RELEASE = "fgd-e2e"
E2E_NAMESPACE = "fgd-e2e-host"
"""Where host-process mode's ServiceAccounts and the controller's Lease live."""
IDENTITY_KINDS = (
    "ServiceAccount",
    "ClusterRole",
    "ClusterRoleBinding",
    "Role",
    "RoleBinding",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
)
"""Created in this order: a binding after what it binds."""
TOKEN_SECONDS = 3600
E2E_LEASE = "fgd-e2e-controller"
_DELETE_POLL_S = 0.5
"""How often :func:`install` looks whether an object it replaces is gone."""


def identity_manifests(driver: str, lease_name: str, *, guard: bool) -> list[Obj]:
    """What the chart renders for its components' identities, for ``driver`` with the
    controller on and the disruption guard as given, in :data:`IDENTITY_KINDS` order."""
    helm = helm_binary()
    if helm is None:
        raise RuntimeError("helm not found on PATH or in hack/bin/: run hack/install-helm.sh")
    values = [
        f"driverName={driver}",
        "controller.enabled=true",
        f"controller.leaseName={lease_name}",
        f"kubeletPlugin.disruptionGuard.enabled={'true' if guard else 'false'}",
    ]
    args = [helm, "template", E2E_RELEASE, str(CHART), "--namespace", E2E_NAMESPACE]
    for value in values:
        args += ["--set", value]
    done = subprocess.run(args, capture_output=True, text=True, timeout=60, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"helm template failed: {done.stderr}")
    docs = [d for d in yaml.safe_load_all(done.stdout) if d]
    return sorted(
        (d for d in docs if d["kind"] in IDENTITY_KINDS),
        key=lambda d: IDENTITY_KINDS.index(d["kind"]),
    )


def account_name(docs: Sequence[Obj], component: str) -> str:
    """The ServiceAccount the chart gives ``component`` (its component label)."""
    (found,) = [
        d["metadata"]["name"]
        for d in docs
        if d["kind"] == "ServiceAccount"
        and d["metadata"].get("labels", {}).get("app.kubernetes.io/component") == component
    ]
    return str(found)


def install(cluster: Any, docs: Sequence[Obj]) -> Iterator[Obj]:
    """Create the namespace and ``docs`` (an existing object is replaced by ours);
    yields each created object, for :func:`uninstall`.

    What is replaced is deleted and waited for until it is gone (404) before it is
    created again: a deleted namespace stays ``Terminating`` until its content is gone,
    and a create of its name meanwhile is ``409 AlreadyExists: object is being
    deleted`` (fact sheet 5.3.2), as for any object a finalizer holds."""
    from kubernetes.client.exceptions import ApiException

    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": E2E_NAMESPACE}}
    for doc in [namespace, *docs]:
        resource = cluster.resource(doc["apiVersion"], doc["kind"])
        namespaced = {"namespace": doc["metadata"]["namespace"]} if resource.namespaced else {}
        try:
            resource.create(body=doc, **namespaced)
        except ApiException as err:
            if err.status != 409:
                raise
            if doc is namespace:
                gone = delete_namespace(cluster, E2E_NAMESPACE)
            else:
                name = doc["metadata"]["name"]
                gone = delete_and_wait(
                    cluster,
                    functools.partial(resource.delete, name=name, **namespaced),
                    functools.partial(resource.get, name=name, **namespaced),
                    poll_s=_DELETE_POLL_S,
                )
            if not gone:
                raise RuntimeError(
                    f"{doc['kind']}/{doc['metadata']['name']}: still there "
                    f"{cluster.delete_timeout_s:.0f}s after its deletion (E2E_DELETE_TIMEOUT)"
                ) from err
            resource.create(body=doc, **namespaced)
        yield doc


def uninstall(cluster: Any, created: Sequence[Obj]) -> None:
    """Delete what :func:`install` made, bindings first; the namespace last."""
    from kubernetes.client.exceptions import ApiException

    for doc in reversed(created):
        resource = cluster.resource(doc["apiVersion"], doc["kind"])
        namespaced = {"namespace": doc["metadata"]["namespace"]} if resource.namespaced else {}
        try:
            resource.delete(name=doc["metadata"]["name"], **namespaced)
        except ApiException as err:
            if err.status != 404:
                print(f"cleanup: could not delete {doc['kind']}/{doc['metadata']['name']}: {err}")


def token_request(node: Obj | None) -> Obj:
    """The TokenRequest body: bound to ``node`` (its name and UID) when given."""
    spec: Obj = {"audiences": [], "expirationSeconds": TOKEN_SECONDS}
    if node is not None:
        meta = node["metadata"]
        spec["boundObjectRef"] = {
            "kind": "Node",
            "apiVersion": "v1",
            "name": meta["name"],
            "uid": meta["uid"],
        }
    return {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec}


def service_account_token(cluster: Any, account: str, node_name: str | None = None) -> str:
    """A token of ``account`` in :data:`E2E_NAMESPACE`; bound to ``node_name``'s Node."""
    node = None
    if node_name is not None:
        node = cluster.resource("v1", "Node").get(name=node_name).to_dict()
    answer = cluster.core.create_namespaced_service_account_token(
        account, E2E_NAMESPACE, token_request(node)
    )
    return str(answer.status.token)


def kubeconfig_with_token(admin_kubeconfig: str, token: str, path: Path) -> str:
    """A copy of ``admin_kubeconfig``'s current cluster (server, CA) whose user is
    ``token``; its path."""
    config = yaml.safe_load(Path(admin_kubeconfig).read_text(encoding="utf-8"))
    current = config.get("current-context")
    (context,) = [c for c in config["contexts"] if c["name"] == current]
    (cluster,) = [c for c in config["clusters"] if c["name"] == context["context"]["cluster"]]
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [cluster],
                "users": [{"name": "sa", "user": {"token": token}}],
                "contexts": [{"name": "sa", "context": {"cluster": cluster["name"], "user": "sa"}}],
                "current-context": "sa",
            }
        ),
        encoding="utf-8",
    )
    return str(path)


@dataclasses.dataclass(frozen=True)
class Kubeconfigs:
    """One kubeconfig per component, each holding a token of its ServiceAccount."""

    plugin: str
    controller: str


@contextlib.contextmanager
def chart_identities(
    cluster: Any, node: str, admin_kubeconfig: str, work: str, *, guard: bool
) -> Iterator[Kubeconfigs]:
    """Install the chart's identities for ``cluster.driver``, yield the components'
    kubeconfigs (the plugin's token bound to ``node``), remove them afterwards."""
    docs = identity_manifests(cluster.driver, E2E_LEASE, guard=guard)
    created: list[Obj] = []
    try:
        created.extend(install(cluster, docs))
        plugin = service_account_token(cluster, account_name(docs, "kubelet-plugin"), node)
        controller = service_account_token(cluster, account_name(docs, "controller"))
        yield Kubeconfigs(
            plugin=kubeconfig_with_token(admin_kubeconfig, plugin, Path(work, "plugin.conf")),
            controller=kubeconfig_with_token(
                admin_kubeconfig, controller, Path(work, "controller.conf")
            ),
        )
    finally:
        uninstall(cluster, created)
