"""hack/bench/controller.py's quick mode end to end: the fake API server's process, the
``dra-driver controller`` process over HTTPS, 30 claims on 5 nodes as a burst and as a
stream; every figure is printed and every claim is allocated."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.tls import openssl_missing

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
BENCH = os.path.join(ROOT, "hack", "bench", "controller.py")
FIELDS = (
    "allocated            30 of 30",
    "claims/s",
    "their Events",
    "latency p50 / p99",
    "requests per claim",
    "PATCH resourceclaims/status",
    "claim writes/claim",
    "controller CPU",
    "controller RSS",
    "synced, before the claims",
    "GPUs used",
    "load average",
)


@pytest.mark.skipif(openssl_missing() is not None, reason=str(openssl_missing()))
def test_quick_mode_allocates_every_claim_and_prints_every_figure(tmp_path: Path) -> None:
    out = tmp_path / "runs.json"
    done = subprocess.run(
        [sys.executable, BENCH, "--quick", "--json", str(out), "--timeout", "60"],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    for mode in ("burst", "stream"):
        (block,) = [b for b in done.stdout.split("\n5 nodes") if f"claims, {mode}" in b]
        for field in FIELDS:
            assert field in block, f"{field!r} not in the {mode} run:\n{done.stdout}"
    runs = json.loads(out.read_text())
    assert [r["mode"] for r in runs] == ["burst", "stream"]
    for run in runs:
        assert run["allocated"] == run["claims"] == 30
        assert run["claims_per_s"] > 0
        # The chart's default: no Allocated Event (refusals and failures only).
        assert run["allocations_done_s"] > 0
        assert run["events_written"] == 0 and run["events_done_s"] is None
        assert 0 < run["p50_s"] <= run["p99_s"]
        assert run["gpus_lower_bound"] <= run["gpus_pairing_bound"] <= run["gpus_used"]
        assert run["requests_per_claim"]["PATCH resourceclaims/status"] >= 1
        assert run["rss_mb"] > 0 and run["ready_rss_mb"] > 0 and run["cpu_ms_per_claim"] > 0
