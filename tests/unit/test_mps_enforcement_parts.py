"""Pure pieces of the MPS enforcement: legacy UID waits, the daemon's shm namespace,
compute-mode parsing, and the agent status fields that carry a UID wait."""

from __future__ import annotations

import json

import pytest

from dra_driver.mpsagent import protocol as wire
from dra_driver.mpsagent.commands import (
    UNSHARE_PRIVATE_MOUNT,
    UidWait,
    describe_uid_wait,
    in_private_shm,
    legacy_uid_wait,
)
from dra_driver.mpsagent.compute_mode import ComputeModeError, parse_mode


def line(text: str, pid: int = 11107) -> str:
    return f"[2026-05-31 23:48:21.671 Control {pid}] {text}"


# The documented control.log forms (docs:appendix-logging), with a real daemon's
# surrounding lines as public transcripts show them.
START = [
    line("Starting control daemon using socket /tmp/nvidia-mps/control"),
    line("To connect CUDA applications to this daemon, set env CUDA_MPS_PIPE_DIRECTORY=/x"),
    line("CUDA MPS Control binary version: 13030"),
]
SERVER_FOR_1000 = [
    line("Accepting connection..."),
    line("User did not send valid credentials"),
    line("NEW CLIENT 0 from user 1000: Server is not ready, push client to pending list"),
    line("Starting new server 11803 for user 1000", pid=11803),
    line("NEW SERVER 11803: Ready"),
]


def log(*lines: str) -> str:
    return "\n".join(lines) + "\n"


def test_a_client_of_another_uid_waits_on_the_running_server() -> None:
    text = log(
        *START,
        *SERVER_FOR_1000,
        line("NEW CLIENT 0 from user 1000: Server already exists"),
        line("NEW CLIENT 0 from user 0: Server is not ready, push client to pending list"),
        line("NEW CLIENT 0 from user 2000: whatever the daemon says"),
        line("NEW CLIENT 0 from user 0: whatever the daemon says"),
    )
    assert legacy_uid_wait(text, [11803]) == UidWait(11803, 1000, (0, 2000))


def test_nothing_waits_when_every_client_has_the_server_uid() -> None:
    text = log(*START, *SERVER_FOR_1000, line("NEW CLIENT 0 from user 1000: Server already exists"))
    assert legacy_uid_wait(text, [11803]) is None


def test_a_switch_of_server_clears_the_earlier_wait() -> None:
    """UID 0 waited; UID 1000's server exited, UID 0's started: its own clients do not wait."""
    text = log(
        *START,
        *SERVER_FOR_1000,
        line("NEW CLIENT 0 from user 0: pending"),
        line("Server 11803 exited with status 0"),
        line("Starting new server 11900 for user 0", pid=11900),
        line("NEW SERVER 11900: Ready"),
    )
    assert legacy_uid_wait(text, [11900]) is None
    # ... and a client of UID 1000 arriving now waits on UID 0's server.
    later = text + log(line("NEW CLIENT 0 from user 1000: pending"))
    assert legacy_uid_wait(later, [11900]) == UidWait(11900, 0, (1000,))


def test_a_client_queued_before_a_switch_still_waits() -> None:
    """UIDs 0 and 2000 queued behind 1000; the daemon switched to 0: 2000 still waits."""
    text = log(
        *START,
        *SERVER_FOR_1000,
        line("NEW CLIENT 0 from user 0: pending"),
        line("NEW CLIENT 0 from user 2000: pending"),
        line("Server 11803 exited with status 0"),
        line("Starting new server 11900 for user 0", pid=11900),
        line("NEW SERVER 11900: Ready"),
    )
    assert legacy_uid_wait(text, [11900]) == UidWait(11900, 0, (2000,))
    # ... until 0's server exits and 2000's starts: nobody waits any more.
    done = text + log(
        line("Server 11900 exited with status 0"),
        line("Starting new server 12000 for user 2000", pid=12000),
    )
    assert legacy_uid_wait(done, [12000]) is None


def test_a_client_served_by_an_earlier_server_does_not_wait() -> None:
    """A client of UID 1000 served by 1000's server (since gone) is history."""
    text = log(
        *START,
        *SERVER_FOR_1000,
        line("NEW CLIENT 1 from user 1000: Server already exists"),
        line("NEW CLIENT 0 from user 0: pending"),
        line("Server 11803 exited with status 0"),
        line("Starting new server 11900 for user 0", pid=11900),
    )
    assert legacy_uid_wait(text, [11900]) is None


def test_only_the_current_daemon_counts() -> None:
    """A restarted daemon appends to the same log: lines before its start are history."""
    old = log(*START, *SERVER_FOR_1000, line("NEW CLIENT 0 from user 0: pending"))
    assert legacy_uid_wait(old + log(*START), [11803]) is None


def test_no_live_server_means_no_wait() -> None:
    text = log(*START, *SERVER_FOR_1000, line("NEW CLIENT 0 from user 0: pending"))
    assert legacy_uid_wait(text, []) is None  # get_server_list names none
    assert legacy_uid_wait(text, [4242]) is None  # a server the log does not name


def test_the_description_names_both_uids_and_the_fix() -> None:
    text = describe_uid_wait(UidWait(11803, 1000, (0, 2000)))
    assert "UID 1000" in text and "UID 0, 2000" in text and "pid 11803" in text
    assert "runAsUser" in text and "MPS v3" in text and "MIG" in text


def test_the_daemon_runs_with_the_gpus_shm_on_dev_shm() -> None:
    argv = in_private_shm(["/usr/bin/nvidia-cuda-mps-control", "-f"], "/run/x/GPU-1/shm")
    assert argv[: len(UNSHARE_PRIVATE_MOUNT)] == list(UNSHARE_PRIVATE_MOUNT)
    assert UNSHARE_PRIVATE_MOUNT == ("unshare", "--mount", "--propagation", "private")
    rest = argv[len(UNSHARE_PRIVATE_MOUNT) :]
    assert rest[:3] == ["--", "sh", "-c"]
    assert 'mount --bind "$1" /dev/shm' in rest[3] and 'exec "$@"' in rest[3]
    assert rest[4:] == ["mps-shm", "/run/x/GPU-1/shm", "/usr/bin/nvidia-cuda-mps-control", "-f"]


@pytest.mark.parametrize(
    ("text", "mode"),
    [
        ("Default\n", "DEFAULT"),
        ("Exclusive_Process", "EXCLUSIVE_PROCESS"),
        ("Prohibited", "PROHIBITED"),
        ("Exclusive_Thread", "EXCLUSIVE_THREAD"),
        ("EXCLUSIVE_PROCESS\n", "EXCLUSIVE_PROCESS"),  # as the daemon stores it
    ],
)
def test_compute_modes_parse(text: str, mode: str) -> None:
    assert parse_mode(text) == mode


def test_an_unknown_compute_mode_is_refused() -> None:
    with pytest.raises(ComputeModeError, match="unknown compute mode 'Shared'"):
        parse_mode("Shared")


def test_status_carries_a_uid_wait_and_reads_an_older_agents_answer() -> None:
    status = wire.AgentStatus(
        wire.PROTOCOL_VERSION,
        "legacy",
        (wire.DaemonStatus("GPU-1", 7, True, 0, 2, server_uid=1000, waiting_uids=(0,)),),
    )
    doc = json.loads(json.dumps(wire.status_to_json(status)))
    assert doc["daemons"][0]["waiting_uids"] == [0]
    assert wire.status_from_json(doc) == status
    older = {
        "version": 1,
        "protocol": "legacy",
        "daemons": [{"gpu_uuid": "GPU-1", "pid": 7, "running": True, "restarts": 0,
                     "shares": 2}],
    }  # fmt: skip
    (daemon,) = wire.status_from_json(older).daemons
    assert (daemon.server_uid, daemon.waiting_uids) == (None, ())
    assert (daemon.namespaces_deleting, daemon.namespace_delete_failures) == (0, 0)


def test_status_carries_the_pending_namespace_deletes() -> None:
    status = wire.AgentStatus(
        wire.PROTOCOL_VERSION,
        "v3",
        (wire.DaemonStatus("GPU-1", 7, True, 0, 2, namespaces_deleting=1,
                           namespace_delete_failures=4),),
    )  # fmt: skip
    doc = json.loads(json.dumps(wire.status_to_json(status)))
    assert (
        doc["daemons"][0]["namespaces_deleting"],
        doc["daemons"][0]["namespace_delete_failures"],
    ) == (1, 4)
    assert wire.status_from_json(doc) == status
