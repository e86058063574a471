"""The fake MPS daemon's state in memory (``_DaemonState``): commands run on it in
place (no fresh copy per command, issue 35), so these hold it to what the copy gave:
after every command it is what its state file says, and a refused command leaves
nothing behind, not even what it changed before it was refused."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from dra_driver.fakes import mps_control
from dra_driver.fakes.mps_control import STATE_FILE


def _store(pipe: Path, protocol: int) -> mps_control._DaemonState:
    state: dict[str, Any] = {
        "daemon_pid": os.getpid(), "protocol": protocol, "multiuser": True,
        "static_partitioning": True, "visible_devices": "0", "next_pid": 100000, "servers": {},
        "legacy": {"default_pct": None, "default_mem": {}, "default_priority": 0,
                   "servers": {}, "pending": [], "partitions": {}},
        "shm": [1, 2],
    }  # fmt: skip
    return mps_control._DaemonState(str(pipe), state)


def _on_disk(pipe: Path) -> Any:
    return json.loads((pipe / STATE_FILE).read_text())


V3 = [
    ["server", "create", "shares", "--uid=1000"],
    ["server", "create", "shares"],  # refused after it took a PID
    ["server", "set", "shares", "--pinned-memory-limit=8G"],
    ["namespace", "create", "ns_a", "--server=shares"],
    ["namespace", "set", "ns_a", "--server=shares", "--active-thread-percentage=25"],
    ["namespace", "set", "ns_a", "--server=shares", "--active-thread-percentage=250"],
    ["--fake-client", "connect", "--uid", "1000", "--namespace", "ns_a"],
    ["namespace", "delete", "ns_a", "--server=shares"],  # refused: a client is connected
    ["namespace", "list", "--format=csv"],
    ["namespace", "delete", "ns_a", "--server=shares", "--force"],
    ["server", "create", "other"],
]
LEGACY = [
    "start_server -uid 1000",
    "set_default_device_pinned_mem_limit 0 4G",
    "set_default_active_thread_percentage 30",
    "sm_partition add 0 2",
    "sm_partition add 7 2",  # refused
    "get_server_list",
]


@pytest.mark.parametrize("protocol", [3, 2])
def test_the_state_in_memory_is_the_state_file_after_every_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, protocol: int
) -> None:
    """What a command stores is what JSON gives back (lists, string keys), so running
    the next one on the state in memory is running it on a fresh copy of the file."""
    monkeypatch.setenv("CUDA_MPS_LOG_DIRECTORY", str(tmp_path / "log"))
    (tmp_path / "log").mkdir()
    store = _store(tmp_path, protocol)
    requests: list[dict[str, Any]] = (
        [{"argv": argv} for argv in V3] if protocol == 3 else [{"line": line} for line in LEGACY]
    )
    answers = []
    for request in requests:
        answers.append(store.command(request, 1000)["ok"])
        assert store._state == _on_disk(tmp_path), request
    assert not all(answers) and any(answers)  # refusals and commands that worked


def test_a_refused_command_leaves_nothing_it_changed_before_it_was_refused(
    tmp_path: Path,
) -> None:
    """``server create`` takes a PID before it finds the name taken: the refusal gives
    it back, as a command on a fresh copy did (the next server gets the next PID)."""
    store = _store(tmp_path, 3)
    assert store.command({"argv": ["server", "create", "shares"]}, 0)["ok"]
    before = (tmp_path / STATE_FILE).read_text()
    refused = store.command({"argv": ["server", "create", "shares"]}, 0)
    assert not refused["ok"] and "already exists" in refused["reply"]
    assert (tmp_path / STATE_FILE).read_text() == before
    assert store.command({"argv": ["server", "create", "other"]}, 0)["ok"]
    servers = _on_disk(tmp_path)["servers"]
    assert servers["other"]["pid"] == servers["shares"]["pid"] + 1


def test_a_command_that_raises_leaves_the_state_as_it_was(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bug of the fake (not a refusal) mid-command: the error goes up as before, and the
    state in memory is the file's again."""
    store = _store(tmp_path, 3)
    before = (tmp_path / STATE_FILE).read_text()

    def half_done(state: dict[str, Any], *_: object) -> str:
        state["servers"]["half"] = {}
        raise RuntimeError("a bug")

    monkeypatch.setattr(mps_control, "_execute", half_done)
    with pytest.raises(RuntimeError):
        store.command({"argv": ["server", "create", "half"]}, 0)
    assert store._state == json.loads(before) and "half" not in store._state["servers"]
    assert (tmp_path / STATE_FILE).read_text() == before
