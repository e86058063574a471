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
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from dra_driver.cli import build_parser, env_name
from dra_driver.mpsagent.layout import MAX_STATE_DIR_BYTES, check_state_dir
from tests.support.chart import helm_binary

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
CRD_KINDS = {"ServiceMonitor"}
"""Kinds from CRDs (the Prometheus Operator's monitoring.coreos.com/v1), which the
official Kubernetes schemas do not know; test_service_monitors_select_the_metrics_services
checks them instead."""
HOST_CGROUP = "host-cgroup"
"""The one hostPath volume not mounted at its own path: the host's /sys/fs/cgroup at
/host/sys/fs/cgroup (CGROUP_ROOT), read only, because the pod's /sys/fs/cgroup is its
own cgroup namespace and lacks the root's dmem.capacity."""
METRICS_PORTS = {"kubelet-plugin": 9401, "mps-agent": 9402, "controller": 9403}


HELM = helm_binary()
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
    "no-claim-status": ["--set", "kubeletPlugin.writeDeviceStatus=false"],
    "no-claim-admission": ["--set", "admission.mpsSharesOnOneDaemon=false"],
    "disruption-guard": [
        "--set",
        "kubeletPlugin.disruptionGuard.enabled=true",
        "--set",
        "kubeletPlugin.disruptionGuard.claims=all",
        "--set",
        "kubeletPlugin.disruptionGuard.interval=30",
    ],
    "observability": [
        "--set",
        "metrics.serviceMonitor.enabled=true",
        "--set",
        "metrics.serviceMonitor.interval=1m",
        "--set-json",
        'metrics.serviceMonitor.labels={"release": "kube-prometheus-stack"}',
        "--set",
        "logFormat=json",
        "--set",
        "kubeletPlugin.dmemLimits=strict",
        "--set",
        "kubeletPlugin.health.fatalXidTaintEffect=NoExecute",
        "--set",
        "kubeletPlugin.health.ignoredXids=13\\,31",
        "--set",
        "controller.enabled=true",
    ],
    "extended-resources": [
        "--set",
        "extendedResources.enabled=true",
        "--set-json",
        'extendedResources.mig.names={"1g.10gb": "example.com/small-gpu"}',
    ],
    "no-metrics-no-dmem": [
        "--set",
        "metrics.enabled=false",
        "--set",
        "kubeletPlugin.dmemLimits=off",
        "--set",
        "controller.enabled=true",
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
        # Skipped explicitly, by kind: a CRD's objects are not in the official schemas.
        if obj["kind"] in CRD_KINDS:
            continue
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


def test_the_schema_allows_only_mps_state_dirs_whose_sockets_fit() -> None:
    # Issue 26, finding 1: the agent refuses a longer one at start (layout.check_state_dir).
    schema = json.loads((CHART / "values.schema.json").read_text())
    state_dir = schema["properties"]["mpsAgent"]["properties"]["stateDir"]
    assert state_dir["maxLength"] == MAX_STATE_DIR_BYTES
    default = yaml.safe_load((CHART / "values.yaml").read_text())["mpsAgent"]["stateDir"]
    check_state_dir(default)


def test_values_schema_is_closed_and_covers_every_value() -> None:
    """Every object the schema spells out is closed, and every key of values.yaml
    (at any depth, down to free-form maps) has its entry there."""
    schema = json.loads((CHART / "values.schema.json").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())

    def walk(node: dict[str, Any], value: Any, path: str) -> None:
        if "properties" in node:
            assert node.get("additionalProperties") is False, f"{path or '/'} is open"
            assert isinstance(value, dict), path
            assert set(value) <= set(node["properties"]), (
                path,
                set(value) - set(node["properties"]),
            )
            for key, sub in node["properties"].items():
                if key in value:
                    walk(sub, value[key], f"{path}/{key}")

    walk(schema, values, "")


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
        (
            ["--namespace", NAMESPACE, "--set", "kubeletPlugin.health.fatalXidTaintEffect=Evict"],
            "fatalXidTaintEffect': value must be one of 'NoSchedule', 'NoExecute'",
        ),
        (
            ["--namespace", NAMESPACE, "--set", "logFormat=xml"],
            "logFormat': value must be one of 'text', 'json'",
        ),
        (
            ["--namespace", NAMESPACE, "--set", "kubeletPlugin.dmemLimits=on"],
            "dmemLimits': value must be one of 'auto', 'strict', 'off'",
        ),
        (
            ["--namespace", NAMESPACE, "--set", "kubeletPlugin.health.ignoredXids=13\\,x"],
            "ignoredXids",
        ),
        (
            [
                "--namespace",
                NAMESPACE,
                "--set",
                "metrics.enabled=false",
                "--set",
                "metrics.serviceMonitor.enabled=true",
            ],
            "metrics.serviceMonitor.enabled=false",
        ),
        (
            [
                "--namespace",
                NAMESPACE,
                "--set",
                "extendedResources.enabled=true",
                "--set",
                "extendedResources.mig.namePrefix=nvidia.com/mig+",
            ],
            '"nvidia.com/mig+1g.5gb" is not an extended resource name',
        ),
        (
            [
                "--namespace",
                NAMESPACE,
                "--set",
                "extendedResources.enabled=true",
                "--set-json",
                'extendedResources.mig.names={"1g.5gb": "nvidia.com/gpu"}',
            ],
            'two classes would serve "nvidia.com/gpu"',
        ),
        (
            ["--namespace", NAMESPACE, "--set", "extendedResources.gpu.name=gpu"],
            "/extendedResources/gpu/name': 'anyOf' failed",
        ),
        (
            [
                "--namespace",
                NAMESPACE,
                "--set",
                "extendedResources.enabled=true",
                "--set",
                "extendedResources.gpu.name=example.kubernetes.io/gpu",
            ],
            "is in the kubernetes.io domain",
        ),
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
                if m["name"] == HOST_CGROUP:
                    # The exception, on purpose (see HOST_CGROUP): elsewhere, read only.
                    assert (m["mountPath"], m.get("readOnly")) == ("/host/sys/fs/cgroup", True)
                    assert host[m["name"]] == "/sys/fs/cgroup"
                    mounted.add(m["name"])
                elif m["name"] in host:
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
    dmem = {"/var/lib/fractional-gpu-dra/hooks", "/sys/fs/cgroup"}
    assert paths("fake") == base
    assert paths("defaults") == base | {"/etc/cdi"} | dmem
    assert paths("per-node") == base | {"/etc/cdi", "/run/nvidia/driver"} | dmem
    assert paths("no-metrics-no-dmem") == base | {"/etc/cdi"}


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


def test_readiness_probe_is_the_plugins_readyz() -> None:
    """Readiness asks the plugin whether it can work (plugin/readiness.py); liveness
    stays the cheap socket check."""
    plugin = container(find(render("fake"), "DaemonSet", "-kubelet-plugin"), "kubelet-plugin")
    env = env_of(plugin)
    probe = plugin["readinessProbe"]
    assert probe["httpGet"] == {"path": "/readyz", "port": int(env["READINESS_PORT"]["value"])}
    assert probe["periodSeconds"] > 0
    assert "exec" in plugin["livenessProbe"] and "exec" in plugin["startupProbe"]
    off = _run_helm(
        "template",
        RELEASE,
        str(CHART),
        "--namespace",
        NAMESPACE,
        "--set",
        "kubeletPlugin.readinessProbe.port=0",
    )
    assert off.returncode == 0, off.stderr
    assert "readinessProbe" not in off.stdout
    assert 'name: READINESS_PORT\n              value: "0"' in off.stdout


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


@pytest.mark.parametrize(
    ("value", "env", "default", "other", "wrong"),
    [
        ("controlChannel", "MPS_CONTROL_CHANNEL", "process", "persistent", "shell"),
        ("spareNamespaces", "SPARE_NAMESPACES", "2", "0", "-1"),
    ],
)
def test_mps_agent_settings_are_values(
    value: str, env: str, default: str, other: str, wrong: str
) -> None:
    agent = env_of(container(find(render("fake"), "DaemonSet", "-mps-agent"), "mps-agent"))
    assert agent[env]["value"] == default
    done = _run_helm(
        *("template", RELEASE, str(CHART), "--namespace", NAMESPACE),
        *("--set", f"mpsAgent.{value}={other}"),
    )
    assert done.returncode == 0, done.stderr
    assert f'name: {env}\n              value: "{other}"' in done.stdout
    refused = _run_helm(
        *("template", RELEASE, str(CHART), "--namespace", NAMESPACE),
        *("--set", f"mpsAgent.{value}={wrong}"),
    )
    assert refused.returncode != 0
    assert value in refused.stderr


@pytest.mark.parametrize("value_set", all_sets())
def test_controller_env_names_are_its_flags(value_set: str) -> None:
    deployments = [d for d in render(value_set) if d["kind"] == "Deployment"]
    for deployment in deployments:
        names = set(env_of(container(deployment, "controller")))
        assert names <= flag_envs("controller"), names - flag_envs("controller")


def test_controller_only_when_enabled() -> None:
    assert not [d for d in render("defaults") if d["kind"] == "Deployment"]
    deployment = find(render("controller"), "Deployment", "-controller")
    assert container(deployment, "controller")["args"] == ["controller"]
    assert env_of(container(deployment, "controller"))["BATCH_WINDOW"]["value"] == "0.2"
    assert deployment["spec"]["template"]["spec"]["securityContext"]["runAsNonRoot"] is True


def test_allocator_auto_follows_the_controller() -> None:
    """The default: GPUs are published for the controller exactly when it runs."""

    def allocator(value_set: str) -> str:
        plugin = find(render(value_set), "DaemonSet", "-kubelet-plugin")
        return str(env_of(container(plugin, "kubelet-plugin"))["ALLOCATOR"]["value"])

    assert allocator("defaults") == "scheduler"
    assert allocator("no-metrics-no-dmem") == "controller"  # controller.enabled, allocator auto
    assert allocator("controller") == "controller"


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


# --- logs, metrics, device health, dmem -----------------------------------------------


def workloads(docs: tuple[dict[str, Any], ...]) -> dict[str, dict[str, Any]]:
    """The running component's container, keyed by component (the chart's label)."""
    found = {}
    for d in docs:
        if d["kind"] in ("DaemonSet", "Deployment"):
            component = d["metadata"]["labels"]["app.kubernetes.io/component"]
            found[component] = container(d, component)
    return found


def pod_labels(docs: tuple[dict[str, Any], ...], component: str) -> dict[str, str]:
    (workload,) = [
        d
        for d in docs
        if d["kind"] in ("DaemonSet", "Deployment")
        and d["metadata"]["labels"]["app.kubernetes.io/component"] == component
    ]
    labels: dict[str, str] = workload["spec"]["template"]["metadata"]["labels"]
    return labels


@pytest.mark.parametrize(
    ("value_set", "log_format"), [("defaults", "text"), ("observability", "json")]
)
def test_every_component_gets_the_log_format(value_set: str, log_format: str) -> None:
    components = workloads(render(value_set))
    assert set(components) >= {"kubelet-plugin", "mps-agent"}
    for c in components.values():
        assert env_of(c)["LOG_FORMAT"]["value"] == log_format


def test_metrics_port_service_per_component() -> None:
    docs = render("controller")
    components = workloads(docs)
    assert set(components) == set(METRICS_PORTS)
    services = {
        d["metadata"]["labels"]["app.kubernetes.io/component"]: d
        for d in docs
        if d["kind"] == "Service"
    }
    assert set(services) == set(METRICS_PORTS)
    for component, c in components.items():
        port = METRICS_PORTS[component]
        assert env_of(c)["METRICS_PORT"]["value"] == str(port)
        assert c["ports"] == [{"name": "metrics", "containerPort": port, "protocol": "TCP"}]
        service = services[component]
        assert service["metadata"]["name"].endswith(f"-{component}-metrics")
        spec = service["spec"]
        assert spec["clusterIP"] == "None"  # headless: Prometheus scrapes every pod
        selector = spec["selector"]
        labels = pod_labels(docs, component)
        assert selector.items() <= labels.items(), (selector, labels)
        assert spec["ports"] == [
            {"name": "metrics", "port": port, "targetPort": "metrics", "protocol": "TCP"}
        ]
    for d in docs:  # the metrics port is the pod's, never the node's
        if d["kind"] in ("DaemonSet", "Deployment"):
            pod = d["spec"]["template"]["spec"]
            assert not pod.get("hostNetwork")
            assert all("hostPort" not in p for c in pod["containers"] for p in c.get("ports", []))
    assert not [d for d in docs if d["kind"] in CRD_KINDS]  # serviceMonitor is off by default


def test_metrics_off_means_no_port_and_no_service() -> None:
    docs = render("no-metrics-no-dmem")
    assert not [d for d in docs if d["kind"] in {"Service", *CRD_KINDS}]
    for c in workloads(docs).values():
        assert "METRICS_PORT" not in env_of(c)
        assert "ports" not in c


def test_service_monitors_select_the_metrics_services() -> None:
    docs = render("observability")
    services = {
        d["metadata"]["labels"]["app.kubernetes.io/component"]: d
        for d in docs
        if d["kind"] == "Service"
    }
    monitors = [d for d in docs if d["kind"] == "ServiceMonitor"]
    assert len(monitors) == len(METRICS_PORTS)
    for monitor in monitors:
        assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
        assert monitor["metadata"]["namespace"] == NAMESPACE
        assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
        component = monitor["metadata"]["labels"]["app.kubernetes.io/component"]
        service = services[component]
        spec = monitor["spec"]
        # Exactly one Service matches: this component's, and not another's.
        selector = spec["selector"]["matchLabels"]
        labels = {name: svc["metadata"]["labels"] for name, svc in services.items()}
        matching = [name for name in labels if selector.items() <= labels[name].items()]
        assert matching == [component], (selector, matching)
        assert spec["namespaceSelector"] == {"matchNames": [NAMESPACE]}
        (endpoint,) = spec["endpoints"]
        assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}
        assert endpoint["port"] == "metrics"
        assert endpoint["path"] == "/metrics"
        assert endpoint["interval"] == "1m"
        node_label = [r for r in endpoint.get("relabelings", []) if r["targetLabel"] == "node"]
        assert bool(node_label) == (component != "controller"), endpoint


def test_plugin_health_settings() -> None:
    env = env_of(
        container(find(render("defaults"), "DaemonSet", "-kubelet-plugin"), "kubelet-plugin")
    )
    values = {name: env[name]["value"] for name in env if "value" in env[name]}
    assert (
        values.items()
        >= {
            "HEALTH_PROBE_INTERVAL": "30",
            "HEALTH_RECOVERY_SECONDS": "300",
            "FATAL_XID_TAINT_EFFECT": "NoSchedule",
            "IGNORED_XIDS": "",
            "EVENT_INTERVAL": "60",
            "CLAIM_STATUS": "auto",
        }.items()
    )
    env = env_of(
        container(find(render("observability"), "DaemonSet", "-kubelet-plugin"), "kubelet-plugin")
    )
    assert env["FATAL_XID_TAINT_EFFECT"]["value"] == "NoExecute"
    assert env["IGNORED_XIDS"]["value"] == "13,31"


@pytest.mark.parametrize(
    ("value_set", "mode", "mounted"),
    [
        ("defaults", "auto", True),
        ("observability", "strict", True),
        ("no-metrics-no-dmem", "off", False),
        ("fake", "auto", False),  # fake GPUs have no dmem region
    ],
)
def test_plugin_dmem_hook_mounts(value_set: str, mode: str, mounted: bool) -> None:
    ds = find(render(value_set), "DaemonSet", "-kubelet-plugin")
    plugin = container(ds, "kubelet-plugin")
    env = env_of(plugin)
    assert env["DMEM_LIMITS"]["value"] == mode
    volumes = {v["name"]: v for v in ds["spec"]["template"]["spec"]["volumes"]}
    mounts = {m["name"]: m for m in plugin["volumeMounts"]}
    if not mounted:
        assert not {"hook-dir", HOST_CGROUP} & (set(volumes) | set(mounts))
        assert "HOOK_DIR" not in env and "CGROUP_ROOT" not in env
        return
    hooks = "/var/lib/fractional-gpu-dra/hooks"
    assert env["HOOK_DIR"]["value"] == hooks
    assert volumes["hook-dir"]["hostPath"] == {"path": hooks, "type": "DirectoryOrCreate"}
    assert mounts["hook-dir"]["mountPath"] == hooks and not mounts["hook-dir"].get("readOnly")
    assert env["CGROUP_ROOT"]["value"] == "/host/sys/fs/cgroup"
    assert volumes[HOST_CGROUP]["hostPath"] == {"path": "/sys/fs/cgroup", "type": "Directory"}
    assert mounts[HOST_CGROUP] == {
        "name": HOST_CGROUP,
        "mountPath": "/host/sys/fs/cgroup",
        "readOnly": True,
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
    """What tests/integration/test_chart_rbac.py saw the plugin use, as rendered."""
    rs = "resource.k8s.io"
    expected = {
        (rs, "resourceclaims", "get", ""),
        *((rs, "resourceslices", v, "") for v in ("list", "create", "update", "delete")),
        ("", "nodes", "get", ""),
        ("", "events", "create", ""),
        ("", "events", "patch", ""),
    }
    assert rules(render("no-claim-status"), "ClusterRole", "-kubelet-plugin") == expected
    with_status = rules(render("defaults"), "ClusterRole", "-kubelet-plugin")
    assert with_status - expected == {
        (rs, "resourceclaims/status", "patch", ""),
        (rs, "resourceclaims/driver", "associated-node:patch", DRIVER),
    }


def test_controller_rbac() -> None:
    """What tests/integration/test_chart_rbac.py saw the controller use, as rendered:
    every write a merge patch (the verb patch), reads by informers (list, watch)."""
    rs = "resource.k8s.io"
    watched = ("list", "watch")
    expected = {
        *((rs, "resourceclaims", v, "") for v in ("get", *watched, "patch")),
        (rs, "resourceclaims/status", "patch", ""),
        (rs, "resourceclaims/binding", "patch", ""),
        *((rs, r, v, "") for r in ("deviceclasses", "resourceslices") for v in watched),
        *(("", r, v, "") for r in ("pods", "nodes", "namespaces") for v in watched),
        ("", "events", "create", ""),
    }
    docs = render("controller")
    assert rules(docs, "ClusterRole", "-controller") == expected
    lease = "fractional-gpu-dra-controller"
    assert rules(docs, "Role", "-controller-leader-election") == {
        ("coordination.k8s.io", "leases", "create", ""),
        ("coordination.k8s.io", "leases", "get", lease),
        ("coordination.k8s.io", "leases", "patch", lease),
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
    assert "spec.nodeName" in variables["objectNodeName"]
    assert "spec.driver" in variables["objectDriver"]
    binding = find(docs, "ValidatingAdmissionPolicyBinding", "-resourceslices-own-node")
    assert binding["spec"] == {
        "policyName": policy["metadata"]["name"],
        "validationActions": ["Deny"],
    }


def _slice(node: str | None, driver: str | None = DRIVER) -> dict[str, Any]:
    pool = {"name": node or "all", "generation": 1, "resourceSliceCount": 1}
    spec: dict[str, Any] = {"pool": pool}
    if node is not None:
        spec["nodeName"] = node
    else:
        spec["allNodes"] = True
    if driver is not None:
        spec["driver"] = driver
    return {"metadata": {"name": "s"}, "spec": spec}


def test_slice_policy_allows_only_own_node_and_own_driver() -> None:
    """The policy's CEL run as the API server would, for each operation."""
    policy = find(render("defaults"), "ValidatingAdmissionPolicy", "-resourceslices-own-node")
    ours = _slice("node-a")

    def verdict(
        operation: str, node: str | None, old: dict[str, Any] | None, new: dict[str, Any] | None
    ) -> list[str] | None:
        return _admit(policy, PLUGIN_USER, node, old, new, operation=operation)

    assert verdict("CREATE", "node-a", None, ours) == []
    assert verdict("UPDATE", "node-a", ours, ours) == []
    assert verdict("DELETE", "node-a", ours, None) == []
    other_user = "system:serviceaccount:kube-system:x"
    assert _admit(policy, other_user, None, None, _slice("node-b", OTHER_DRIVER)) is None

    def refused(
        operation: str, node: str | None, old: dict[str, Any] | None, new: dict[str, Any] | None
    ) -> str:
        failed = verdict(operation, node, old, new)
        assert failed, "allowed"
        return " | ".join(failed)

    assert "no node association" in refused("CREATE", None, None, ours)
    assert "on node node-b may not modify ResourceSlices of node node-a" in refused(
        "CREATE", "node-b", None, ours
    )
    assert "ResourceSlices without a node" in refused("CREATE", "node-a", None, _slice(None))
    theirs = _slice("node-a", OTHER_DRIVER)
    says = f"the kubelet plugin of driver {DRIVER} may not modify ResourceSlices of driver "
    for operation, old, new in [
        ("CREATE", None, theirs),
        ("UPDATE", theirs, theirs),
        ("DELETE", theirs, None),
    ]:
        assert refused(operation, "node-a", old, new) == says + OTHER_DRIVER, operation
    assert refused("CREATE", "node-a", None, _slice("node-a", None)).endswith("of no driver")
    # Another node's slice of another driver: both rules say why.
    assert len(verdict("CREATE", "node-a", None, _slice("node-b", OTHER_DRIVER)) or []) == 2


# --- status.devices: the claim status policy -------------------------------------------

PLUGIN_USER = f"system:serviceaccount:{NAMESPACE}:{RELEASE}-fractional-gpu-dra-kubelet-plugin"
OTHER_DRIVER = "net.example.com"


def test_claim_status_policy_follows_the_value() -> None:
    docs = render("defaults")
    policy = find(docs, "ValidatingAdmissionPolicy", "-claim-status-own-node")
    assert policy["spec"]["matchConstraints"]["resourceRules"] == [
        {
            "apiGroups": ["resource.k8s.io"],
            "apiVersions": ["*"],
            "operations": ["UPDATE"],
            "resources": ["resourceclaims/status"],
        }
    ]
    binding = find(docs, "ValidatingAdmissionPolicyBinding", "-claim-status-own-node")
    assert binding["spec"] == {
        "policyName": policy["metadata"]["name"],
        "validationActions": ["Deny"],
    }
    plugin = env_of(container(find(docs, "DaemonSet", "-kubelet-plugin"), "kubelet-plugin"))
    assert plugin["CLAIM_STATUS"]["value"] == "auto"
    off = render("no-claim-status")
    assert not [d for d in off if "claim-status" in d["metadata"]["name"]]
    plugin = env_of(container(find(off, "DaemonSet", "-kubelet-plugin"), "kubelet-plugin"))
    assert plugin["CLAIM_STATUS"]["value"] == "off"


def _claim(node: str, devices: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    selector = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
    status: dict[str, Any] = {
        "allocation": {
            "devices": {"results": [{"request": "gpu", "driver": DRIVER, "pool": node}]},
            "nodeSelector": {"nodeSelectorTerms": [selector]},
        },
        "reservedFor": [{"resource": "pods", "name": "p", "uid": "u1"}],
    }
    if devices is not None:
        status["devices"] = devices
    return {"metadata": {"name": "c", "namespace": "ns"}, "status": status}


def _entry(driver: str, device: str = "gpu-0", note: str = "") -> dict[str, Any]:
    return {"driver": driver, "pool": "node-a", "device": device, "data": {"note": note}}


def _admit(
    policy: dict[str, Any],
    user: str,
    node: str | None,
    old: dict[str, Any] | None,
    new: dict[str, Any] | None,
    *,
    operation: str = "UPDATE",
) -> list[str] | None:
    """The policy's verdict as the API server reaches it: None when it does not match,
    else the messages of the failed validations (empty: allowed). ``old``/``new``
    None: no such object (a CREATE has no oldObject, a DELETE no object; CEL null)."""
    cel = pytest.importorskip("cel", reason="common-expression-language is not installed")
    extra = {"authentication.kubernetes.io/node-name": [node]} if node else {}
    env: dict[str, Any] = {
        "request": {"userInfo": {"username": user, "extra": extra}, "operation": operation},
        "object": new,
        "oldObject": old,
        "variables": {},
    }
    spec = policy["spec"]
    if not all(cel.evaluate(c["expression"], env) for c in spec["matchConditions"]):
        return None
    for variable in spec["variables"]:  # in order: later ones read earlier ones
        env["variables"] = {**env["variables"], variable["name"]: cel.evaluate(
            variable["expression"], env
        )}  # fmt: skip
    failed = []
    for check in spec["validations"]:
        if not cel.evaluate(check["expression"], env):
            message = check.get("message") or cel.evaluate(check["messageExpression"], env)
            failed.append(str(message))
    return failed


def test_claim_status_policy_allows_only_own_node_and_own_entries() -> None:
    policy = find(render("defaults"), "ValidatingAdmissionPolicy", "-claim-status-own-node")
    other = _entry(OTHER_DRIVER, "eth0", "theirs")
    old = _claim("node-a", [other])
    ours = _claim("node-a", [other, _entry(DRIVER)])

    assert _admit(policy, PLUGIN_USER, "node-a", old, ours) == []  # add ours
    assert _admit(policy, PLUGIN_USER, "node-a", ours, old) == []  # remove ours
    assert _admit(policy, PLUGIN_USER, "node-a", _claim("node-a"), _claim("node-a", [])) == []
    assert _admit(policy, "system:serviceaccount:kube-system:x", None, old, ours) is None

    def refused(node: str | None, before: dict[str, Any], after: dict[str, Any]) -> str:
        verdict = _admit(policy, PLUGIN_USER, node, before, after)
        assert verdict, "allowed"
        return " | ".join(verdict)

    assert "no node association" in refused(None, old, ours)
    assert "on node node-b may only write" in refused("node-b", old, ours)
    moved = _claim("node-a", [other, _entry(DRIVER)])
    moved["status"]["reservedFor"] = []
    assert "only status.devices" in refused("node-a", old, moved)
    cleared = _claim("node-a", [other, _entry(DRIVER)])
    del cleared["status"]["allocation"]
    assert "only status.devices" in refused("node-a", old, cleared)
    changed = _claim("node-a", [_entry(OTHER_DRIVER, "eth0", "changed"), _entry(DRIVER)])
    assert f"entries of driver {DRIVER}" in refused("node-a", old, changed)
    assert f"entries of driver {DRIVER}" in refused("node-a", old, _claim("node-a", []))
    unallocated = {"metadata": {"name": "c"}, "status": {}}
    assert "may only write" in refused("node-a", unallocated, unallocated)


# --- the disruption guard: pods of the plugin's node, only the guard's keys ------------

GUARD_MARKER = f"{DRIVER}/disruption-guard-set"


def test_disruption_guard_follows_the_value() -> None:
    off = render("defaults")
    plugin = env_of(container(find(off, "DaemonSet", "-kubelet-plugin"), "kubelet-plugin"))
    assert plugin["DISRUPTION_GUARD"]["value"] == "off"
    assert not [d for d in off if "disruption-guard" in d["metadata"]["name"]]
    assert not [r for r in rules(off, "ClusterRole", "-kubelet-plugin") if r[1] == "pods"]
    on = render("disruption-guard")
    plugin = env_of(container(find(on, "DaemonSet", "-kubelet-plugin"), "kubelet-plugin"))
    assert plugin["DISRUPTION_GUARD"]["value"] == "all"
    assert plugin["DISRUPTION_GUARD_INTERVAL"]["value"] == "30"
    assert rules(on, "ClusterRole", "-kubelet-plugin") - rules(
        off, "ClusterRole", "-kubelet-plugin"
    ) == {("", "pods", v, "") for v in ("get", "list", "patch")}
    policy = find(on, "ValidatingAdmissionPolicy", "-pod-disruption-guard")
    binding = find(on, "ValidatingAdmissionPolicyBinding", "-pod-disruption-guard")
    assert binding["spec"] == {
        "policyName": policy["metadata"]["name"],
        "validationActions": ["Deny"],
    }
    (rule,) = policy["spec"]["matchConstraints"]["resourceRules"]
    assert (rule["apiGroups"], rule["resources"]) == ([""], ["pods"])


def _guard_pod(node: str, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "p", "namespace": "ns", "labels": {"app": "llm"}}
    if annotations is not None:
        meta["annotations"] = annotations
    return {
        "metadata": meta,
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "i"}]},
    }


def test_pod_guard_policy_allows_only_own_node_and_the_guard_keys() -> None:
    policy = find(render("disruption-guard"), "ValidatingAdmissionPolicy", "-pod-disruption-guard")
    guarded = {
        "team": "a",
        "karpenter.sh/do-not-disrupt": "true",
        "cluster-autoscaler.kubernetes.io/safe-to-evict": "false",
        GUARD_MARKER: '{"claims":["u1"],"set":[]}',
    }
    bare = _guard_pod("node-a", {"team": "a"})
    ours = _guard_pod("node-a", guarded)

    def verdict(
        node: str | None, old: Any, new: Any, operation: str = "UPDATE"
    ) -> list[str] | None:
        return _admit(policy, PLUGIN_USER, node, old, new, operation=operation)

    assert verdict("node-a", bare, ours) == []  # guard
    assert verdict("node-a", ours, bare) == []  # release
    only_guard = {k: v for k, v in guarded.items() if k != "team"}
    assert verdict("node-a", _guard_pod("node-a"), _guard_pod("node-a", only_guard)) == []
    assert verdict("node-a", ours, _guard_pod("node-a", {**guarded, GUARD_MARKER: "{}"})) == []
    # A user's own value may stay as it is.
    mine = _guard_pod("node-a", {"cluster-autoscaler.kubernetes.io/safe-to-evict": "true"})
    assert verdict("node-a", mine, mine) == []
    assert _admit(policy, "system:serviceaccount:kube-system:x", None, bare, ours) is None

    def refused(node: str | None, old: Any, new: Any, operation: str = "UPDATE") -> str:
        failed = verdict(node, old, new, operation)
        assert failed, "allowed"
        return " | ".join(failed)

    assert "no node association" in refused(None, bare, ours)
    says = refused("node-b", bare, ours)
    assert "on node node-b may only annotate pods bound to that node" in says
    assert "not pods of node node-a" in says
    unbound = _guard_pod("node-a", {"team": "a"})
    del unbound["spec"]["nodeName"]
    assert "may only annotate pods bound" in refused("node-a", unbound, unbound)
    only = "may change only the pod annotations"
    assert only in refused("node-a", bare, _guard_pod("node-a", {"team": "b"}))
    assert only in refused("node-a", bare, _guard_pod("node-a", {}))
    assert only in refused("node-a", bare, _guard_pod("node-a", {"team": "a", "x": "y"}))
    wrong = {"team": "a", "karpenter.sh/do-not-disrupt": "false"}
    assert 'set only karpenter.sh/do-not-disrupt: "true"' in refused(
        "node-a", bare, _guard_pod("node-a", wrong)
    )
    evict = {"team": "a", "cluster-autoscaler.kubernetes.io/safe-to-evict": "true"}
    assert "safe-to-evict" in refused("node-a", bare, _guard_pod("node-a", evict))
    relabeled = _guard_pod("node-a", guarded)
    relabeled["metadata"]["labels"] = {"app": "other"}
    assert "never its spec, labels" in refused("node-a", bare, relabeled)
    respec = _guard_pod("node-a", guarded)
    respec["spec"]["containers"][0]["image"] = "other"
    assert "never its spec" in refused("node-a", bare, respec)
    assert "only update pods" in refused("node-a", None, ours, "CREATE")
    assert "only update pods" in refused("node-a", ours, None, "DELETE")


# --- DRA extended resources (KEP-5004) -------------------------------------------------


def test_extended_resource_classes_only_when_enabled() -> None:
    """Off by default: no class with extendedResourceName, no EXTENDED_RESOURCE_NAMES."""
    for value_set in ("defaults", "fake"):
        docs = render(value_set)
        assert not [
            d for d in docs if d["kind"] == "DeviceClass" and "extendedResourceName" in d["spec"]
        ]
        plugin = container(find(docs, "DaemonSet", "-kubelet-plugin"), "kubelet-plugin")
        assert "EXTENDED_RESOURCE_NAMES" not in env_of(plugin)


def test_extended_resource_classes_and_the_names_the_plugin_checks() -> None:
    docs = render("extended-resources")
    served = {
        d["spec"]["extendedResourceName"]: d["metadata"]["name"]
        for d in docs
        if d["kind"] == "DeviceClass" and "extendedResourceName" in d["spec"]
    }
    assert served["nvidia.com/gpu"] == "whole.gpu.fractional.dev"
    assert served["nvidia.com/mig-3g.40gb"] == "mig-3g.40gb.gpu.fractional.dev"
    assert served["example.com/small-gpu"] == "mig-1g.10gb.gpu.fractional.dev"  # overridden
    assert "nvidia.com/mig-1g.10gb" not in served
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert len(served) == 1 + len(values["extendedResources"]["mig"]["profiles"])
    plugin = container(find(docs, "DaemonSet", "-kubelet-plugin"), "kubelet-plugin")
    names = env_of(plugin)["EXTENDED_RESOURCE_NAMES"]["value"].split(",")
    assert sorted(names) == sorted(served)
    # The normal classes are still there and unchanged.
    classes = {d["metadata"]["name"] for d in docs if d["kind"] == "DeviceClass"}
    assert {"gpu.fractional.dev", "mig.gpu.fractional.dev", "share.gpu.fractional.dev"} <= classes


def test_extended_resources_gpu_class_can_be_renamed_or_left_out() -> None:
    done = _run_helm(
        "template", RELEASE, str(CHART), "--namespace", NAMESPACE,
        "--set", "extendedResources.enabled=true",
        "--set", "extendedResources.gpu.name=example.com/gpu",
        "--set", "extendedResources.gpu.className=gpu-ext.example.com",
        "--set-json", "extendedResources.mig.profiles=[]",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    docs = [d for d in yaml.safe_load_all(done.stdout) if d]
    served = {
        d["metadata"]["name"]: d["spec"]["extendedResourceName"]
        for d in docs
        if d["kind"] == "DeviceClass" and "extendedResourceName" in d["spec"]
    }
    assert served == {"gpu-ext.example.com": "example.com/gpu"}
    done = _run_helm(
        "template", RELEASE, str(CHART), "--namespace", NAMESPACE,
        "--set", "extendedResources.enabled=true", "--set", "extendedResources.gpu.name=",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    names = [
        d["spec"]["extendedResourceName"]
        for d in yaml.safe_load_all(done.stdout)
        if d and d["kind"] == "DeviceClass" and "extendedResourceName" in d["spec"]
    ]
    assert names and "nvidia.com/gpu" not in names


def test_extended_resources_notes_warn_about_the_device_plugin() -> None:
    done = _run_helm(
        "install", RELEASE, str(CHART), "--dry-run", "--namespace", NAMESPACE,
        "--set", "extendedResources.enabled=true",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    notes = done.stdout.split("NOTES:", 1)[1]
    assert "do not run the NVIDIA device plugin" in notes
    assert "alpha and OFF in 1.34/1.35" in notes
    assert "ExtendedResourceConflict" in notes
    done = _run_helm("install", RELEASE, str(CHART), "--dry-run", "--namespace", NAMESPACE)
    assert "device plugin" not in done.stdout.split("NOTES:", 1)[1]
