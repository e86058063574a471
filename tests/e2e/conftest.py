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
and ``test_admission_e2e.py`` against a cluster with the chart installed;
``control-plane`` and ``host-process`` run the driver as local processes
(``tests/support/e2e_local_modes.py``). The tests of the other modes are
deselected. The helpers behind these fixtures: ``tests/support/cluster.py``
(the cluster, an applied example, diagnostics) and ``tests/support/examples.py``.

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

import os
import re
from collections.abc import Callable, Generator, Iterator
from pathlib import Path

import pytest

from tests.support.cluster import (
    REPORTS,
    Cluster,
    Example,
    apply_object,
    delete_namespace,
    diagnostics,
    probe_cluster,
)
from tests.support.examples import pod_image, render_example


@pytest.fixture(scope="session")
def cluster() -> Cluster:
    """The cluster, or a skip (a failure with ``E2E_REQUIRE_CLUSTER=1``)."""
    found = probe_cluster()
    if isinstance(found, str):
        if os.environ.get("E2E_REQUIRE_CLUSTER") == "1":
            pytest.fail(f"E2E_REQUIRE_CLUSTER=1 but {found}")
        pytest.skip(found)
    return found


E2E_MODES = ("chart", "control-plane", "host-process")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """``E2E_MODE`` (default ``chart``) selects the tests of one mode; a module names
    its mode in ``E2E_MODE_OF`` (default ``chart``). The others are deselected (the
    summary counts them as ``deselected``), so a run's ``skipped`` counts only tests
    of its own mode that could not run, each with its reason."""
    mode = os.environ.get("E2E_MODE") or "chart"
    if mode not in E2E_MODES:
        raise pytest.UsageError(f"E2E_MODE={mode!r}: expected one of {', '.join(E2E_MODES)}")
    here = Path(__file__).resolve().parent
    keep: list[pytest.Item] = []
    other: list[pytest.Item] = []
    for item in items:
        in_e2e = here in Path(str(item.path)).resolve().parents
        of = getattr(getattr(item, "module", None), "E2E_MODE_OF", "chart")
        (other if in_e2e and of != mode else keep).append(item)
    if other:
        config.hook.pytest_deselected(items=other)
        items[:] = keep


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """Keep each phase's report on the item, so teardown knows whether the test failed."""
    report = yield
    item.stash.setdefault(REPORTS, {})[report.when] = report
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
        assert delete_namespace(cluster, namespace), f"{namespace}: left over and stuck"
        ex = Example(name=name, namespace=namespace, objects=objects, cluster=cluster)
        applied.append(ex)
        for obj in objects:
            apply_object(cluster, obj)
        return ex

    yield apply

    reports = request.node.stash.get(REPORTS, {})
    if any(r.failed for r in reports.values()):
        for ex in applied:
            text = diagnostics(cluster, ex.namespace)
            print(text)
            if cluster.artifacts is not None:
                cluster.artifacts.mkdir(parents=True, exist_ok=True)
                safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", request.node.nodeid)
                (cluster.artifacts / f"{safe}.txt").write_text(text)
    stuck = [ex.namespace for ex in applied if not delete_namespace(cluster, ex.namespace)]
    if stuck:
        pytest.fail(
            f"namespaces not gone after {cluster.delete_timeout_s:.0f}s: {stuck}"
            " (claims not unprepared? see the plugin's logs)"
        )
