"""The chart grants each component exactly what its requests use: checked, not guessed.

Each component runs through every kind of request it makes (a scenario per
component) against the fake API server enforcing the chart's RBAC and admission
policies for the identity the chart gives it. The fake records every
authorization question, the API server's own checks of the synthetic
subresources (``resourceclaims/binding``, ``resourceclaims/driver``) included; the
test then asks two things: nothing was refused, and every rule the chart binds
to the ServiceAccount was needed by at least one request. A verb the code starts
to use fails the first; a grant it stops using fails the second.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import os
import shutil
import subprocess
import sys

import pytest

from dra_driver.fakes.kubelet import FakeKubelet
from dra_driver.fakes.objects import Allocated, claim_ref, node_object, resource_claim
from tests.support.chart import (
    CONTROLLER_VALUES,
    EXTENDED_VALUES,
    GUARD_VALUES,
    Permission,
    chart_api,
    controller_user,
    granted,
    plugin_token,
    plugin_user,
    render_chart,
    unused,
    used,
)
from tests.support.controller_env import (
    allocation_of,
    events_for,
    make_claim,
    make_pod,
    running,
    seed_cluster,
    settled,
)
from tests.support.eventually import eventually, eventually_sync
from tests.support.fakekube import FakeKubeApi, JsonObj
from tests.support.node import DRIVER, NODE, NodeDirs, run_checked
from tests.support.processes import stop_process


def test_the_controller_uses_every_grant_and_nothing_more() -> None:
    """Informers, leader election (take, renew, release), allocation (finalizer and
    status), a conflict (re-read), an unplaceable claim's Events, and a deallocation
    when the pod goes; on 1.34 and on 1.36 (whose API server also checks the
    ``resourceclaims/binding`` subresource), which the same chart serves."""

    async def scenario(api: FakeKubeApi) -> None:
        seed_cluster(api, {"node-a": "h100-80gb:1"})
        make_claim(api, "fits", "10Gi")
        make_claim(api, "unplaceable", "10Gi")
        # The first write to "fits" meets a conflict: the controller reads it again.
        api.fail_next("PATCH", "/resourceclaims/fits", 409)
        async with running(api, event_interval_s=0.0, retry_unfit_s=0.3) as controller:
            make_pod(api, "p-fits", "fits")
            make_pod(api, "p-unplaceable", "unplaceable", nodeSelector={"zone": "nowhere"})
            await eventually(lambda: allocation_of(api, "fits") is not None)
            await eventually(
                lambda: len(events_for(api, "unplaceable", "CannotAllocate")) >= 2,
                "a repeated CannotAllocate Event",
            )
            api.delete("Pod", "p-fits", "default")
            await eventually(lambda: allocation_of(api, "fits") is None, "the deallocation")
            await settled(controller)

    user = controller_user()
    needed: set[Permission] = set()
    for minor in (34, 36):
        with chart_api(CONTROLLER_VALUES, kube_minor=minor) as api:
            asyncio.run(scenario(api))
            allowed, refused = used(api, user)
        assert not refused, f"1.{minor}: refused {refused}"
        needed |= allowed
        assert granted(render_chart(CONTROLLER_VALUES, minor), user) == granted(
            render_chart(CONTROLLER_VALUES, 36), user
        ), "the chart grants the same on every release"
    grants = granted(render_chart(CONTROLLER_VALUES), user)
    assert unused(grants, needed) == set(), f"granted but never needed; needed: {sorted(needed)}"


PLUGIN_VALUES = (*GUARD_VALUES, *EXTENDED_VALUES)
"""The plugin's widest install: the disruption guard and extended resources on, claim
status on (the default)."""
NO_STATUS_VALUES = ("kubeletPlugin.writeDeviceStatus=false",)


@dataclasses.dataclass(frozen=True)
class PluginInstall:
    """Chart values and the plugin flags the chart derives from them."""

    values: tuple[str, ...]
    guard: bool
    status: bool

    def flags(self) -> list[str]:
        guard = ["--disruption-guard", "all" if self.guard else "off"]
        return [*guard, "--claim-status", "auto" if self.status else "off"]


INSTALLS = {
    "widest": PluginInstall(PLUGIN_VALUES, guard=True, status=True),
    "defaults": PluginInstall((), guard=False, status=True),
    "no-status": PluginInstall(NO_STATUS_VALUES, guard=False, status=False),
}


def start_plugin_process(
    dirs: NodeDirs, api: FakeKubeApi, install: PluginInstall
) -> subprocess.Popen[bytes]:
    kubeconfig = dirs.kubeconfig(api.url, plugin_token(api))
    cmd = [
        sys.executable, "-m", "dra_driver", "kubelet-plugin",
        "--node-name", NODE, "--driver-name", DRIVER,
        "--registry-dir", dirs.registry, "--plugin-dir", dirs.plugin,
        "--cdi-root", dirs.cdi, "--fake-gpus", "h100-80gb:2",
        "--kubeconfig", kubeconfig, "--boot-id-file", dirs.boot_id_file,
        "--sharing", "timeslicing", "--event-interval", "0",
        "--disruption-guard-interval", "0", *install.flags(),
        "--extended-resource-names", "nvidia.com/gpu", "--health-probe-interval", "0",
    ]  # fmt: skip
    with open(os.path.join(dirs.root, "plugin.log"), "ab") as log:
        return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)


def ours(api: FakeKubeApi) -> list[JsonObj]:
    return [s for s in api.objects("ResourceSlice") if s["spec"].get("nodeName") == NODE]


def guarded_pod(name: str, claim_name: str) -> JsonObj:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "nodeName": NODE,
            "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10"}],
            "resourceClaims": [{"name": "gpu", "resourceClaimName": claim_name}],
        },
        "status": {"phase": "Running"},
    }


def has_status_devices(api: FakeKubeApi, claim: str) -> bool:
    return bool((api.get("ResourceClaim", claim, "default").get("status") or {}).get("devices"))


def has_annotations(api: FakeKubeApi, pod: str) -> bool:
    return bool(api.get("Pod", pod, "default")["metadata"].get("annotations"))


def event_counted(api: FakeKubeApi, claim: str, count: int) -> bool:
    return any(
        e.get("count", 1) >= count
        for e in api.objects("Event", "default")
        if e["involvedObject"]["name"] == claim
    )


def plugin_scenario(api: FakeKubeApi, dirs: NodeDirs, install: PluginInstall) -> None:
    """Publish (probe, create), restart over a changed and a stale slice (update,
    delete), prepare a claim (read, status, guard with a conflict), a refused prepare
    twice (an Event and its counted repeat), unprepare."""
    api.create(node_object(NODE))
    good = api.create(resource_claim("default", "good", devices=[Allocated("gpu-0")]))
    elsewhere = api.create(resource_claim("default", "elsewhere", node="node-b"))
    api.create(guarded_pod("p-good", "good"))
    proc = start_plugin_process(dirs, api, install)
    try:
        eventually_sync(lambda: len(ours(api)) > 0, "the first publish", timeout=30)
    finally:
        stop_process(proc, 15)
    changed = ours(api)[0]
    changed["spec"]["devices"] = changed["spec"]["devices"][:1]
    api.update(changed)
    stale = {**changed, "metadata": {"name": f"{NODE}-stale"}}
    api.create(stale)
    if install.guard:
        api.fail_next("PATCH", "/pods/p-good", 409)  # the guard reads the pod again
    proc = start_plugin_process(dirs, api, install)
    try:
        eventually_sync(
            lambda: len(ours(api)) == 1 and len(ours(api)[0]["spec"]["devices"]) == 2,
            "the republished pool",
            timeout=30,
        )

        async def kubelet_calls() -> None:
            kubelet = FakeKubelet(dirs.registry)
            try:
                plugin = await kubelet.wait_for_plugin(DRIVER, timeout=30)
                assert (await plugin.prepare([claim_ref(good)]))[claim_ref(good).uid].error == ""
                for count in (1, 2):  # the repeat once the first is written: a count on it
                    await plugin.prepare([claim_ref(elsewhere)])
                    await eventually(
                        functools.partial(event_counted, api, "elsewhere", count),
                        f"the refused prepare's Event, count {count}",
                        timeout=15,
                    )
                if install.status:
                    await eventually(
                        functools.partial(has_status_devices, api, "good"),
                        "status.devices",
                        timeout=15,
                    )
                if install.guard:
                    await eventually(
                        functools.partial(has_annotations, api, "p-good"),
                        "the guard's annotations",
                        timeout=15,
                    )
                assert await plugin.unprepare([claim_ref(good)]) == {claim_ref(good).uid: ""}
                if install.guard:
                    await eventually(
                        lambda: not has_annotations(api, "p-good"),
                        "the guard's annotations removed",
                        timeout=15,
                    )
            finally:
                await kubelet.close()

        run_checked(kubelet_calls())
    finally:
        stop_process(proc, 15)


@pytest.mark.parametrize("install", list(INSTALLS.values()), ids=list(INSTALLS))
def test_the_plugin_uses_every_grant_and_nothing_more(
    node_dirs: NodeDirs, install: PluginInstall
) -> None:
    user = plugin_user(NODE)
    needed: set[Permission] = set()
    for minor in (34, 36):
        for path in (node_dirs.plugin, node_dirs.cdi):
            shutil.rmtree(path)
            os.makedirs(path)
        with chart_api(install.values, kube_minor=minor) as api:
            plugin_scenario(api, node_dirs, install)
            allowed, refused = used(api, user)
        assert not refused, f"1.{minor}: refused {refused}"
        needed |= allowed
    grants = granted(render_chart(install.values), user)
    assert unused(grants, needed) == set(), f"granted but never needed; needed: {sorted(needed)}"
