"""``hack/kind/install-driver.sh`` installs what the e2e tests need, checked without a cluster.

The script runs for real with ``kubectl`` and ``helm`` replaced by shims (the
``KUBECTL``/``HELM`` settings of hack/kind/common.sh): the kubectl shim names two
worker nodes, the helm shim records its arguments and values file. The recorded
install is then rendered with the real helm (``helm template`` with the same
arguments), and what the nodes' plugins would read is parsed by the plugin's own
node-config loader.
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

from dra_driver.core.settings import Allocator
from dra_driver.plugin.node_config import NodeFlags, load_node_settings

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
SETTINGS = ("CONTROLLER_ENABLED", "CONTROLLER_GPU", "ALLOCATOR", "FAKE_GPUS", "HELM_EXTRA_ARGS")


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


def test_one_gpu_per_node_for_the_controller_and_the_controller_on(tmp_path: Path) -> None:
    docs = install(tmp_path)
    assert named(docs, "Deployment", "-controller")
    (config_map,) = named(docs, "ConfigMap", "-node-config")
    assert set(config_map["data"]) == {"default.yaml", *(f"{n}.yaml" for n in NODES)}
    for node in NODES:
        path = tmp_path / f"{node}.yaml"
        path.write_text(config_map["data"][f"{node}.yaml"])
        settings = load_node_settings(NodeFlags(config_file=str(path)))
        allocators = [settings.for_gpu(i, f"GPU-{i}").allocator for i in range(4)]
        assert allocators == [
            Allocator.SCHEDULER,
            Allocator.SCHEDULER,
            Allocator.CONTROLLER,
            Allocator.SCHEDULER,  # the MIG GPU
        ], node
    (plugin,) = named(docs, "DaemonSet", "-kubelet-plugin")
    (ctr,) = [
        c for c in plugin["spec"]["template"]["spec"]["containers"] if c["name"] == "kubelet-plugin"
    ]
    env = {e["name"]: e.get("value") for e in ctr["env"]}
    assert env["FAKE_GPUS"] == "h100-80gb:3,h100-80gb:1:mig"
    assert env["ALLOCATOR"] == "scheduler"
    assert ctr["readinessProbe"]["httpGet"]["path"] == "/readyz"  # what helm --wait waits for


def test_controller_off_means_no_controller_gpus(tmp_path: Path) -> None:
    docs = install(tmp_path, CONTROLLER_ENABLED="false")
    assert not named(docs, "Deployment", "-controller")
    assert not named(docs, "ConfigMap", "-node-config")
