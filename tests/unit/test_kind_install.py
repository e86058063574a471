"""``hack/kind/install-driver.sh`` installs what the e2e tests need, checked without a cluster.

The script runs for real with ``kubectl`` and ``helm`` replaced by shims (the
``KUBECTL``/``HELM`` settings of hack/kind/common.sh): the kubectl shim names two
worker nodes, the helm shim records its arguments and values file. The recorded
install is then rendered with the real helm (``helm template`` with the same
arguments), and what the nodes' plugins would read is parsed by the plugin's own
node-config loader. What such a node publishes on 1.36 (the real slice builder) is
read with the MIG examples' selectors, as the scheduler reads them.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from dra_driver.allocator import SelectorCache, allocate
from dra_driver.allocator.model import Device, gather_pools
from dra_driver.base.quantity import parse_quantity
from dra_driver.core.settings import Allocator, Capabilities, NodeSettings, Sharing
from dra_driver.core.slices import build_slices
from dra_driver.fakes.gpu import build_inventory, load_spec
from dra_driver.plugin.node_config import NodeFlags, load_node_settings
from tests.support.allocator import CLASSES
from tests.support.examples import PLACEHOLDER, claim_of_template, render_example

ROOT = Path(__file__).resolve().parents[2]
_LOCAL_HELM = ROOT / "hack" / "bin" / "helm"
HELM = str(_LOCAL_HELM) if os.access(_LOCAL_HELM, os.X_OK) else shutil.which("helm")
pytestmark = pytest.mark.skipif(
    HELM is None, reason="helm not found on PATH or in hack/bin/: run hack/install-helm.sh"
)

NODES = ("kind-worker", "kind-worker2")
KUBECTL_SHIM = f"""#!/usr/bin/env bash
echo "kubectl $*" >>"${{SHIM_DIR}}/kubectl.log"
case " $* " in
  *" get nodes "*) echo "{" ".join(NODES)}" ;;
  *" get resourceslices "*"-o name"*) echo "resourceslice.resource.k8s.io/kind-worker-gpu" ;;
esac
"""
HELM_SHIM = """#!/usr/bin/env bash
printf '%s\\n' "$@" >"${SHIM_DIR}/helm.args"
prev=""
for arg in "$@"; do
  if [[ "${prev}" == "--values" ]]; then cp "${arg}" "${SHIM_DIR}/values.yaml"; fi
  prev="${arg}"
done
"""
SETTINGS = (
    "CONTROLLER_ENABLED",
    "CONTROLLER_GPU",
    "MPS_MIG_GPU",
    "ALLOCATOR",
    "FAKE_GPUS",
    "HELM_EXTRA_ARGS",
)
KIND_GPUS = "h100-80gb:3,h100-80gb:2:mig"
"""hack/kind/common.sh FAKE_GPUS: gpu-0..2 whole, gpu-3 and gpu-4 MIG-enabled."""
S, C = Allocator.SCHEDULER, Allocator.CONTROLLER
EXCLUSIVE, MPS = Sharing.EXCLUSIVE, Sharing.MPS


def _shim(path: Path, text: str) -> str:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def install(tmp_path: Path, **env: str) -> tuple[dict[str, Any], ...]:
    """Run install-driver.sh against the shims; render what it would install."""
    environ = {k: v for k, v in os.environ.items() if k not in SETTINGS}
    environ |= {
        "SHIM_DIR": str(tmp_path),
        "KUBECTL": _shim(tmp_path / "kubectl", KUBECTL_SHIM),
        "HELM": _shim(tmp_path / "helm", HELM_SHIM),
        "KIND_KUBECONFIG": str(tmp_path / "kubeconfig"),
        **env,
    }
    done = subprocess.run(
        [str(ROOT / "hack" / "kind" / "install-driver.sh")],
        env=environ,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    args = (tmp_path / "helm.args").read_text().splitlines()
    assert args[:2] == ["upgrade", "--install"], args
    replay: list[str] = []
    rest = iter(args[2:])
    for arg in rest:
        if arg in ("--wait", "--create-namespace"):
            continue
        if arg in ("--timeout", "--kubeconfig"):
            next(rest)
            continue
        if arg == "--values":
            next(rest)
            replay += ["--values", str(tmp_path / "values.yaml")]
            continue
        replay.append(arg)
    assert HELM is not None
    rendered = subprocess.run(
        [HELM, "template", *replay], capture_output=True, text=True, timeout=60, check=False
    )
    assert rendered.returncode == 0, rendered.stderr
    return tuple(d for d in yaml.safe_load_all(rendered.stdout) if d)


def named(docs: tuple[dict[str, Any], ...], kind: str, suffix: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind and d["metadata"]["name"].endswith(suffix)]


def plugin_env(docs: tuple[dict[str, Any], ...]) -> dict[str, str | None]:
    (plugin,) = named(docs, "DaemonSet", "-kubelet-plugin")
    (ctr,) = [
        c for c in plugin["spec"]["template"]["spec"]["containers"] if c["name"] == "kubelet-plugin"
    ]
    return {e["name"]: e.get("value") for e in ctr["env"]}


def node_settings(docs: tuple[dict[str, Any], ...], tmp_path: Path) -> dict[str, NodeSettings]:
    """Each node's settings as its plugin reads them: its file of the node-config
    ConfigMap (the init container copies it), the chart's flags for the rest."""
    (config_map,) = named(docs, "ConfigMap", "-node-config")
    assert set(config_map["data"]) == {"default.yaml", *(f"{n}.yaml" for n in NODES)}
    allocator = plugin_env(docs)["ALLOCATOR"] or Allocator.SCHEDULER.value
    found = {}
    for node in NODES:
        path = tmp_path / f"{node}.yaml"
        path.write_text(config_map["data"][f"{node}.yaml"])
        found[node] = load_node_settings(NodeFlags(allocator=allocator, config_file=str(path)))
    return found


def per_gpu(settings: NodeSettings, count: int = 5) -> list[tuple[Allocator, Sharing]]:
    """(allocator, how its MIG instances are shared) of GPUs 0..count-1."""
    return [
        (gpu.allocator, gpu.mig_sharing)
        for gpu in (settings.for_gpu(i, f"GPU-{i}") for i in range(count))
    ]


def test_the_default_install(tmp_path: Path) -> None:
    """Controller on: GPU 2 of every node for the controller, GPU 4's MIG instances
    MPS-shared, the rest for the scheduler with exclusive MIG instances."""
    docs = install(tmp_path)
    assert named(docs, "Deployment", "-controller")
    for node, settings in node_settings(docs, tmp_path).items():
        assert per_gpu(settings) == [
            (S, EXCLUSIVE),
            (S, EXCLUSIVE),
            (C, EXCLUSIVE),
            (S, EXCLUSIVE),  # gpu-3, MIG: exclusive instances (mig-1g-by-cel)
            (S, MPS),  # gpu-4, MIG: MPS-shared instances (mig-mps-shares)
        ], node
    env = plugin_env(docs)
    assert env["FAKE_GPUS"] == KIND_GPUS
    assert env["ALLOCATOR"] == "scheduler"
    (plugin,) = named(docs, "DaemonSet", "-kubelet-plugin")
    (ctr,) = [
        c for c in plugin["spec"]["template"]["spec"]["containers"] if c["name"] == "kubelet-plugin"
    ]
    assert ctr["readinessProbe"]["httpGet"]["path"] == "/readyz"  # what helm --wait waits for


@pytest.mark.parametrize(
    ("env", "wanted"),
    [
        pytest.param(
            {"CONTROLLER_ENABLED": "false"},
            [(S, EXCLUSIVE)] * 4 + [(S, MPS)],
            id="controller-off",
        ),
        pytest.param(
            {"CONTROLLER_GPU": ""}, [(S, EXCLUSIVE)] * 4 + [(S, MPS)], id="no-controller-gpu"
        ),
        pytest.param(
            {"MPS_MIG_GPU": ""},
            [(S, EXCLUSIVE), (S, EXCLUSIVE), (C, EXCLUSIVE), (S, EXCLUSIVE), (S, EXCLUSIVE)],
            id="no-mps-mig-gpu",
        ),
        pytest.param({"CONTROLLER_GPU": "4"}, [(S, EXCLUSIVE)] * 4 + [(C, MPS)], id="one-gpu-both"),
    ],
)
def test_the_per_gpu_settings_follow_their_switches(
    tmp_path: Path, env: dict[str, str], wanted: list[tuple[Allocator, Sharing]]
) -> None:
    docs = install(tmp_path, **env)
    assert bool(named(docs, "Deployment", "-controller")) == (
        env.get("CONTROLLER_ENABLED") != "false"
    )
    for node, settings in node_settings(docs, tmp_path).items():
        assert per_gpu(settings) == wanted, node


def test_no_per_gpu_setting_means_no_node_config(tmp_path: Path) -> None:
    docs = install(tmp_path, CONTROLLER_ENABLED="false", MPS_MIG_GPU="")
    assert not named(docs, "Deployment", "-controller")
    assert not named(docs, "ConfigMap", "-node-config")


def selectors(example: str, template: str) -> list[str]:
    """The CEL selectors of one request of an example's claim template."""
    (obj,) = [
        o
        for o in render_example(example, PLACEHOLDER)
        if o["kind"] == "ResourceClaimTemplate" and o["metadata"]["name"] == template
    ]
    (request,) = obj["spec"]["spec"]["devices"]["requests"]
    return [s["cel"]["expression"] for s in request["exactly"].get("selectors", [])]


def published(docs: tuple[dict[str, Any], ...], tmp_path: Path) -> list[dict[str, Any]]:
    """The first node's ResourceSlices on 1.36, as its plugin would build them."""
    fake_gpus = plugin_env(docs)["FAKE_GPUS"]
    assert fake_gpus is not None
    built = build_slices(
        build_inventory(load_spec(fake_gpus), NODES[0]),
        driver_name=PLACEHOLDER,
        node_name=NODES[0],
        settings=node_settings(docs, tmp_path)[NODES[0]],
        capabilities=Capabilities.for_version(36),
    )
    return [{"spec": s.spec} for s in built]


def test_the_mig_examples_find_their_own_gpu(tmp_path: Path) -> None:
    """On 1.36, with what the kind install gives a node: mig-mps-shares' requests find
    only GPU 4's (MPS-shared) 1g partitions at placement 0, which overlap (memory
    slice 0 of one counter set, and a shareable device's counters are drawn once), so
    the second share can only join the device of the first, and both fit in it;
    mig-1g-by-cel finds only exclusive 1g partitions, none of GPU 4's."""
    docs = install(tmp_path)
    (pool,) = gather_pools(published(docs, tmp_path))
    (mig_class,) = [
        d
        for d in docs
        if d["kind"] == "DeviceClass" and d["metadata"]["name"] == f"mig.{PLACEHOLDER}"
    ]
    class_selectors = [s["cel"]["expression"] for s in mig_class["spec"]["selectors"]]
    cache = SelectorCache()

    def matching(example: str, template: str) -> list[Device]:
        wanted = class_selectors + selectors(example, template)
        return [d for d in pool.devices if all(cache.matches(e, d) for e in wanted)]

    small, large = matching("mig-mps-shares", "small"), matching("mig-mps-shares", "large")
    assert [d.name for d in small] == [d.name for d in large]
    assert {d.name for d in small} == {"gpu-4-mig-1g20gb-15-0", "gpu-4-mig-1g10gb-19-0"}
    for device in small:
        assert device.allow_multiple_allocations, device.name
        assert device.attributes["sharing"] == "mps"
        ((counter_set, counters),) = device.consumes_counters
        assert counter_set == "gpu-4-counters"
        assert "memory-slice-0" in counters, device.name
        assert device.capacity["memory"].value >= parse_quantity("6Gi")  # 2Gi + 4Gi
        assert device.capacity["computePercent"].value >= 90  # 30 + 60

    exclusive = matching("mig-1g-by-cel", "mig-1g")
    assert exclusive
    assert {d.attributes["parentIndex"] for d in exclusive} == {3}
    assert {d.attributes["sharing"] for d in exclusive} == {"exclusive"}
    assert {str(d.attributes["profile"])[:3] for d in exclusive} == {"1g."}


def test_the_controller_share_lands_on_the_controller_gpu(tmp_path: Path) -> None:
    """The controller packs controller-path-share onto GPU 2, the one GPU published for
    it; GPU 4's MPS-shared MIG partitions are the scheduler's."""
    docs = install(tmp_path)
    claim = claim_of_template("controller-path-share", "fgd-controller-path-share")
    outcome = allocate(
        claim,
        slices=published(docs, tmp_path),
        classes=CLASSES,
        allocated_claims=[],
        driver_name=PLACEHOLDER,
    )
    assert outcome.allocation is not None, outcome.reason
    assert [r.device for r in outcome.allocation.results] == ["gpu-2"]
