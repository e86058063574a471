"""The Helm chart (deploy/helm/fractional-gpu-dra), rendered with ``helm template``.

Every rendered object must pass the official 1.34 to 1.37 schemas (strict), the
DaemonSets' environment must be the flags' twins, host paths must be mounted at
the same path, the update strategies and RBAC must be what the design says, and
``helm lint`` must pass. Skipped when no ``helm`` is found (``hack/install-helm.sh``
puts one in hack/bin/); nothing is downloaded here.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from dra_driver.cli import build_parser, env_name

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "fractional-gpu-dra"
NAMESPACE = "fractional-gpu-dra"
RELEASE = "fgd"
KUBE_VERSIONS = ("1.34.0", "1.35.0", "1.36.0", "1.37.0")
"""The Kubernetes versions the driver supports; every rendered object is checked on each."""
DRIVER = "gpu.fractional.dev"
SENTINEL = (
    'device.driver == "gpu.fractional.dev" && '
    '"share.gpu.fractional.dev/controller-managed" == "sentinel"'
)
TOOLKIT_ENV = {"NVIDIA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES"}
"""Read by the NVIDIA Container Toolkit (backend nvml), not by dra-driver."""


def _helm() -> str | None:
    local = ROOT / "hack" / "bin" / "helm"
    if local.is_file() and os.access(local, os.X_OK):
        return str(local)
    return shutil.which("helm")


HELM = _helm()
pytestmark = pytest.mark.skipif(
    HELM is None, reason="helm not found on PATH or in hack/bin/: run hack/install-helm.sh"
)

VALUE_SETS: dict[str, list[str]] = {
    "defaults": [],
    "fake": ["--set", "backend=fake", "--set", "fakeGpus=h100-80gb:2\\,l4:1:mig"],
    "controller": [
        "--set",
        "controller.enabled=true",
        "--set",
        "nodeSettings.defaults.allocator=controller",
        "--set",
        "kubeletPlugin.writeDeviceStatus=true",
    ],
    "per-node": [
        "--set",
        "driverRoot=/run/nvidia/driver",
        "--set",
        "memoryReserve=1Gi",
        "--set-json",
        'nodeSettings.perNode={"gpu-node-7": {"sharing": "timeslicing", '
        '"gpus": {"1": {"sharing": "exclusive"}}}, "gpu-node-8": {"maxClients": 16}}',
    ],
}


def _run_helm(*args: str) -> subprocess.CompletedProcess[str]:
    assert HELM is not None
    return subprocess.run(
        [HELM, *args], capture_output=True, text=True, timeout=60, check=False, cwd=ROOT
    )


@functools.cache
def render(value_set: str) -> tuple[dict[str, Any], ...]:
    done = _run_helm(
        "template", RELEASE, str(CHART), "--namespace", NAMESPACE, *VALUE_SETS[value_set]
    )
    assert done.returncode == 0, done.stderr
    return tuple(doc for doc in yaml.safe_load_all(done.stdout) if doc)


def find(docs: tuple[dict[str, Any], ...], kind: str, name_suffix: str) -> dict[str, Any]:
    found = [d for d in docs if d["kind"] == kind and d["metadata"]["name"].endswith(name_suffix)]
    assert len(found) == 1, f"{kind} *{name_suffix}: {[d['metadata']['name'] for d in found]}"
    return found[0]


def container(workload: dict[str, Any], name: str) -> dict[str, Any]:
    containers: list[dict[str, Any]] = workload["spec"]["template"]["spec"]["containers"]
    (found,) = [c for c in containers if c["name"] == name]
    return found


def env_of(c: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in c.get("env", [])}


def flag_envs(command: str) -> set[str]:
    parser = build_parser()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            sub = action.choices[command]
            return {
                env_name(flag)
                for a in sub._actions
                for flag in a.option_strings
                if flag.startswith("--") and flag != "--help"
            }
    raise AssertionError("no subcommands")


def all_sets() -> list[Any]:
    return [pytest.param(name, id=name) for name in VALUE_SETS]


# --- schema and lint -------------------------------------------------------------------


@pytest.mark.parametrize("kube_version", KUBE_VERSIONS)
@pytest.mark.parametrize("value_set", all_sets())
def test_every_object_passes_the_official_schema(value_set: str, kube_version: str) -> None:
    """Every supported version: the chart uses only APIs that 1.34 already serves
    (resource.k8s.io/v1, admissionregistration.k8s.io/v1), so nothing is gated."""
    kubernetes_validate = pytest.importorskip(
        "kubernetes_validate", reason="kubernetes-validate (test extra) is not installed"
    )
    for obj in render(value_set):
        kubernetes_validate.validate(obj, kube_version, strict=True)


def test_schema_versions_cover_the_supported_range() -> None:
    assert KUBE_VERSIONS[0] == "1.34.0" and KUBE_VERSIONS[-1] == "1.37.0"
    kubernetes_validate = pytest.importorskip(
        "kubernetes_validate", reason="kubernetes-validate (test extra) is not installed"
    )
    known = set(kubernetes_validate.utils.all_versions())
    assert set(KUBE_VERSIONS) <= known, sorted(set(KUBE_VERSIONS) - known)


def test_one_object_per_template_named_after_it() -> None:
    done = _run_helm(
        "template",
        RELEASE,
        str(CHART),
        "--namespace",
        NAMESPACE,
        *VALUE_SETS["controller"],
        *VALUE_SETS["per-node"],
    )
    assert done.returncode == 0, done.stderr
    sources: dict[str, int] = {}
    for line in done.stdout.splitlines():
        if line.startswith("# Source: "):
            sources[line] = sources.get(line, 0) + 1
    assert sources and all(n == 1 for n in sources.values()), sources


@pytest.mark.parametrize("value_set", all_sets())
def test_helm_lint_passes(value_set: str) -> None:
    done = _run_helm(
        "lint", "--strict", str(CHART), "--namespace", NAMESPACE, *VALUE_SETS[value_set]
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_values_schema_is_json_and_closed() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    assert schema["additionalProperties"] is False
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert set(values) <= set(schema["properties"])


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--namespace", "default"], "--namespace fractional-gpu-dra"),
        (
            ["--namespace", NAMESPACE, "--set", "nodeSettings.defaults.allocator=controller"],
            "controller.enabled=true",
        ),
        (["--namespace", NAMESPACE, "--set", "backend=gpu"], "backend"),
        (["--namespace", NAMESPACE, "--set", "backend=fake", "--set", "fakeGpus="], "fakeGpus"),
    ],
)
def test_bad_values_fail_with_the_fix(args: list[str], says: str) -> None:
    done = _run_helm("template", RELEASE, str(CHART), *args)
    assert done.returncode != 0
    assert says in done.stderr


# --- the kubelet plugin ----------------------------------------------------------------


@pytest.mark.parametrize("value_set", all_sets())
def test_plugin_env_names_are_its_flags(value_set: str) -> None:
    docs = render(value_set)
    plugin = container(find(docs, "DaemonSet", "-kubelet-plugin"), "kubelet-plugin")
    names = set(env_of(plugin))
    allowed = flag_envs("kubelet-plugin")
    if value_set != "fake":
        assert names >= TOOLKIT_ENV
        names -= TOOLKIT_ENV
    assert names <= allowed, names - allowed
    assert {"NODE_NAME", "ROLLING_UPDATE_UID", "DRIVER_NAME", "BACKEND"} <= names


def test_plugin_identity_comes_from_the_downward_api() -> None:
    env = env_of(
        container(find(render("defaults"), "DaemonSet", "-kubelet-plugin"), "kubelet-plugin")
    )
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert env["ROLLING_UPDATE_UID"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.uid"


def test_plugin_and_agent_agree_on_the_agent_socket() -> None:
    docs = render("defaults")
    plugin = env_of(container(find(docs, "DaemonSet", "-kubelet-plugin"), "kubelet-plugin"))
    agent = env_of(container(find(docs, "DaemonSet", "-mps-agent"), "mps-agent"))
    assert plugin["MPS_AGENT_SOCKET"]["value"] == agent["SOCKET"]["value"]
    assert plugin["PLUGIN_DIR"]["value"] == agent["PLUGIN_DIR"]["value"]
    assert plugin["PLUGIN_DIR"]["value"] == f"/var/lib/kubelet/plugins/{DRIVER}"
    assert plugin["REGISTRY_DIR"]["value"] == "/var/lib/kubelet/plugins_registry"


@pytest.mark.parametrize("value_set", all_sets())
def test_host_paths_are_mounted_at_the_same_path(value_set: str) -> None:
    for ds in [d for d in render(value_set) if d["kind"] == "DaemonSet"]:
        pod = ds["spec"]["template"]["spec"]
        host = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v}
        assert host
        mounted = set()
        for c in pod["containers"]:
            for m in c["volumeMounts"]:
                if m["name"] in host:
                    assert m["mountPath"] == host[m["name"]], (ds["metadata"]["name"], m)
                    mounted.add(m["name"])
        assert mounted == set(host)


def test_plugin_mounts_what_the_design_needs() -> None:
    def paths(value_set: str) -> set[str]:
        ds = find(render(value_set), "DaemonSet", "-kubelet-plugin")
        return {
            v["hostPath"]["path"]
            for v in ds["spec"]["template"]["spec"]["volumes"]
            if "hostPath" in v
        }

    base = {
        "/var/lib/kubelet/plugins_registry",
        f"/var/lib/kubelet/plugins/{DRIVER}",
        "/var/run/cdi",
    }
    assert paths("fake") == base
    assert paths("defaults") == base | {"/etc/cdi"}
    assert paths("per-node") == base | {"/etc/cdi", "/run/nvidia/driver"}


def test_plugin_updates_with_max_surge() -> None:
    strategy = find(render("defaults"), "DaemonSet", "-kubelet-plugin")["spec"]["updateStrategy"]
    assert strategy == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
    }


def test_plugin_privileges_follow_the_backend() -> None:
    nvml = container(find(render("defaults"), "DaemonSet", "-kubelet-plugin"), "kubelet-plugin")
    assert nvml["securityContext"]["privileged"] is True
    fake = container(find(render("fake"), "DaemonSet", "-kubelet-plugin"), "kubelet-plugin")
    context = fake["securityContext"]
    assert context["privileged"] is False
    assert context["runAsUser"] == 0
    assert context["capabilities"] == {"drop": ["ALL"]}
    assert context["allowPrivilegeEscalation"] is False


def test_per_node_settings_reach_node_config() -> None:
    docs = render("per-node")
    ds = find(docs, "DaemonSet", "-kubelet-plugin")
    env = env_of(container(ds, "kubelet-plugin"))
    config_map = find(docs, "ConfigMap", "-node-config")
    assert set(config_map["data"]) == {"default.yaml", "gpu-node-7.yaml", "gpu-node-8.yaml"}
    assert yaml.safe_load(config_map["data"]["gpu-node-7.yaml"]) == {
        "sharing": "timeslicing",
        "gpus": {"1": {"sharing": "exclusive"}},
    }
    (init,) = ds["spec"]["template"]["spec"]["initContainers"]
    assert env["NODE_CONFIG"]["value"] in init["command"][-1]
    assert env["MEMORY_RESERVE"]["value"] == "1Gi"
    assert "NODE_CONFIG" not in env_of(
        container(find(render("defaults"), "DaemonSet", "-kubelet-plugin"), "kubelet-plugin")
    )


def test_probe_is_real_code_and_off_with_period_zero() -> None:
    plugin = container(find(render("fake"), "DaemonSet", "-kubelet-plugin"), "kubelet-plugin")
    argv = plugin["livenessProbe"]["exec"]["command"]
    assert argv[:2] == ["python", "-c"]
    # Against sockets that do not exist the probe fails in gRPC, not on an import.
    env = {
        **os.environ,
        "DRIVER_NAME": DRIVER,
        "REGISTRY_DIR": "/nonexistent/registry",
        "PLUGIN_DIR": "/nonexistent/plugin",
        "ROLLING_UPDATE_UID": "00000000-0000-0000-0000-000000000000",
    }
    done = subprocess.run(
        [sys.executable, "-c", argv[2]],
        check=False,
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode != 0
    assert "UNAVAILABLE" in done.stderr, done.stderr
    off = _run_helm(
        "template",
        RELEASE,
        str(CHART),
        "--namespace",
        NAMESPACE,
        "--set",
        "kubeletPlugin.livenessProbe.periodSeconds=0",
    )
    assert off.returncode == 0, off.stderr
    assert "livenessProbe" not in off.stdout and "startupProbe" not in off.stdout


# --- mps-agent, controller, classes ----------------------------------------------------


@pytest.mark.parametrize("value_set", all_sets())
def test_mps_agent_is_on_delete_with_flag_env(value_set: str) -> None:
    ds = find(render(value_set), "DaemonSet", "-mps-agent")
    assert ds["spec"]["updateStrategy"] == {"type": "OnDelete"}
    names = set(env_of(container(ds, "mps-agent")))
    if value_set != "fake":
        names -= TOOLKIT_ENV
    assert names <= flag_envs("mps-agent"), names - flag_envs("mps-agent")
    assert ds["spec"]["template"]["spec"]["automountServiceAccountToken"] is False


def test_fake_backend_uses_the_fake_mps_control() -> None:
    agent = env_of(container(find(render("fake"), "DaemonSet", "-mps-agent"), "mps-agent"))
    assert agent["MPS_CONTROL"]["value"] == "fake"


def test_controller_only_when_enabled() -> None:
    assert not [d for d in render("defaults") if d["kind"] == "Deployment"]
    deployment = find(render("controller"), "Deployment", "-controller")
    assert container(deployment, "controller")["args"] == ["controller"]
    assert deployment["spec"]["template"]["spec"]["securityContext"]["runAsNonRoot"] is True


def test_device_classes_and_sentinel() -> None:
    classes = {
        d["metadata"]["name"]: [s["cel"]["expression"] for s in d["spec"]["selectors"]]
        for d in render("defaults")
        if d["kind"] == "DeviceClass"
    }
    assert set(classes) == {
        "gpu.fractional.dev",
        "mig.gpu.fractional.dev",
        "share.gpu.fractional.dev",
    }
    assert classes["share.gpu.fractional.dev"] == [SENTINEL]
    assert (
        'device.attributes["gpu.fractional.dev"].type == "gpu"' in classes["gpu.fractional.dev"][0]
    )
    assert (
        'device.attributes["gpu.fractional.dev"].type == "mig"'
        in classes["mig.gpu.fractional.dev"][0]
    )


def test_node_opt_in_label() -> None:
    for ds in [d for d in render("defaults") if d["kind"] == "DaemonSet"]:
        assert ds["spec"]["template"]["spec"]["nodeSelector"] == {
            "gpu.fractional.dev/enabled": "true"
        }


# --- RBAC ------------------------------------------------------------------------------


def rules(
    docs: tuple[dict[str, Any], ...], kind: str, suffix: str
) -> set[tuple[str, str, str, str]]:
    found = set()
    for rule in find(docs, kind, suffix)["rules"]:
        names = ",".join(rule.get("resourceNames", []))
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                for verb in rule["verbs"]:
                    found.add((group, resource, verb, names))
    return found


def test_rbac_has_no_wildcards() -> None:
    for value_set in VALUE_SETS:
        for d in render(value_set):
            for rule in d.get("rules", []) if d["kind"] in ("Role", "ClusterRole") else []:
                for key in ("apiGroups", "resources", "verbs"):
                    assert "*" not in rule[key], (d["metadata"]["name"], rule)


def test_plugin_rbac() -> None:
    rs = "resource.k8s.io"
    expected = {
        (rs, "resourceclaims", "get", ""),
        *(
            (rs, "resourceslices", v, "")
            for v in ("get", "list", "watch", "create", "update", "delete")
        ),
        ("", "nodes", "get", ""),
        (rs, "resourceclaims/driver", "associated-node:update", DRIVER),
        (rs, "resourceclaims/driver", "associated-node:patch", DRIVER),
    }
    assert rules(render("defaults"), "ClusterRole", "-kubelet-plugin") == expected
    with_status = rules(render("controller"), "ClusterRole", "-kubelet-plugin")
    assert with_status - expected == {
        (rs, "resourceclaims/status", "update", ""),
        (rs, "resourceclaims/status", "patch", ""),
    }


def test_controller_rbac() -> None:
    rs = "resource.k8s.io"
    read = ("get", "list", "watch")
    expected = {
        *((rs, "resourceclaims", v, "") for v in (*read, "update")),
        *(
            (rs, r, v, "")
            for r in ("resourceclaims/status", "resourceclaims/binding")
            for v in ("update", "patch")
        ),
        *(
            (rs, r, v, "")
            for r in ("deviceclasses", "resourceslices", "devicetaintrules")
            for v in read
        ),
        *(("", r, v, "") for r in ("pods", "nodes") for v in read),
        ("", "events", "create", ""),
        ("events.k8s.io", "events", "create", ""),
    }
    docs = render("controller")
    assert rules(docs, "ClusterRole", "-controller") == expected
    lease = "fractional-gpu-dra-controller"
    assert rules(docs, "Role", "-controller-leader-election") == {
        ("coordination.k8s.io", "leases", "create", ""),
        ("coordination.k8s.io", "leases", "get", lease),
        ("coordination.k8s.io", "leases", "update", lease),
    }


def test_slice_writes_limited_to_own_node() -> None:
    docs = render("defaults")
    policy = find(docs, "ValidatingAdmissionPolicy", "-resourceslices-own-node")
    assert policy["apiVersion"] == "admissionregistration.k8s.io/v1"
    sa = find(docs, "ServiceAccount", "-kubelet-plugin")["metadata"]["name"]
    (condition,) = policy["spec"]["matchConditions"]
    assert f"system:serviceaccount:{NAMESPACE}:{sa}" in condition["expression"]
    variables = {v["name"]: v["expression"] for v in policy["spec"]["variables"]}
    assert "authentication.kubernetes.io/node-name" in variables["userNodeName"]
    assert "spec.?nodeName" in variables["objectNodeName"]
    binding = find(docs, "ValidatingAdmissionPolicyBinding", "-resourceslices-own-node")
    assert binding["spec"] == {
        "policyName": policy["metadata"]["name"],
        "validationActions": ["Deny"],
    }
