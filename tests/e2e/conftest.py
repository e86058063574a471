"""e2e fixtures: a real cluster, the user-facing examples applied, diagnostics, cleanup.

The tests run unchanged on kind (``hack/kind/run-e2e.sh``, GitHub Actions) and on
any real cluster with the driver installed: they talk to whatever ``KUBECONFIG``
names, with the official ``kubernetes`` client. Without ``KUBECONFIG``, or when
no API server answers there, every test here is skipped (quickly: one probe per
session, 5 s at most); ``E2E_REQUIRE_CLUSTER=1`` turns that skip into a failure,
so CI cannot pass by skipping.

Examples are applied as written in ``deploy/examples/<name>/<name>.yaml`` (STYLE
7), with the driver name substituted where a claim names it: CEL attribute
domains, constraint attribute names, opaque configs' ``driver`` and
``apiVersion``. DeviceClass names stay as they are (the chart's class names
are fixed; only their selectors follow the driver name). A customised run
(``DRIVER_NAME`` other than the placeholder) fails if the placeholder survives
anywhere else, so an example that names the driver in a new place cannot pass
silently against the wrong driver.

Modes (``E2E_MODE``, default ``chart``): ``chart`` runs ``test_examples_e2e.py``
against a cluster with the chart installed; ``control-plane`` and
``host-process`` run the driver as local processes (``modes.py``). The tests of
the other modes are skipped, with the reason.

Environment: ``KUBECONFIG``; ``DRIVER_NAME`` (default ``gpu.fractional.dev``);
``DRIVER_NAMESPACE`` (the chart's namespace, for plugin logs in diagnostics;
default ``fractional-gpu-dra``); ``E2E_TIMEOUT`` (seconds for an example's pods,
default 180); ``E2E_DELETE_TIMEOUT`` (seconds for its namespace to go, default
120); ``E2E_ARTIFACTS_DIR`` (diagnostics of failed tests are also written there);
``E2E_IMAGE`` (every mode: replaces the image of the pods the tests create and sets
``imagePullPolicy: Never``, for clusters without a registry); ``E2E_CONTROLLER_PATH=1``
(run the controller-path tests: needs the controller and GPUs with ``allocator:
controller``, as ``hack/kind/install-driver.sh`` installs them).
"""

from __future__ import annotations

import dataclasses
import os
import re
import time
from collections.abc import Callable, Generator, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.examples import PLACEHOLDER, Obj, pod_image, render_example

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


def _probe() -> Cluster | str:
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
    major = re.match(r"\d+", str(code.major))
    minor = re.match(r"\d+", str(code.minor))
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


@pytest.fixture(scope="session")
def cluster() -> Cluster:
    """The cluster, or a skip (a failure with ``E2E_REQUIRE_CLUSTER=1``)."""
    found = _probe()
    if isinstance(found, str):
        if os.environ.get("E2E_REQUIRE_CLUSTER") == "1":
            pytest.fail(f"E2E_REQUIRE_CLUSTER=1 but {found}")
        pytest.skip(found)
    return found


# --- an applied example ---------------------------------------------------------------


@dataclasses.dataclass
class Example:
    """One example applied to the cluster, in its own namespace."""

    name: str
    namespace: str
    objects: list[Obj]
    cluster: Cluster

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
                    f"{self.namespace}: pods not running after {self.cluster.timeout_s:.0f}s:\n"
                    + _pods_summary(pods)
                )
            time.sleep(POLL_S)

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


def _section(title: str, produce: Callable[[], str]) -> str:
    try:
        body = produce()
    except Exception as err:  # diagnostics must never hide the real failure
        body = f"(could not read: {err!r:.300})"
    return f"===== {title}\n{body}\n"


def _events(cluster: Cluster, namespace: str) -> str:
    events = cluster.objects("v1", "Event", namespace=namespace)
    events.sort(key=lambda e: str(e.get("lastTimestamp") or e.get("eventTime") or ""))
    return "\n".join(
        f"{e.get('lastTimestamp') or e.get('eventTime')} {e.get('type')} {e.get('reason')}"
        f" {e['involvedObject'].get('kind')}/{e['involvedObject'].get('name')}: {e.get('message')}"
        for e in events
    )


def _plugin_logs(cluster: Cluster) -> str:
    out = []
    for pod in cluster.objects("v1", "Pod", namespace=cluster.driver_namespace):
        name = pod["metadata"]["name"]
        for ctr in pod["spec"]["containers"]:
            text = cluster.core.read_namespaced_pod_log(
                name, cluster.driver_namespace, container=ctr["name"], tail_lines=80
            )
            out.append(f"--- {name}/{ctr['name']} (last 80 lines)\n{text}")
    return "\n".join(out)


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
            _section(f"pods in {namespace}", pods),
            _section(f"events in {namespace}", lambda: _events(cluster, namespace)),
            _section(f"ResourceClaims in {namespace}", claims),
            _section(f"ResourceSlices of {cluster.driver}", lambda: dump(cluster.slices())),
            _section(f"driver pods in {cluster.driver_namespace}", lambda: _plugin_logs(cluster)),
        ]
    )


def _delete_namespace(cluster: Cluster, namespace: str) -> bool:
    """Delete ``namespace`` and wait until it is gone; False on timeout."""
    from kubernetes.client.exceptions import ApiException

    try:
        cluster.core.delete_namespace(namespace)
    except ApiException as err:
        if err.status == 404:
            return True
        raise
    deadline = time.monotonic() + cluster.delete_timeout_s
    while time.monotonic() < deadline:
        try:
            cluster.core.read_namespace(namespace)
        except ApiException as err:
            if err.status == 404:
                return True
            raise
        time.sleep(POLL_S)
    return False


def _apply(cluster: Cluster, obj: Obj) -> None:
    resource = cluster.resource(obj["apiVersion"], obj["kind"])
    if resource.namespaced:
        resource.create(body=obj, namespace=obj["metadata"]["namespace"])
    else:
        resource.create(body=obj)


_REPORTS = pytest.StashKey[dict[str, pytest.TestReport]]()

E2E_MODES = ("chart", "control-plane", "host-process")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """``E2E_MODE`` (default ``chart``) selects the tests of one mode; a module names
    its mode in ``E2E_MODE_OF`` (default ``chart``). The others skip, saying why."""
    mode = os.environ.get("E2E_MODE") or "chart"
    if mode not in E2E_MODES:
        raise pytest.UsageError(f"E2E_MODE={mode!r}: expected one of {', '.join(E2E_MODES)}")
    here = Path(__file__).resolve().parent
    for item in items:
        if here not in Path(str(item.path)).resolve().parents:
            continue
        module = getattr(item, "module", None)
        of = getattr(module, "E2E_MODE_OF", "chart")
        if of != mode:
            item.add_marker(
                pytest.mark.skip(
                    reason=f"{of} mode: E2E_MODE={mode} selects the {mode} mode's tests"
                    f" (set E2E_MODE={of} to run these)"
                )
            )


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """Keep each phase's report on the item, so teardown knows whether the test failed."""
    report = yield
    item.stash.setdefault(_REPORTS, {})[report.when] = report
    return report


@pytest.fixture
def example(cluster: Cluster, request: pytest.FixtureRequest) -> Iterator[Callable[[str], Example]]:
    """``example(name)`` applies ``deploy/examples/<name>/<name>.yaml``.

    After the test: diagnostics if it failed (printed, and written under
    ``E2E_ARTIFACTS_DIR``), then every applied namespace is deleted and waited
    for, so the next example finds the GPUs free (a namespace that does not go
    means claims were not unprepared: reported as an error).
    """
    applied: list[Example] = []

    def apply(name: str) -> Example:
        objects = [pod_image(o) for o in render_example(name, cluster.driver)]
        namespace = next(o["metadata"]["name"] for o in objects if o["kind"] == "Namespace")
        assert _delete_namespace(cluster, namespace), f"{namespace}: left over and stuck"
        ex = Example(name=name, namespace=namespace, objects=objects, cluster=cluster)
        applied.append(ex)
        for obj in objects:
            _apply(cluster, obj)
        return ex

    yield apply

    reports = request.node.stash.get(_REPORTS, {})
    if any(r.failed for r in reports.values()):
        for ex in applied:
            text = diagnostics(cluster, ex.namespace)
            print(text)
            if cluster.artifacts is not None:
                cluster.artifacts.mkdir(parents=True, exist_ok=True)
                safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", request.node.nodeid)
                (cluster.artifacts / f"{safe}.txt").write_text(text)
    stuck = [ex.namespace for ex in applied if not _delete_namespace(cluster, ex.namespace)]
    if stuck:
        pytest.fail(
            f"namespaces not gone after {cluster.delete_timeout_s:.0f}s: {stuck}"
            " (claims not unprepared? see the plugin's logs)"
        )
