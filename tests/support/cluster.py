"""The cluster the e2e tests run against (:class:`Cluster`, found by
:func:`probe_cluster`), an example applied to it (:class:`Example`), and what explains
a failure (:func:`diagnostics`). The fixtures that use them: ``tests/e2e/conftest.py``."""

from __future__ import annotations

import dataclasses
import os
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.examples import PLACEHOLDER, Obj

POLL_S = 2.0

# --- the cluster ----------------------------------------------------------------------


@dataclasses.dataclass
class Cluster:
    """The cluster under test and the settings of this run."""

    api: Any
    """A ``kubernetes.client.ApiClient`` (the client library is untyped)."""
    version: tuple[int, int]
    driver: str
    driver_namespace: str
    timeout_s: float
    delete_timeout_s: float
    artifacts: Path | None
    _dynamic: Any = None

    @property
    def core(self) -> Any:
        from kubernetes import client

        return client.CoreV1Api(self.api)

    @property
    def dynamic(self) -> Any:
        """A discovery-backed client for any kind (created once, on first use)."""
        if self._dynamic is None:
            from kubernetes import dynamic

            self._dynamic = dynamic.DynamicClient(self.api)  # type: ignore[no-untyped-call]
        return self._dynamic

    def resource(self, api_version: str, kind: str) -> Any:
        return self.dynamic.resources.get(api_version=api_version, kind=kind)

    def objects(self, api_version: str, kind: str, **kwargs: Any) -> list[Obj]:
        """Objects as plain dicts (JSON field names)."""
        found = self.resource(api_version, kind).get(**kwargs).to_dict()
        items: list[Obj] = found.get("items") or []
        return items

    def slices(self) -> list[Obj]:
        return self.objects(
            "resource.k8s.io/v1", "ResourceSlice", field_selector=f"spec.driver={self.driver}"
        )


def probe_cluster() -> Cluster | str:
    """The cluster at KUBECONFIG, or why there is none."""
    if not os.environ.get("KUBECONFIG"):
        mode = os.environ.get("E2E_MODE") or "chart"
        needs = "with the driver installed" if mode == "chart" else "(the driver runs locally)"
        return f"KUBECONFIG is not set: the {mode} e2e mode needs a cluster {needs}"
    try:
        from kubernetes import client, config

        settings = client.Configuration()
        config.load_kube_config(client_configuration=settings)  # type: ignore[no-untyped-call]
        settings.retries = False  # the probe: one try, 5 s at most
        code = client.VersionApi(client.ApiClient(settings)).get_code(_request_timeout=5)
        api = config.new_client_from_config()  # type: ignore[no-untyped-call]
    except Exception as err:  # any failure means: no usable cluster here
        return f"no cluster answers at KUBECONFIG={os.environ['KUBECONFIG']}: {err!r:.300}"
    # A control plane emulating an older release (--emulated-version) says so in
    # emulationMajor/emulationMinor; it serves that release's APIs and gates, so the
    # tests must judge by them (as the driver does: dra_driver.k8s.capabilities).
    major = re.match(r"\d+", str(getattr(code, "emulation_major", None) or code.major))
    minor = re.match(r"\d+", str(getattr(code, "emulation_minor", None) or code.minor))
    if major is None or minor is None:
        return f"cannot read the server version {code.major!r}.{code.minor!r}"
    artifacts = os.environ.get("E2E_ARTIFACTS_DIR")
    return Cluster(
        api=api,
        version=(int(major.group()), int(minor.group())),
        driver=os.environ.get("DRIVER_NAME") or PLACEHOLDER,
        driver_namespace=os.environ.get("DRIVER_NAMESPACE") or "fractional-gpu-dra",
        timeout_s=float(os.environ.get("E2E_TIMEOUT") or 180),
        delete_timeout_s=float(os.environ.get("E2E_DELETE_TIMEOUT") or 120),
        artifacts=Path(artifacts) if artifacts else None,
    )


# --- an applied example ---------------------------------------------------------------


@dataclasses.dataclass
class Example:
    """One example applied to the cluster, in its own namespace."""

    name: str
    namespace: str
    objects: list[Obj]
    cluster: Cluster
    driver_logs: Callable[[], str] | None = None
    """The driver's last log lines where it runs as local processes (host-process and
    control-plane modes); None: the chart's pods in ``cluster.driver_namespace``."""

    def pods(self) -> list[Obj]:
        return self.cluster.objects("v1", "Pod", namespace=self.namespace)

    def pod(self, name: str) -> Obj:
        pod: Obj = (
            self.cluster.resource("v1", "Pod").get(name=name, namespace=self.namespace).to_dict()
        )
        return pod

    def claims(self) -> list[Obj]:
        return self.cluster.objects("resource.k8s.io/v1", "ResourceClaim", namespace=self.namespace)

    def claim_of(self, pod_name: str, claim_name: str) -> Obj:
        """The ResourceClaim behind ``pod.spec.resourceClaims[name=claim_name]``."""
        pod = self.pod(pod_name)
        entry = next(c for c in pod["spec"]["resourceClaims"] if c["name"] == claim_name)
        actual = entry.get("resourceClaimName")
        if actual is None:  # from a template: the generated name is in the pod status
            statuses = pod.get("status", {}).get("resourceClaimStatuses") or []
            actual = next(s.get("resourceClaimName") for s in statuses if s["name"] == claim_name)
        assert actual, f"pod {pod_name}: no ResourceClaim for {claim_name!r} yet"
        claim: Obj = (
            self.cluster.resource("resource.k8s.io/v1", "ResourceClaim")
            .get(name=actual, namespace=self.namespace)
            .to_dict()
        )
        return claim

    def logs(self, pod_name: str) -> str:
        text: str = self.cluster.core.read_namespaced_pod_log(pod_name, self.namespace)
        return text

    def wait_running(self) -> list[Obj]:
        """Wait until every pod runs with all containers ready (or succeeded)."""
        deadline = time.monotonic() + self.cluster.timeout_s
        while True:
            pods = self.pods()
            failed = [p for p in pods if p.get("status", {}).get("phase") == "Failed"]
            if failed:
                pytest.fail(f"{self.namespace}: pods failed:\n{_pods_summary(failed)}")
            if pods and all(_is_up(p) for p in pods):
                return pods
            if time.monotonic() > deadline:
                pytest.fail(
                    f"{self.namespace}: pods not running after {self.cluster.timeout_s:.0f}s"
                    f" (E2E_TIMEOUT)\n{self.waited_for()}"
                )
            time.sleep(POLL_S)

    def waited_for(self, log_lines: int = 30) -> str:
        """What a wait that timed out waited for: the pods, the namespace's latest
        events, each claim's status, the driver's last log lines."""
        logs = self.driver_logs or (lambda: plugin_logs(self.cluster, log_lines))
        return "".join(
            [
                section(f"pods in {self.namespace}", lambda: _pods_summary(self.pods())),
                section(
                    f"latest events in {self.namespace}",
                    lambda: _events(self.cluster, self.namespace, last=15),
                ),
                section(
                    f"ResourceClaims in {self.namespace}",
                    lambda: "\n".join(claim_summary(c) for c in self.claims()) or "  (none)",
                ),
                section("the driver's last log lines", logs),
            ]
        )

    def wait_logs(self, pod_name: str, marker: str) -> str:
        """The pod's log once it contains ``marker`` (the pods print, then sleep)."""
        deadline = time.monotonic() + 30
        while True:
            text = self.logs(pod_name)
            if marker in text or time.monotonic() > deadline:
                return text
            time.sleep(1)


def _is_up(pod: Obj) -> bool:
    status = pod.get("status") or {}
    if status.get("phase") == "Succeeded":
        return True
    containers = status.get("containerStatuses") or []
    return (
        status.get("phase") == "Running"
        and bool(containers)
        and all(c.get("ready") for c in containers)
    )


def _pods_summary(pods: list[Obj]) -> str:
    lines = []
    for pod in pods:
        status = pod.get("status") or {}
        lines.append(
            f"  pod {pod['metadata']['name']}: phase={status.get('phase')}"
            f" node={pod.get('spec', {}).get('nodeName')}"
        )
        for cond in status.get("conditions") or []:
            if cond.get("status") != "True":
                lines.append(
                    f"    {cond.get('type')}={cond.get('status')} {cond.get('reason') or ''}"
                    f" {cond.get('message') or ''}".rstrip()
                )
        for ctr in status.get("containerStatuses") or []:
            for state, detail in (ctr.get("state") or {}).items():
                if detail and state != "running":
                    lines.append(
                        f"    container {ctr.get('name')}: {state} {detail.get('reason') or ''}"
                        f" {detail.get('message') or ''}".rstrip()
                    )
    return "\n".join(lines) or "  (no pods)"


# --- diagnostics and cleanup ------------------------------------------------------------


def section(title: str, produce: Callable[[], str]) -> str:
    try:
        body = produce()
    except Exception as err:  # diagnostics must never hide the real failure
        body = f"(could not read: {err!r:.300})"
    return f"===== {title}\n{body}\n"


def claim_summary(claim: Obj) -> str:
    """One claim's status in a few lines: its allocation, who it is reserved for, the
    driver's ``status.devices`` conditions, and whether it is being deleted."""
    meta = claim["metadata"]
    status = claim.get("status") or {}
    allocation = status.get("allocation")
    lines = [f"  claim {meta['name']}" + (" (deleting)" if meta.get("deletionTimestamp") else "")]
    if not allocation:
        lines.append("    not allocated")
    else:
        for r in (allocation.get("devices") or {}).get("results") or []:
            consumed = r.get("consumedCapacity")
            lines.append(
                f"    allocated {r.get('request')}: {r.get('driver')} {r.get('pool')}/"
                f"{r.get('device')}" + (f" consumed {consumed}" if consumed else "")
            )
    reserved = [f"{r.get('resource')}/{r.get('name')}" for r in status.get("reservedFor") or []]
    lines.append(f"    reservedFor: {', '.join(reserved) or '-'}")
    for device in status.get("devices") or []:
        conditions = ", ".join(
            " ".join(
                str(part)
                for part in (
                    f"{c.get('type')}={c.get('status')}",
                    c.get("reason"),
                    c.get("message"),
                )
                if part
            )
            for c in device.get("conditions") or []
        )
        lines.append(f"    status.devices {device.get('device')}: {conditions or '-'}")
    return "\n".join(lines)


def _events(cluster: Cluster, namespace: str, last: int | None = None) -> str:
    events = cluster.objects("v1", "Event", namespace=namespace)
    events.sort(key=lambda e: str(e.get("lastTimestamp") or e.get("eventTime") or ""))
    if last is not None:
        events = events[-last:]
    return "\n".join(
        f"{e.get('lastTimestamp') or e.get('eventTime')} {e.get('type')} {e.get('reason')}"
        f" {e['involvedObject'].get('kind')}/{e['involvedObject'].get('name')}: {e.get('message')}"
        for e in events
    )


def plugin_logs(cluster: Cluster, tail: int = 80) -> str:
    """The last ``tail`` lines of every container of the chart's pods."""
    out = []
    for pod in cluster.objects("v1", "Pod", namespace=cluster.driver_namespace):
        name = pod["metadata"]["name"]
        for ctr in pod["spec"]["containers"]:
            text = cluster.core.read_namespaced_pod_log(
                name, cluster.driver_namespace, container=ctr["name"], tail_lines=tail
            )
            out.append(f"--- {name}/{ctr['name']} (last {tail} lines)\n{text}")
    return "\n".join(out) or f"  (no pods in {cluster.driver_namespace})"


def diagnostics(cluster: Cluster, namespace: str) -> str:
    """What explains a failed example: pods, events, claims, slices, plugin logs."""

    def dump(objs: list[Obj]) -> str:
        return yaml.safe_dump(objs, sort_keys=False)

    def pods() -> str:
        return _pods_summary(cluster.objects("v1", "Pod", namespace=namespace))

    def claims() -> str:
        return dump(cluster.objects("resource.k8s.io/v1", "ResourceClaim", namespace=namespace))

    return "".join(
        [
            section(f"pods in {namespace}", pods),
            section(f"events in {namespace}", lambda: _events(cluster, namespace)),
            section(f"ResourceClaims in {namespace}", claims),
            section(f"ResourceSlices of {cluster.driver}", lambda: dump(cluster.slices())),
            section(f"driver pods in {cluster.driver_namespace}", lambda: plugin_logs(cluster)),
        ]
    )


def wait_for_event(
    cluster: Cluster, namespace: str, name: str, wanted: Callable[[str], bool]
) -> list[str]:
    """The Events about object ``name`` as ``"<reason>: <message>"``, polled until one is
    ``wanted`` or the cluster's timeout passes (the caller asserts on what came)."""
    deadline = time.monotonic() + cluster.timeout_s
    seen: list[str] = []
    while time.monotonic() < deadline:
        events = cluster.core.list_namespaced_event(
            namespace, field_selector=f"involvedObject.name={name}"
        ).items
        seen = [f"{e.reason}: {e.message}" for e in events]
        if any(wanted(e) for e in seen):
            break
        time.sleep(2)
    return seen


def delete_namespace(cluster: Cluster, namespace: str) -> bool:
    """Delete ``namespace`` and wait until it is gone; False on timeout."""
    return delete_and_wait(
        cluster,
        lambda: cluster.core.delete_namespace(namespace),
        lambda: cluster.core.read_namespace(namespace),
    )


def delete_and_wait(
    cluster: Any, delete: Callable[[], object], read: Callable[[], object], poll_s: float = POLL_S
) -> bool:
    """``delete()`` an object, then ``read()`` it until the API server answers 404: a
    real one keeps what a finalizer holds (a namespace stays ``Terminating`` until its
    content is gone), and a create of its name meanwhile is refused. False after
    ``cluster.delete_timeout_s``."""
    from kubernetes.client.exceptions import ApiException

    try:
        delete()
    except ApiException as err:
        if err.status == 404:
            return True
        raise
    deadline = time.monotonic() + cluster.delete_timeout_s
    while True:
        try:
            read()
        except ApiException as err:
            if err.status == 404:
                return True
            raise
        if time.monotonic() >= deadline:
            return False
        time.sleep(poll_s)


def apply_object(cluster: Cluster, obj: Obj) -> None:
    resource = cluster.resource(obj["apiVersion"], obj["kind"])
    if resource.namespaced:
        resource.create(body=obj, namespace=obj["metadata"]["namespace"])
    else:
        resource.create(body=obj)


REPORTS = pytest.StashKey[dict[str, pytest.TestReport]]()
"""Each phase's report of a test, kept on its item by ``tests/e2e/conftest.py``."""
