"""The device-plugin-pod example on a cluster with the chart (``E2E_MODE=chart``).

Install the chart with ``extendedResources.enabled=true``; any free GPU of ours
serves the pod (on a shared one the request takes all the memory and is prepared
as the whole GPU). Skips, saying why, where the class or such a GPU is missing
(``tests/support/e2e_device_plugin_pod.py``).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.support.cluster import Cluster, Example
from tests.support.e2e_device_plugin_pod import (
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
