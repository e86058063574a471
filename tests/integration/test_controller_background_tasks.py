"""The controller's background tasks live as long as it does: one that dies stops it."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from dra_driver.app.controller import build_controller, serve
from dra_driver.app.tasks import BackgroundTaskFailed
from dra_driver.cli import main
from dra_driver.controller.informer import PODS, Informer
from dra_driver.controller.processing import ClaimProcessor
from tests.support.chart import CONTROLLER_VALUES, controller_user
from tests.support.controller_env import (
    DRIVER,
    LEASE_NAMESPACE,
    controller_client,
    controller_config,
    make_claim,
    seed_cluster,
)
from tests.support.fakekube import FakeKubeApi
from tests.support.node import write_kubeconfig

pytestmark = pytest.mark.chart(CONTROLLER_VALUES)
"""The controller runs as its ServiceAccount under the chart's RBAC."""

_informer_run = Informer.run


async def _pods_informer_returns(self: Informer) -> None:
    if self.kind == PODS:
        return
    await _informer_run(self)


async def _process_explodes(self: ClaimProcessor, uid: str, *_: object) -> None:
    raise RuntimeError("the worker exploded")


def _errors(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]


def test_an_informer_that_returns_stops_the_controller(
    fake_kube: FakeKubeApi, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    seed_cluster(fake_kube, {"node-a": "h100-80gb:1"})
    monkeypatch.setattr(Informer, "run", _pods_informer_returns)
    controller = build_controller(controller_client(fake_kube), controller_config())
    stop = asyncio.Event()

    async def scenario() -> BackgroundTaskFailed:
        with pytest.raises(BackgroundTaskFailed) as raised:
            await asyncio.wait_for(serve(controller, stop), 10)
        return raised.value

    failure = asyncio.run(scenario())
    assert failure.task_name == "informer-pods" and failure.cause is None
    assert "so the controller stops" in str(failure)
    assert not stop.is_set()
    # Stopped: the Lease given up.
    assert not controller.elector.is_leader
    errors = _errors(caplog)
    assert any("background task informer-pods ended" in m for m in errors), errors


def test_a_failing_worker_ends_the_controller_command_with_an_error(
    fake_kube: FakeKubeApi,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    tmp_path: Path,
) -> None:
    seed_cluster(fake_kube, {"node-a": "h100-80gb:1"})
    make_claim(fake_kube, "c1", "10Gi")
    monkeypatch.setattr(ClaimProcessor, "process", _process_explodes)
    kubeconfig = tmp_path / "kubeconfig"
    write_kubeconfig(kubeconfig, fake_kube.url, fake_kube.token_for(controller_user()))
    argv = [
        "controller",
        f"--driver-name={DRIVER}",
        f"--kubeconfig={kubeconfig}",
        f"--lease-namespace={LEASE_NAMESPACE}",
        "--pod-name=replica-0",
        "--batch-window=0",
    ]
    assert main(argv) == 2
    errors = _errors(caplog)
    assert any("background task worker failed" in m for m in errors), errors
    assert any(
        "worker failed: RuntimeError('the worker exploded')" in m and "controller stops" in m
        for m in errors
    ), errors
