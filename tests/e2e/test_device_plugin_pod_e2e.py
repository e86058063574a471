"""The device-plugin-pod example on a cluster with the chart (``E2E_MODE=chart``).

Install the chart with ``extendedResources.enabled=true`` and at least one GPU
with ``sharing: exclusive`` (e.g. ``--set nodeSettings.defaults.sharing=exclusive``
on a kind cluster with fake GPUs). Skips, saying why, where the class or such a
GPU is missing (``tests/e2e/extended.py``).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.e2e.conftest import Cluster, Example
from tests.e2e.extended import (
    EXAMPLE,
    check_claim,
    check_logs,
    extended_claim,
    require_extended_class,
    require_whole_gpu,
)

pytestmark = pytest.mark.e2e


def test_device_plugin_pod_runs_unchanged(
    cluster: Cluster, example: Callable[[str], Example]
) -> None:
    require_extended_class(cluster)
    require_whole_gpu(cluster)
    ex = example(EXAMPLE)
    ex.wait_running()
    claim, mappings = extended_claim(ex, "pod0")
    check_claim(cluster, ex, claim, mappings)
    check_logs(ex)
