"""DaemonShares.apply never leaves an MPS v3 namespace without its limits.

"A namespace that sets no limits gets the whole GPU" (NVIDIA MPS v3 docs): when
``namespace create`` succeeds and ``namespace set`` fails (also on the retry), the
namespace is deleted and the apply fails with what each attempt answered. The
daemon here is a stand-in for :class:`~dra_driver.mpsagent.daemon_control.DaemonControl`
that keeps the server and namespaces a v3 daemon would, answers the documented
listings, and refuses ``namespace set`` while told to.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import cast

import pytest

from dra_driver.mpsagent import commands as cmd
from dra_driver.mpsagent.commands import ControlCall, ShareLimits
from dra_driver.mpsagent.daemon_control import DaemonControl
from dra_driver.mpsagent.daemon_files import DaemonError
from dra_driver.mpsagent.daemon_shares import DaemonShares

GPU = "GPU-11111111-2222-3333-4444-555555555555"


class V3Daemon:
    """The control surface DaemonShares uses, over a v3 daemon's state in memory."""

    gpu_uuid = GPU
    protocol = "v3"

    def __init__(self, *, refuse_set: bool = False, refuse_delete: bool = False) -> None:
        self.servers: set[str] = set()
        self.namespaces: dict[str, str | None] = {}
        """name -> its limits as set (None: created, no limits)."""
        self.refuse_set = refuse_set
        self.refuse_delete = refuse_delete
        self.calls: list[str] = []

    async def run(self, call: ControlCall) -> str:
        self.calls.append(str(call))
        verb = call.args[:2]
        name = call.args[2] if len(call.args) > 2 else ""
        if verb == ("server", "list"):
            return "".join(f"{s},0,4242,ACTIVE\n" for s in sorted(self.servers))
        if verb == ("server", "create"):
            self.servers.add(cmd.SERVER_NAME)
            return ""
        if verb == ("namespace", "list"):
            return "".join(
                f"{n},{cmd.SERVER_NAME},ACTIVE,{lim or 'UNSET'},{'50' if lim else 'UNSET'}\n"
                for n, lim in sorted(self.namespaces.items())
            )
        if verb == ("namespace", "create"):
            self.namespaces[name] = None
            return f"namespace {name} created\n"
        if verb == ("namespace", "set"):
            if self.refuse_set:
                raise DaemonError(f"GPU {GPU}: `{call}` failed: Error: invalid argument")
            self.namespaces[name] = "1024M"
            return ""
        if verb == ("namespace", "delete"):
            if self.refuse_delete:
                raise DaemonError(f"GPU {GPU}: `{call}` failed: Error: busy")
            del self.namespaces[name]
            return ""
        raise AssertionError(f"unexpected call {call}")

    async def run_all(self, calls: Sequence[ControlCall]) -> list[str]:
        return [await self.run(c) for c in calls]


SHARE = ShareLimits(share_id="share-a", memory_limit_bytes=1 << 30, active_thread_percentage=50)


def shares_of(daemon: V3Daemon, tmp_path: Path) -> DaemonShares:
    return DaemonShares(cast(DaemonControl, daemon), str(tmp_path / "pipe"))


def test_a_set_that_keeps_failing_deletes_the_created_namespace(tmp_path: Path) -> None:
    daemon = V3Daemon(refuse_set=True)
    shares = shares_of(daemon, tmp_path)
    with pytest.raises(DaemonError) as caught:
        asyncio.run(shares.apply(SHARE, [SHARE]))
    assert daemon.namespaces == {}, "a namespace was left without its limits"
    message = str(caught.value)
    assert f"limits of MPS namespace {SHARE.namespace} could not be set" in message
    assert "it was deleted, so no client runs in it without them" in message
    # Both attempts' answers are in the error.
    assert message.count("Error: invalid argument") == 2, message
    assert daemon.calls[-1].startswith(f"namespace delete {SHARE.namespace}")
    assert not (tmp_path / "pipe" / cmd.SERVER_NAME / SHARE.namespace).exists()


def test_a_namespace_that_cannot_be_deleted_either_is_said_to_be_unlimited(
    tmp_path: Path,
) -> None:
    daemon = V3Daemon(refuse_set=True, refuse_delete=True)
    with pytest.raises(DaemonError, match="deleting it failed too, so it may hold no limits"):
        asyncio.run(shares_of(daemon, tmp_path).apply(SHARE, [SHARE]))


def test_a_set_that_works_on_the_retry_keeps_the_namespace(tmp_path: Path) -> None:
    daemon = V3Daemon(refuse_set=True)
    shares = shares_of(daemon, tmp_path)
    original = daemon.run

    async def refuse_once(call: ControlCall) -> str:
        if call.args[:2] == ("namespace", "set") and daemon.refuse_set:
            daemon.refuse_set = False
            daemon.calls.append(str(call))
            raise DaemonError(f"GPU {GPU}: `{call}` failed: Error: try again")
        return await original(call)

    daemon.run = refuse_once  # type: ignore[method-assign]
    asyncio.run(shares.apply(SHARE, [SHARE]))
    assert daemon.namespaces == {SHARE.namespace: "1024M"}
    assert not any(c.startswith("namespace delete") for c in daemon.calls)
