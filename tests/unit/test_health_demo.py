"""The demo shows device health: an XID, the taint it publishes, the stream, the recovery."""

from __future__ import annotations

import io

from dra_driver.demo import main


def test_demo_shows_an_xid_its_taint_and_the_recovery() -> None:
    out = io.StringIO()
    assert main("h100-80gb:2,l4,h100-80gb:1:mig", None, out) == 0
    text = out.getvalue()
    assert "health stream (v1alpha1): 28 devices: 28 Healthy" in text
    assert (
        "  health stream: gpu-1 Unhealthy: xid-48: XID 48 (double-bit ECC error) "
        "(needs a GPU reset)" in text
    )
    assert (
        "device taints published: demo-node-gpu-fractional-dev-devices-0 device gpu-1: "
        "gpu.fractional.dev/unhealthy=xid-48:NoSchedule" in text
    )
    assert "GPU reset seen: gpu-1 Healthy; device taints published: none" in text


def test_demo_health_on_a_single_mig_gpu() -> None:
    out = io.StringIO()
    assert main("a100-40gb:1:mig", None, out) == 0  # the example claims are refused here
    text = out.getvalue()
    assert "XID 48 injected on gpu-0-mig-" in text
    assert "... (25 devices in all)" in text  # every MIG device of the GPU is tainted
    assert "GPU reset seen: gpu-0-mig-" in text and "device taints published: none" in text
