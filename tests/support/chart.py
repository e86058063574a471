"""The Helm chart as the tests install it: rendered RBAC and admission policies loaded
into the fake API server, and each component's ServiceAccount identity.

:func:`chart_api` builds a :class:`~tests.support.fakekube.FakeKubeApi` that answers
every request as a cluster with the chart installed would: the Roles, ClusterRoles,
bindings and ValidatingAdmissionPolicies that ``helm template`` renders for the
given ``--set`` values, enforced for the identity each component has in a pod
(:func:`plugin_user`, :func:`controller_user`; the mps-agent has none: the chart
mounts it no token). Components then talk to it with :func:`client_as` (in-process)
or a kubeconfig holding :meth:`FakeKubeApi.token_for` (a process). ``helm`` comes
from ``hack/install-helm.sh`` (``hack/test.sh`` runs it); without one these tests
fail and say so, since what they check is the chart.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import yaml

from dra_driver.k8s.client import KubeClient, make_api_client
from dra_driver.k8s.official import Configuration
from dra_driver.k8s.transport import ApiTransport
from tests.support.fakekube import FakeKubeApi
from tests.support.fakekube_admission import ApiSecurity
from tests.support.fakekube_auth import Attributes, User, service_account, service_account_of
from tests.support.fakekube_types import JsonObj
from tests.support.node import NODE
from tests.support.transport import transport_of

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "fractional-gpu-dra"
RELEASE = "fractional-gpu-dra"
NAMESPACE = "fractional-gpu-dra"
"""As ``hack/kind/install-driver.sh`` installs it: object names are ``<release>-<component>``."""

CONTROLLER_VALUES = (
    "controller.enabled=true",
    "nodeSettings.defaults.allocator=controller",
)
GUARD_VALUES = ("kubeletPlugin.disruptionGuard.enabled=true",)
EXTENDED_VALUES = ("extendedResources.enabled=true",)
ALL_VALUES = (*CONTROLLER_VALUES, *GUARD_VALUES, *EXTENDED_VALUES)
"""Every option that adds RBAC or policies: what the widest install grants."""


def helm_binary() -> str | None:
    """``hack/bin/helm`` (``hack/install-helm.sh``), else ``helm`` on PATH."""
    local = ROOT / "hack" / "bin" / "helm"
    if local.is_file() and os.access(local, os.X_OK):
        return str(local)
    return shutil.which("helm")


@functools.cache
def render_chart(values: tuple[str, ...] = (), kube_minor: int = 36) -> tuple[JsonObj, ...]:
    """The chart's manifests for ``--set`` ``values`` on Kubernetes 1.<kube_minor>."""
    helm = helm_binary()
    if helm is None:
        raise RuntimeError(
            "helm not found on PATH or in hack/bin/: run hack/install-helm.sh "
            "(the RBAC-enforcing fake API server loads the chart's rendered RBAC)"
        )
    args = [helm, "template", RELEASE, str(CHART), "--namespace", NAMESPACE]
    args += ["--kube-version", f"1.{kube_minor}.0"]
    for value in values:
        args += ["--set", value]
    done = subprocess.run(args, capture_output=True, text=True, timeout=60, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"helm template {values} failed: {done.stderr}")
    return tuple(doc for doc in yaml.safe_load_all(done.stdout) if doc)


def chart_security(values: tuple[str, ...] = (), kube_minor: int = 36) -> ApiSecurity:
    return ApiSecurity(render_chart(values, kube_minor), kube_minor=kube_minor)


def chart_api(values: tuple[str, ...] = (), *, kube_minor: int = 36, **kwargs: Any) -> FakeKubeApi:
    """A (not yet started) fake API server that enforces the chart's RBAC and policies."""
    return FakeKubeApi(kube_minor=kube_minor, security=chart_security(values, kube_minor), **kwargs)


def component_account(component: str) -> str:
    """The ServiceAccount name the chart gives ``component`` (``fgd.component``)."""
    return f"{RELEASE}-{component}"


def plugin_user(node: str) -> User:
    """The kubelet plugin in its pod on ``node``: its token carries the node's name."""
    return service_account(NAMESPACE, component_account("kubelet-plugin"), node=node)


def controller_user() -> User:
    return service_account(NAMESPACE, component_account("controller"), node="control-plane")


def client_as(api: FakeKubeApi, user: User) -> KubeClient:
    """An API client of ``api`` that authenticates as ``user`` (a bearer token)."""
    configuration = Configuration()
    configuration.host = api.url
    configuration.api_key = {"authorization": api.token_for(user)}
    configuration.api_key_prefix = {"authorization": "Bearer"}
    return KubeClient(configuration)


def plugin_client(api: FakeKubeApi, node: str = NODE) -> KubeClient:
    """The kubelet plugin's client: as its ServiceAccount in a pod on ``node`` where
    ``api`` enforces the chart, else without credentials."""
    if api.security is not None:
        return client_as(api, plugin_user(node))
    return make_api_client(None, host=api.url)


def plugin_transport(api: FakeKubeApi, node: str = NODE) -> ApiTransport:
    """The kubelet plugin's API transport (:func:`plugin_client`'s, on the event loop)."""
    return transport_of(plugin_client(api, node))


def plugin_token(api: FakeKubeApi, node: str = NODE) -> str | None:
    """The token a kubeconfig gives a plugin process (None: ``api`` authorizes nothing)."""
    return api.token_for(plugin_user(node)) if api.security is not None else None


def controller_token(api: FakeKubeApi) -> str | None:
    return api.token_for(controller_user()) if api.security is not None else None


Permission = tuple[str, str, str, str]
"""(apiGroup, resource[/subresource], verb, resourceName or "")."""


def granted(docs: tuple[JsonObj, ...], user: User) -> set[Permission]:
    """Every (group, resource, verb, name) the Roles and ClusterRoles bound to ``user``'s
    ServiceAccount name, expanded; namespaces aside (the chart binds each in one place)."""
    account = service_account_of(user)
    roles = {(d["kind"], d["metadata"]["name"]): d for d in docs if d["kind"].endswith("Role")}
    found: set[Permission] = set()
    for binding in docs:
        if not binding["kind"].endswith("RoleBinding"):
            continue
        subjects = binding.get("subjects") or []
        if not any(
            s["kind"] == "ServiceAccount" and (s.get("namespace"), s["name"]) == account
            for s in subjects
        ):
            continue
        role = roles[(binding["roleRef"]["kind"], binding["roleRef"]["name"])]
        for rule in role.get("rules") or ():
            for group in rule.get("apiGroups") or ():
                for resource in rule.get("resources") or ():
                    for verb in rule["verbs"]:
                        for name in rule.get("resourceNames") or [""]:
                            found.add((group, resource, verb, name))
    return found


def used(api: FakeKubeApi, user: User) -> tuple[set[Permission], list[Attributes]]:
    """What ``user`` was allowed (requests and the server's synthetic checks), and what
    it was refused, as the fake's RBAC answered it."""
    assert api.security is not None
    allowed: set[Permission] = set()
    refused: list[Attributes] = []
    for who, attrs, ok in api.security.rbac.decisions:
        if who != user or not attrs.is_resource:
            continue
        if ok:
            allowed.add((attrs.api_group, attrs.full_resource, attrs.verb, attrs.name))
        else:
            refused.append(attrs)
    return allowed, refused


def unused(grants: set[Permission], allowed: set[Permission]) -> set[Permission]:
    """The grants no allowed request needed (a grant without a name covers every name)."""
    return {
        (group, resource, verb, name)
        for group, resource, verb, name in grants
        if not any(
            (g, r, v) == (group, resource, verb) and (not name or n == name)
            for g, r, v, n in allowed
        )
    }
