"""The mps-agent against what NVIDIA documents: a ``namespace list`` line it cannot read
costs that line, not the agent's adoption of a running daemon; a MIG instance's
daemon speaks legacy MPS (v3 namespaces are documented for non-MIG GPUs only) with
its device named by ordinal 0."""

from __future__ import annotations

import asyncio
import logging
import os
import stat
from dataclasses import replace

import pytest

from dra_driver.fakes.mps_control import fake_control_path
from dra_driver.mpsagent.commands import namespace_name, share_cdi_edits
from tests.support.mps import (
    GIB,
    GPU0,
    Node,
    agent_running,
    daemon_pid,
    gpu_dir,
)

MIG0 = "MIG-00000000-aaaa-bbbb-cccc-444444444444"


def odd_listing_binary(root: str) -> str:
    """The fake, except that ``namespace list`` prints two more lines: one that is no
    namespace row at all, one whose percentage is a word."""
    script = os.path.join(root, "odd-listing")
    with open(script, "w") as f:
        f.write(
            "#!/bin/sh\n"
            'if [ "$1 $2" = "namespace list" ]; then\n'
            f'  "{fake_control_path()}" "$@" || exit $?\n'
            "  echo 'this is not a row'\n"
            "  echo 'someone_elses,shares,Ready,1G,lots,0,/x'\n"
            "  exit 0\n"
            "fi\n"
            f'exec "{fake_control_path()}" "$@"\n'
        )
    os.chmod(script, os.stat(script).st_mode | stat.S_IXUSR)
    return script


def test_adoption_survives_a_namespace_list_line_it_cannot_read(
    v3_node: Node, caplog: pytest.LogCaptureFixture
) -> None:
    node = v3_node
    # One process per command (the default; explicit so that the listing goes
    # through the odd binary's command line whatever the default).
    live = replace(node.config, stop_daemons_on_exit=False, control_channel=False)

    async def scenario() -> int:
        async with agent_running(live):
            client = node.client()
            await client.ensure_share(
                GPU0, "share-p", claim_uid="claim-p", memory_limit_bytes=GIB,
                active_thread_percentage=40,
            )  # fmt: skip
            pid = await daemon_pid(client, GPU0)
            assert pid is not None
        # The next agent lists the running daemon's namespaces through the odd binary.
        odd = replace(live, control_binary=odd_listing_binary(node.root))
        async with agent_running(odd):
            client = node.client()
            assert await daemon_pid(client, GPU0) == pid  # adopted, not restarted
            (share,) = await client.list_shares()
            assert share.namespace == namespace_name("share-p")
        return pid

    with caplog.at_level(logging.WARNING, logger="dra_driver.mpsagent.daemon_shares"):
        pid = asyncio.run(scenario())
    os.kill(pid, 9)
    warnings = [r.getMessage() for r in caplog.records if "namespace list" in r.getMessage()]
    assert any("'this is not a row'" in w and "at least 5" in w for w in warnings), warnings
    assert any("'lots' is not a percentage" in w for w in warnings), warnings
    # The namespace with the odd cell was someone else's: left alone, not deleted.
    state = node.fake_state(GPU0)
    assert set(state["servers"]["shares"]["namespaces"]) == {namespace_name("share-p")}


def test_a_mig_instances_daemon_speaks_legacy_under_a_v3_agent(v3_node: Node) -> None:
    node = v3_node

    async def scenario() -> None:
        async with agent_running(node.config):
            client = node.client()
            share = await client.ensure_share(
                MIG0, "share-m", claim_uid="claim-m", memory_limit_bytes=2 * GIB,
                active_thread_percentage=30,
            )  # fmt: skip
            gpu = await client.ensure_share(
                GPU0, "share-g", claim_uid="claim-g", memory_limit_bytes=GIB,
                active_thread_percentage=20,
            )  # fmt: skip
            assert (share.protocol, share.namespace) == ("legacy", None)
            assert share.pipe_dir == os.path.join(gpu_dir(node.config.state_dir, MIG0), "pipe")
            assert gpu.protocol == "v3" and gpu.namespace == namespace_name("share-g")
            assert node.fake_state(MIG0)["protocol"] == 2
            assert node.fake_state(GPU0)["protocol"] == 3
            # Per-device limits name the instance as its clients see it: ordinal 0.
            legacy = node.fake_state(MIG0)["legacy"]
            assert legacy["default_mem"] == {"0": "2048M"} and legacy["default_pct"] == 30
            assert "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=2048M" in share_cdi_edits(share).env
            start = next(r for r in node.records(MIG0) if r.get("event") == "start")
            assert start["visible_devices"] == MIG0 and start["protocol"] == 2

    asyncio.run(scenario())
