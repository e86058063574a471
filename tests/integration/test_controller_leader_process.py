"""Leader election that cannot fail silently: ``dra-driver controller`` as a process,
as its ServiceAccount, against the fake API server enforcing the chart's RBAC.

A leader whose renewals are refused (403 as the chart of 2026-12-01 refused them, or
409) logs each failure with its cause and, past the renew deadline, exits 2 so its
pod restarts; so does a leader that finds the Lease held by another. Before this, the
controller logged one line without a cause and idled for good with its pod Ready.
"""

from __future__ import annotations

import datetime
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from dra_driver.controller.leader import micro_time
from tests.support.chart import CONTROLLER_VALUES, controller_user
from tests.support.controller_env import DRIVER, LEASE_NAMESPACE, seed_cluster
from tests.support.eventually import eventually_sync
from tests.support.fakekube import FakeKubeApi
from tests.support.node import write_kubeconfig

pytestmark = pytest.mark.chart(CONTROLLER_VALUES)
"""The controller runs as its ServiceAccount under the chart's RBAC."""

LEASE = "fractional-gpu-dra-controller"
RENEW_DEADLINE_S = 1.5
EXIT_BUDGET_S = RENEW_DEADLINE_S + 5.0
"""The deadline, then one retry period and the process's shutdown, with room for a slow CI."""


class ControllerProcess:
    def __init__(self, api: FakeKubeApi, root: Path) -> None:
        kubeconfig = root / "kubeconfig"
        write_kubeconfig(kubeconfig, api.url, api.token_for(controller_user()))
        self.log_path = root / "controller.log"
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [
                    sys.executable, "-m", "dra_driver", "controller",
                    "--driver-name", DRIVER, "--kubeconfig", str(kubeconfig),
                    "--lease-namespace", LEASE_NAMESPACE, "--pod-name", "replica-0",
                    "--lease-duration", "3", "--renew-deadline", str(RENEW_DEADLINE_S),
                    "--retry-period", "0.2", "--metrics-port", "0",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )  # fmt: skip

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def exit_code_within(self, seconds: float) -> int:
        try:
            return self.proc.wait(timeout=seconds)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the controller still runs {seconds:.1f}s later:\n{self.log()[-3000:]}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def leader(fake_kube: FakeKubeApi, tmp_path: Path) -> Iterator[ControllerProcess]:
    """A controller process that holds the Lease."""
    seed_cluster(fake_kube, {"node-a": "h100-80gb:1"})
    controller = ControllerProcess(fake_kube, tmp_path)
    try:

        def holder() -> str:
            leases = [
                lease
                for lease in fake_kube.objects("Lease", LEASE_NAMESPACE)
                if lease["metadata"]["name"] == LEASE
            ]
            return str(leases[0]["spec"].get("holderIdentity", "")) if leases else ""

        eventually_sync(lambda: holder() == "replica-0", "the controller's Lease", timeout=20)
        yield controller
    finally:
        controller.stop()


@pytest.mark.parametrize(
    ("status", "message"),
    [
        (
            403,
            f'leases.coordination.k8s.io "{LEASE}" is forbidden: User '
            '"system:serviceaccount:fractional-gpu-dra:fractional-gpu-dra-controller" cannot '
            'patch resource "leases" in API group "coordination.k8s.io" in the namespace '
            '"fractional-gpu-dra"',
        ),
        (
            409,
            f'Operation cannot be fulfilled on leases.coordination.k8s.io "{LEASE}": the object '
            "has been modified; please apply your changes to the latest version and try again",
        ),
    ],
)
def test_a_leader_whose_renewals_fail_logs_each_cause_and_exits(
    fake_kube: FakeKubeApi, leader: ControllerProcess, status: int, message: str
) -> None:
    fake_kube.fail_next("PATCH", f"/leases/{LEASE}", status, times=10_000, message=message)
    refused_at = time.monotonic()
    assert leader.exit_code_within(EXIT_BUDGET_S) == 2
    took = time.monotonic() - refused_at
    log = leader.log()
    failures = [line for line in log.splitlines() if "could not renew the lease" in line]
    # Each attempt (every retry period) said why, with the HTTP status and the message.
    assert len(failures) >= 2, log
    assert all(f"HTTP {status}" in line and message in line for line in failures), failures
    assert "lost the leadership" in log and "renew deadline" in log, log
    assert took >= RENEW_DEADLINE_S - 0.5, f"gave up after {took:.1f}s, before the deadline"


def test_a_leader_that_finds_the_lease_taken_exits(
    fake_kube: FakeKubeApi, leader: ControllerProcess
) -> None:
    now = micro_time(datetime.datetime.now(datetime.UTC))
    fake_kube.patch(
        "Lease",
        LEASE,
        {"spec": {"holderIdentity": "replica-1", "renewTime": now, "acquireTime": now}},
        LEASE_NAMESPACE,
    )
    assert leader.exit_code_within(EXIT_BUDGET_S) == 2
    assert "the Lease is held by 'replica-1' now" in leader.log()


def test_a_candidate_that_may_not_take_the_lease_says_why_and_keeps_trying(
    fake_kube: FakeKubeApi, tmp_path: Path
) -> None:
    """Neither leading nor silent: each refused attempt is logged, and it goes on."""
    seed_cluster(fake_kube, {"node-a": "h100-80gb:1"})
    fake_kube.fail_next("POST", "/leases", 403, times=10_000, message="creating is forbidden")
    controller = ControllerProcess(fake_kube, tmp_path)
    try:
        eventually_sync(
            lambda: controller.log().count("could not take the lease") >= 3,
            "three refused attempts logged",
            timeout=20,
        )
        assert controller.proc.poll() is None
        assert "HTTP 403" in controller.log() and "creating is forbidden" in controller.log()
    finally:
        controller.stop()
