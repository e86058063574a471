"""Pure MPS command rendering and parsing, and the plugin <-> agent wire format."""

from __future__ import annotations

import json
import re

import pytest

from dra_driver.mpsagent import commands as cmd
from dra_driver.mpsagent import listing
from dra_driver.mpsagent import protocol as wire
from dra_driver.mpsagent.commands import ControlCall, ShareLimits

GPU = "GPU-5ed1b7c8-0000-1111-2222-333344445555"
MIG = "MIG-1b2c3d4e-0000-1111-2222-333344445555"
SHARE = "7d3f52c1-9b1e-4a57-8d8e-2f0c6f1a9b10"
GIB = 1 << 30


@pytest.mark.parametrize(
    "share_id", [SHARE, "ABC.def", "x" * 128], ids=["k8s-uid", "mixed-case-dots", "longest-id"]
)
def test_namespace_name_is_short_fixed_and_valid(share_id: str) -> None:
    # Fixed length whatever the share id, so the namespace socket fits (finding 1).
    name = cmd.namespace_name(share_id)
    assert re.fullmatch(r"s_[0-9a-f]{12}", name)
    assert name == cmd.namespace_name(share_id)  # derived, not random
    assert name != cmd.namespace_name(share_id + "x")


@pytest.mark.parametrize(
    ("limit", "value"),
    [(GIB, "1024M"), (10 * GIB + 123, "10240M"), (1 << 20, "1M"), ((3 << 20) - 1, "2M")],
    ids=["1GiB", "rounded-down", "1MiB", "just-below-3MiB"],
)
def test_memory_limit_value_never_exceeds_the_grant(limit: int, value: str) -> None:
    assert cmd.memory_limit_value(limit) == value
    assert listing.parse_memory_limit(value) <= limit


def test_memory_limit_below_one_mib_is_refused() -> None:
    with pytest.raises(ValueError, match="below 1 MiB"):
        cmd.memory_limit_value(1000)


@pytest.mark.parametrize(
    ("setting", "driver", "expected"),
    [
        ("v3", None, "v3"),
        ("legacy", "620.10", "legacy"),
        ("auto", "615.01.02", "v3"),
        ("auto", "620.1", "v3"),
        ("auto", "580.95.05", "legacy"),
        ("auto", None, "legacy"),
    ],
)
def test_choose_protocol(setting: str, driver: str | None, expected: str) -> None:
    assert cmd.choose_protocol(setting, driver) == expected


@pytest.mark.parametrize(
    ("agent", "uuid", "expected"),
    [
        ("v3", GPU, "v3"),
        ("v3", MIG, "legacy"),
        ("legacy", GPU, "legacy"),
        ("legacy", MIG, "legacy"),
    ],
    ids=["gpu-v3", "mig-under-v3", "gpu-legacy", "mig-legacy"],
)
def test_a_mig_instances_daemon_speaks_legacy(agent: str, uuid: str, expected: str) -> None:
    # v3 namespaces are documented for non-MIG GPUs only (Dynamo: "MIG disabled").
    assert cmd.daemon_protocol("v3" if agent == "v3" else "legacy", uuid) == expected


def test_choose_protocol_rejects_unknown() -> None:
    with pytest.raises(ValueError, match="v3, legacy, auto"):
        cmd.choose_protocol("v4", None)


def test_daemon_args_and_env() -> None:
    assert cmd.daemon_args("v3") == ("-f", "-p", "3", "-m")
    assert cmd.daemon_args("legacy") == ("-f",)
    base = {"PATH": "/bin", "CUDA_VISIBLE_DEVICES": "0,1", "CUDA_MPS_PROTOCOL_VERSION": "3"}
    env = cmd.daemon_env(base, GPU, "/s/pipe", "/s/log", "legacy")
    assert env == {
        "PATH": "/bin",
        "CUDA_VISIBLE_DEVICES": GPU,
        "CUDA_MPS_PIPE_DIRECTORY": "/s/pipe",
        "CUDA_MPS_LOG_DIRECTORY": "/s/log",
    }
    assert cmd.daemon_env(base, GPU, "/p", "/l", "v3")["CUDA_MPS_PROTOCOL_VERSION"] == "3"


LIMITS = ShareLimits(SHARE, 10 * GIB, 25)
NS = cmd.namespace_name(SHARE)


@pytest.mark.parametrize(
    ("call", "args", "stdin"),
    [
        (cmd.v3_server_create(), ("server", "create", "shares"), None),
        (cmd.v3_namespace_create(NS), ("namespace", "create", NS, "--server=shares"), None),
        (
            cmd.v3_namespace_set(LIMITS),
            (
                "namespace",
                "set",
                NS,
                "--server=shares",
                "--pinned-memory-limit=10240M",
                "--active-thread-percentage=25",
            ),
            None,
        ),
        (
            cmd.v3_namespace_delete(NS),
            ("namespace", "delete", NS, "--server=shares", "--force"),
            None,
        ),
        (
            cmd.v3_namespace_list(),
            ("namespace", "list", "--server=shares", "--format=csv,noheader"),
            None,
        ),
        (cmd.quit_call("v3"), ("-q",), None),
        (cmd.quit_call("legacy"), (), "quit\n"),
        (cmd.probe_call("legacy"), (), "get_server_list\n"),
    ],
    ids=[
        "server-create",
        "ns-create",
        "ns-set",
        "ns-delete",
        "ns-list",
        "quit-v3",
        "quit-legacy",
        "probe-legacy",
    ],
)
def test_command_forms(call: ControlCall, args: tuple[str, ...], stdin: str | None) -> None:
    assert call.args == args
    assert call.stdin == stdin


def test_v3_apply_creates_only_when_missing() -> None:
    assert [c.args[:2] for c in cmd.render_v3_apply(LIMITS, namespace_exists=False)] == [
        ("namespace", "create"),
        ("namespace", "set"),
    ]
    assert [c.args[:2] for c in cmd.render_v3_apply(LIMITS, namespace_exists=True)] == [
        ("namespace", "set")
    ]


def test_v3_restore_on_a_fresh_daemon_and_on_an_adopted_one() -> None:
    other = ShareLimits("b", GIB, 50)
    nb = cmd.namespace_name("b")
    fresh = [str(c) for c in cmd.render_v3_restore([LIMITS, other], [], server_exists=False)]
    per_namespace = {
        NS: [
            f"namespace create {NS} --server=shares",
            f"namespace set {NS} --server=shares --pinned-memory-limit=10240M "
            "--active-thread-percentage=25",
        ],
        nb: [
            f"namespace create {nb} --server=shares",
            f"namespace set {nb} --server=shares --pinned-memory-limit=1024M "
            "--active-thread-percentage=50",
        ],
    }
    assert fresh == [
        "server create shares",
        *(c for n in sorted(per_namespace) for c in per_namespace[n]),
    ]
    # An adopted daemon's namespaces of ours that no share holds go, also those named
    # by an earlier agent (s_<share id>); others (no s_ prefix) stay.
    adopted = cmd.render_v3_restore(
        [other], ["default", nb, "s_7d3f52c1_9b1e_4a57_8d8e_2f0c6f1a9b10", "theirs"],
        server_exists=True,
    )  # fmt: skip
    assert [str(c) for c in adopted] == [
        f"namespace set {nb} --server=shares --pinned-memory-limit=1024M "
        "--active-thread-percentage=50",
        "namespace delete s_7d3f52c1_9b1e_4a57_8d8e_2f0c6f1a9b10 --server=shares --force",
    ]


def test_legacy_apply_uses_the_largest_share_for_defaults_and_running_servers() -> None:
    shares = [ShareLimits("a", 4 * GIB, 25), ShareLimits("b", 2 * GIB, 60)]
    calls = cmd.render_legacy_apply(GPU, shares, server_pids=[4242])
    assert [c.stdin for c in calls] == [
        "set_default_active_thread_percentage 60\n",
        f"set_default_device_pinned_mem_limit {GPU} 4096M\n",
        "set_active_thread_percentage 4242 60\n",
        f"set_device_pinned_mem_limit 4242 {GPU} 4096M\n",
    ]
    assert all(not c.args for c in calls)
    assert cmd.render_legacy_apply(GPU, [], [4242]) == []


def test_legacy_server_list() -> None:
    assert cmd.parse_legacy_server_list("4242\n4343\n") == [4242, 4343]
    assert cmd.parse_legacy_server_list("") == []


@pytest.mark.parametrize(
    ("rc", "out", "err", "expected"),
    [
        (0, "", "", None),
        (0, "60\n", "", None),
        (1, "", "Error: server 'x' not found\n", "Error: server 'x' not found"),
        (0, "Invalid value\n", "", "Invalid value"),
        (2, "", "", "exit status 2"),
    ],
)
def test_reply_error(rc: int, out: str, err: str, expected: str | None) -> None:
    assert cmd.reply_error(rc, out, err) == expected


def _share(protocol: wire.MpsProtocol) -> wire.ShareInfo:
    return wire.ShareInfo(
        gpu_uuid=GPU,
        share_id=SHARE,
        claim_uid="claim-1",
        memory_limit_bytes=10 * GIB,
        active_thread_percentage=25,
        uid=None,
        protocol=protocol,
        namespace=NS if protocol == "v3" else None,
        pipe_dir=f"/st/{GPU}/pipe/shares/{NS}" if protocol == "v3" else f"/st/{GPU}/pipe",
        shm_dir=f"/st/{GPU}/shm",
    )


def test_share_cdi_edits_v3_has_no_client_side_caps() -> None:
    edits = cmd.share_cdi_edits(_share("v3"))
    # The pipe directory at its host path, as NVIDIA's guide mounts it (finding 8).
    pipe = f"/st/{GPU}/pipe/shares/{NS}"
    assert edits.env == (f"CUDA_MPS_PIPE_DIRECTORY={pipe}",)
    # Only the namespace's directory: the container keeps its own /dev/shm, so no
    # claim's container sees another claim's POSIX shared memory (the Dynamo guide's
    # verified v3 container mounts nothing else).
    assert edits.mounts == (cmd.MpsMount(pipe, pipe),)


def test_legacy_limits_name_a_mig_instance_by_ordinal_0() -> None:
    """Inside a MIG instance's daemon (CUDA_VISIBLE_DEVICES=MIG-<uuid>) its clients see
    the instance as device 0 (env-var appendix); a MIG UUID key is documented nowhere."""
    calls = cmd.render_legacy_apply(MIG, [ShareLimits("a", 2 * GIB, 30)], server_pids=[77])
    assert [c.stdin for c in calls] == [
        "set_default_active_thread_percentage 30\n",
        "set_default_device_pinned_mem_limit 0 2048M\n",
        "set_active_thread_percentage 77 30\n",
        "set_device_pinned_mem_limit 77 0 2048M\n",
    ]
    assert all(MIG not in (c.stdin or "") for c in calls)
    assert cmd.legacy_client_env(MIG, 2 * GIB, 30) == (
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=2048M",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=30",
    )
    assert cmd.legacy_device_key(GPU) == GPU


def test_share_cdi_edits_legacy_caps_through_env() -> None:
    edits = cmd.share_cdi_edits(_share("legacy"))
    assert edits.env == (
        f"CUDA_MPS_PIPE_DIRECTORY=/st/{GPU}/pipe",
        f"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT={GPU}=10240M",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25",
    )
    # Legacy clients still get their daemon's shm, as NVIDIA's device plugin and DRA
    # driver give them (issue 33: what a legacy daemon may serve is still open).
    assert edits.mounts == (
        cmd.MpsMount(f"/st/{GPU}/pipe", f"/st/{GPU}/pipe"),
        cmd.MpsMount(f"/st/{GPU}/shm", "/dev/shm"),
    )


# -- wire format ----------------------------------------------------------------------

ENSURE = wire.EnsureShare(GPU, SHARE, "claim-1", 10 * GIB, 25)


@pytest.mark.parametrize(
    "request_",
    [
        ENSURE,
        wire.EnsureShare(GPU, SHARE, "c", 1 << 20, 100, uid=1000),
        wire.ReleaseShare(GPU, SHARE),
        wire.ListShares(),
        wire.StatusRequest(),
    ],
    ids=["ensure", "ensure-uid", "release", "list", "status"],
)
def test_requests_round_trip(request_: wire.Request) -> None:
    line = wire.encode_request(request_)
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    assert wire.parse_request(line) == request_


def _ensure_doc(**changes: object) -> bytes:
    doc = json.loads(wire.encode_request(ENSURE))
    for key, value in changes.items():
        if key in ("v", "op", "extra"):
            doc[key] = value
        elif value is None:
            del doc["args"][key]
        else:
            doc["args"][key] = value
    return json.dumps(doc).encode()


@pytest.mark.parametrize(
    ("line", "kind", "match"),
    [
        (b"not json", "invalid_request", "not JSON"),
        (b"[1]", "invalid_request", "JSON object"),
        (_ensure_doc(v=2), "unsupported_version", "version 2"),
        (_ensure_doc(v=True), "unsupported_version", "version True"),
        (_ensure_doc(op="explode"), "invalid_request", "unknown op 'explode'"),
        (_ensure_doc(extra=1), "invalid_request", r"unknown field\(s\) \['extra'\]"),
        (_ensure_doc(memory_limit_bytes=None), "invalid_request", "missing field"),
        (_ensure_doc(memory_limit=5), "invalid_request", "unknown field"),
        (_ensure_doc(memory_limit_bytes=1000), "invalid_request", "at least 1048576"),
        (_ensure_doc(memory_limit_bytes="1G"), "invalid_request", "must be an integer"),
        (_ensure_doc(active_thread_percentage=0), "invalid_request", "between 1 and 100"),
        (_ensure_doc(active_thread_percentage=True), "invalid_request", "integer"),
        (_ensure_doc(gpu_uuid="../etc"), "invalid_request", "gpu_uuid must match"),
        (_ensure_doc(uid=-1), "invalid_request", "uid must be between"),
        (b'{"v":1,"op":"status","args":{"x":1}}', "invalid_request", "unknown field"),
        (b"x" * (wire.MAX_LINE_BYTES + 1), "invalid_request", "longer than"),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_bad_requests_are_refused_with_a_reason(line: bytes, kind: str, match: str) -> None:
    with pytest.raises(wire.ProtocolError, match=match) as info:
        wire.parse_request(line)
    assert info.value.kind == kind


def test_responses() -> None:
    assert wire.parse_response(wire.encode_result({"released": True})) == {"released": True}
    err = wire.parse_response(wire.encode_error("conflict", "taken"))
    assert err == wire.ErrorReply("conflict", "taken")
    with pytest.raises(wire.ProtocolError):
        wire.parse_response(b'{"v":1}')
    share = _share("v3")
    # Lenient reading: a newer agent's extra keys are ignored.
    assert wire.share_from_json({**wire.share_to_json(share), "new": 1}) == share
    status = wire.AgentStatus(1, "legacy", (wire.DaemonStatus(GPU, 12, True, 0, 2),))
    assert wire.status_from_json(wire.status_to_json(status)) == status
