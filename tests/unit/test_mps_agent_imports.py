"""The mps-agent process loads neither gRPC nor the Kubernetes client (memory: the agent
holds one MPS daemon per GPU and needs neither)."""

from __future__ import annotations

import subprocess
import sys

# What `dra-driver mps-agent` imports: the CLI, then the agent's own modules.
AGENT_IMPORTS = """
import sys
import dra_driver.cli
from dra_driver.mpsagent.agent import run_agent
from dra_driver.mpsagent.compute_mode import NvidiaSmiComputeMode
from dra_driver.observability.agent_metrics import AgentMetrics
from dra_driver.observability.metrics_server import serve_metrics
heavy = sorted({m.split(".")[0] for m in sys.modules} & {"grpc", "kubernetes", "google"})
print(",".join(heavy))
"""


def test_the_mps_agent_imports_neither_grpc_nor_the_kubernetes_client() -> None:
    done = subprocess.run(
        [sys.executable, "-c", AGENT_IMPORTS], capture_output=True, text=True, check=True
    )
    assert done.stdout.strip() == "", done.stdout
