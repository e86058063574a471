"""Node-local state: the checkpoint file, atomic writes and the node lock."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from dra_driver.base.errors import CheckpointCorruptError, CheckpointError
from dra_driver.base.ids import ClaimRef, ClaimUID, DeviceName
from dra_driver.core.prepare import HeldDevice, mps_namespaces, owned_shares
from dra_driver.state.checkpoint import (
    Checkpoint,
    CheckpointClaim,
    CheckpointStore,
    ClaimState,
    Fragments,
    decode,
    encode,
)
from dra_driver.state.files import atomic_write, remove_if_exists, temp_name_for
from dra_driver.state.locks import LockTimeoutError, NodeLock
from tests.support.checkpoint_files import canonical_checksum, with_valid_checksum
from tests.support.planned import admin, exclusive, mig_instance, mig_plan, mps_share, time_sliced

BOOT = "8c1a5f3e-2b4d-4e6f-9a0b-1c2d3e4f5a6b"
UID_A = ClaimUID("aaaaaaaa-0000-4000-8000-000000000001")
UID_B = ClaimUID("bbbbbbbb-0000-4000-8000-000000000002")


def cdi(name: str) -> tuple[str, ...]:
    return (f"k8s.gpu.fractional.dev/claim={name}",)


CLAIM_A = CheckpointClaim(
    ref=ClaimRef("ns", "a", UID_A),
    state=ClaimState.PREPARE_COMPLETED,
    devices=(
        exclusive("gpu-0", gpu="GPU-gpu-0", cdi=cdi("gpu-0")),
        time_sliced("gpu-1", gpu="GPU-gpu-1", share_id="s1", cdi=cdi("gpu-1")),
    ),
    cdi_spec_file=f"/var/run/cdi/k8s.gpu.fractional.dev-claim_{UID_A}.json",
    cdi_spec={"cdiVersion": "0.3.0", "kind": "k8s.gpu.fractional.dev/claim", "devices": []},
)
CLAIM_B = CheckpointClaim(
    ref=ClaimRef("ns", "b", UID_B),
    state=ClaimState.PREPARE_STARTED,
    devices=(
        time_sliced("gpu-1", gpu="GPU-gpu-1", share_id="s2", cdi=cdi("gpu-1")),
        admin("gpu-2", gpu="GPU-gpu-2", cdi=cdi("gpu-2")),
    ),
)
CHECKPOINT = Checkpoint(boot_id=BOOT).with_claim(CLAIM_A).with_claim(CLAIM_B)


# --- encode / decode ----------------------------------------------------------------


@pytest.mark.parametrize(
    "checkpoint",
    [Checkpoint(boot_id=BOOT), Checkpoint(boot_id=BOOT).with_claim(CLAIM_B), CHECKPOINT],
    ids=["empty", "one-claim", "two-claims"],
)
def test_round_trip(checkpoint: Checkpoint) -> None:
    blob = encode(checkpoint)
    assert decode(blob, "cp.json") == checkpoint
    assert encode(decode(blob, "cp.json")) == blob


def test_encoding_is_the_documented_format() -> None:
    doc = json.loads(encode(CHECKPOINT))
    assert doc["kind"] == "FractionalGpuDraCheckpoint"
    assert doc["version"] == 2
    assert doc["data"]["bootId"] == BOOT
    assert set(doc["data"]["claims"]) == {UID_A, UID_B}
    assert doc["checksum"] == canonical_checksum(doc["data"])


def test_kept_fragments_give_the_same_bytes_as_a_fresh_encoding() -> None:
    fragments = Fragments()
    assert encode(CHECKPOINT, fragments) == encode(CHECKPOINT)
    changed = CHECKPOINT.with_claim(dataclasses.replace(CLAIM_A, cdi_spec_file="/cdi/other.json"))
    assert encode(changed, fragments) == encode(changed)
    assert json.loads(encode(changed, fragments))["data"]["claims"][UID_A]["cdiSpecFile"] == (
        "/cdi/other.json"
    )
    dropped = changed.without(CLAIM_B.ref.uid)
    assert encode(dropped, fragments) == encode(dropped)
    assert fragments.keys() == {UID_A}


def test_encoding_is_deterministic() -> None:
    other_order = Checkpoint(boot_id=BOOT).with_claim(CLAIM_B).with_claim(CLAIM_A)
    assert encode(other_order) == encode(CHECKPOINT)


def test_unknown_fields_are_tolerated() -> None:
    """A newer driver may add fields; a downgraded one must still read the file."""
    doc = json.loads(encode(CHECKPOINT))
    doc["data"]["nodeName"] = "node-a"
    doc["data"]["claims"][UID_A]["preparedAt"] = "2026-11-29T10:00:00Z"
    doc["data"]["claims"][UID_A]["devices"][0]["migProfile"] = "1g.10gb"
    doc["annotations"] = {"written-by": "v9"}
    assert decode(with_valid_checksum(doc), "cp.json") == CHECKPOINT


def _edit(doc: dict[str, Any]) -> None:
    doc["data"]["claims"][UID_A]["devices"][0]["deviceName"] = "gpu-7"


CORRUPT_CASES = [
    pytest.param(b"{not json", "not valid JSON", id="not-json"),
    pytest.param(b"", "not valid JSON", id="empty-file"),
    pytest.param(encode(CHECKPOINT)[:-40], "not valid JSON", id="truncated"),
    pytest.param(b"[1, 2]", "not a FractionalGpuDraCheckpoint", id="not-an-object"),
    pytest.param(
        json.dumps({"kind": "Other", "version": 1, "data": {}}).encode(),
        "not a FractionalGpuDraCheckpoint",
        id="wrong-kind",
    ),
    pytest.param(
        json.dumps({"kind": "FractionalGpuDraCheckpoint", "version": 1}).encode(),
        "has no data",
        id="no-data",
    ),
    pytest.param(
        with_valid_checksum(
            {
                "kind": "FractionalGpuDraCheckpoint",
                "version": 1,
                "data": {"bootId": BOOT, "claims": {UID_A: {"state": "PrepareCompleted"}}},
            }
        ),
        "malformed entry",
        id="entry-without-ref",
    ),
    pytest.param(
        with_valid_checksum(
            {
                "kind": "FractionalGpuDraCheckpoint",
                "version": 1,
                "data": {
                    "bootId": BOOT,
                    "claims": {
                        UID_A: {"namespace": "n", "name": "a", "uid": UID_A, "state": "Bogus"}
                    },
                },
            }
        ),
        "malformed entry",
        id="unknown-state",
    ),
]


@pytest.mark.parametrize(("blob", "fragment"), CORRUPT_CASES)
def test_corrupt(blob: bytes, fragment: str) -> None:
    with pytest.raises(CheckpointCorruptError) as info:
        decode(blob, "/plugin/checkpoint.json")
    message = str(info.value)
    assert fragment in message
    assert "/plugin/checkpoint.json" in message
    assert "move /plugin/checkpoint.json aside and restart the plugin" in message


@pytest.mark.parametrize(
    "data",
    [
        {"bootId": BOOT, "claims": ["x"]},
        {
            "bootId": BOOT,
            "claims": {
                UID_A: {
                    "namespace": "n",
                    "name": "a",
                    "uid": UID_A,
                    "state": "PrepareCompleted",
                    "devices": ["gpu-0"],
                }
            },
        },
    ],
    ids=["claims-a-list", "device-a-string"],
)
def test_schema_errors_are_corrupt_errors(data: dict[str, Any]) -> None:
    blob = with_valid_checksum({"kind": "FractionalGpuDraCheckpoint", "version": 1, "data": data})
    with pytest.raises(CheckpointCorruptError):
        decode(blob, "cp.json")


def test_a_version_from_a_later_release_is_refused() -> None:
    doc = json.loads(encode(CHECKPOINT))
    doc["version"] = 3
    with pytest.raises(CheckpointError) as info:
        decode(with_valid_checksum(doc), "/plugin/checkpoint.json")
    # Not corruption: a later release wrote it, and the message says so and what to do.
    assert not isinstance(info.value, CheckpointCorruptError)
    message = str(info.value)
    assert "version 3" in message
    assert "reads versions 1, 2" in message
    assert "/plugin/checkpoint.json" in message
    assert "a later driver release: run that release again" in message
    assert "move /plugin/checkpoint.json aside and restart the plugin" in message


@pytest.mark.parametrize("version", [0, "2", None], ids=["zero", "a-string", "none"])
def test_a_version_no_release_wrote_is_refused(version: object) -> None:
    doc = json.loads(encode(CHECKPOINT))
    doc["version"] = version
    with pytest.raises(CheckpointError) as info:
        decode(with_valid_checksum(doc), "/plugin/checkpoint.json")
    assert f"version {version!r}" in str(info.value)
    assert "later driver release" not in str(info.value)
    assert "move /plugin/checkpoint.json aside" in str(info.value)


# --- the store ------------------------------------------------------------------------


def store(tmp_path: Path, boot_id: str = BOOT) -> CheckpointStore:
    return CheckpointStore(str(tmp_path / "checkpoint.json"), boot_id)


def test_missing_file_is_an_empty_checkpoint(tmp_path: Path) -> None:
    assert store(tmp_path).load() == Checkpoint(boot_id=BOOT)


def test_save_then_load(tmp_path: Path) -> None:
    store(tmp_path).save(CHECKPOINT)
    # A fresh store (another process, a restart) reads the same thing.
    assert store(tmp_path).load() == CHECKPOINT


def test_save_is_atomic_and_private(tmp_path: Path) -> None:
    s = store(tmp_path)
    s.save(Checkpoint(boot_id=BOOT))
    s.save(CHECKPOINT)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint.json"]
    assert stat.S_IMODE(os.stat(s.path).st_mode) == 0o600
    assert Path(s.path).read_bytes() == encode(CHECKPOINT)


def test_load_sees_writes_of_another_store(tmp_path: Path) -> None:
    mine, theirs = store(tmp_path), store(tmp_path)
    mine.save(CHECKPOINT)
    assert mine.load() == CHECKPOINT
    theirs.save(CHECKPOINT.without(UID_A))
    assert mine.load() == CHECKPOINT.without(UID_A)


def test_other_boot_is_not_trusted(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    previous = Checkpoint(boot_id="previous-boot").with_claim(CLAIM_A)
    store(tmp_path, boot_id="previous-boot").save(previous)
    with caplog.at_level(logging.WARNING):
        loaded = store(tmp_path).load()
    assert loaded == Checkpoint(boot_id=BOOT)
    assert "another boot" in caplog.text


def test_corrupt_file_names_the_file(tmp_path: Path) -> None:
    s = store(tmp_path)
    s.save(CHECKPOINT)
    path = Path(s.path)
    blob = path.read_bytes()
    # Flip one character inside data (a device name); the JSON stays valid.
    assert blob.count(b'"gpu-0"') == 1
    path.write_bytes(blob.replace(b'"gpu-0"', b'"gpu-9"'))
    with pytest.raises(CheckpointCorruptError) as info:
        store(tmp_path).load()
    assert "checksum" in str(info.value)
    assert f"move {path} aside and restart the plugin" in str(info.value)


def test_unreadable_path_is_checkpoint_error(tmp_path: Path) -> None:
    (tmp_path / "checkpoint.json").mkdir()
    with pytest.raises(CheckpointError, match="cannot read checkpoint"):
        store(tmp_path).load()


def test_device_uses() -> None:
    assert CHECKPOINT.device_uses() == {
        DeviceName("gpu-0"): [HeldDevice(UID_A, CLAIM_A.devices[0])],
        DeviceName("gpu-1"): [
            HeldDevice(UID_A, CLAIM_A.devices[1]),
            HeldDevice(UID_B, CLAIM_B.devices[0]),
        ],
        DeviceName("gpu-2"): [HeldDevice(UID_B, CLAIM_B.devices[1])],
    }
    assert Checkpoint(boot_id=BOOT).device_uses() == {}


def test_with_and_without() -> None:
    assert set(CHECKPOINT.claims) == {UID_A, UID_B}
    assert set(CHECKPOINT.without(UID_A).claims) == {UID_B}
    assert set(CHECKPOINT.without(UID_A, UID_B).claims) == set()
    # Immutable: the original is unchanged.
    assert set(CHECKPOINT.claims) == {UID_A, UID_B}


# --- atomic_write ---------------------------------------------------------------------


def test_atomic_write_replaces_content(tmp_path: Path) -> None:
    target = tmp_path / "spec.json"
    atomic_write(str(target), b"old", mode=0o640)
    atomic_write(str(target), b"new" * 100_000, mode=0o640)
    assert target.read_bytes() == b"new" * 100_000
    assert stat.S_IMODE(target.stat().st_mode) == 0o640
    assert [p.name for p in tmp_path.iterdir()] == ["spec.json"]


def test_temp_name_is_hidden_from_spec_scanners(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[str] = []
    real_replace = os.replace

    def recording_replace(src: str, dst: str) -> None:
        seen.append(src)
        assert os.path.exists(src)
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", recording_replace)
    atomic_write(str(tmp_path / "spec.json"), b"x")
    (tmp_name,) = seen
    folder, base = os.path.split(tmp_name)
    assert folder == str(tmp_path)  # same filesystem: the rename is atomic
    assert base.startswith(".spec.json.")
    assert base.endswith(".tmp")
    assert temp_name_for(str(tmp_path / "spec.json")) != tmp_name  # random part


def _boom(*args: object) -> None:
    raise OSError("disk on fire")


@pytest.mark.parametrize("where", ["replace", "fsync", "write"])
def test_atomic_write_failure_leaves_no_temp(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    target = tmp_path / "checkpoint.json"
    target.write_bytes(b"previous")
    fail: Callable[..., Any] = _boom
    monkeypatch.setattr(os, where, fail)
    with pytest.raises(OSError, match="disk on fire"):
        atomic_write(str(target), b"next")
    monkeypatch.undo()
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint.json"]
    assert target.read_bytes() == b"previous"


def test_store_save_failure_is_checkpoint_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = store(tmp_path)
    monkeypatch.setattr(os, "replace", _boom)
    with pytest.raises(CheckpointError, match=r"cannot write checkpoint .*checkpoint\.json"):
        s.save(CHECKPOINT)
    monkeypatch.undo()
    assert list(tmp_path.iterdir()) == []
    # A failed save must not poison the cache: the file is still absent.
    assert s.load() == Checkpoint(boot_id=BOOT)


def test_remove_if_exists(tmp_path: Path) -> None:
    target = tmp_path / "f"
    target.write_text("x")
    assert remove_if_exists(str(target)) is True
    assert not target.exists()
    assert remove_if_exists(str(target)) is False


# --- NodeLock -------------------------------------------------------------------------


def test_second_lock_waits_for_the_first(tmp_path: Path) -> None:
    """Two NodeLocks = two open file descriptions = what two plugin processes see."""
    path = str(tmp_path / "serialize.lock")
    events: list[str] = []

    async def scenario() -> None:
        first, second = NodeLock(path, timeout=5), NodeLock(path, timeout=5)
        held = asyncio.Event()

        async def holder() -> None:
            async with first.hold():
                events.append("first acquired")
                held.set()
                await asyncio.sleep(0.1)
                events.append("first releasing")

        async def waiter() -> None:
            await held.wait()
            async with second.hold():
                events.append("second acquired")

        try:
            await asyncio.gather(holder(), waiter())
        finally:
            first.close()
            second.close()

    asyncio.run(scenario())
    assert events == ["first acquired", "first releasing", "second acquired"]


def test_same_lock_serialises_tasks(tmp_path: Path) -> None:
    events: list[str] = []

    async def scenario() -> None:
        lock = NodeLock(str(tmp_path / "serialize.lock"))

        async def worker(name: str) -> None:
            async with lock.hold():
                events.append(f"{name} in")
                await asyncio.sleep(0.02)
                events.append(f"{name} out")

        try:
            await asyncio.gather(worker("a"), worker("b"))
        finally:
            lock.close()

    asyncio.run(scenario())
    assert events == ["a in", "a out", "b in", "b out"]


def test_lock_timeout(tmp_path: Path) -> None:
    path = str(tmp_path / "serialize.lock")

    async def scenario() -> None:
        first, second = NodeLock(path), NodeLock(path, timeout=0.05)
        try:
            async with first.hold():
                with pytest.raises(LockTimeoutError, match=r"serialize\.lock") as info:
                    async with second.hold():
                        pytest.fail("acquired a lock held by someone else")
                assert path in str(info.value)
            # Released: now it is free for the second one.
            async with second.hold():
                pass
        finally:
            first.close()
            second.close()

    asyncio.run(scenario())


def test_limits_and_mig_plans_round_trip() -> None:
    mps = mps_share(
        "gpu-0", gpu="GPU-1", share_id="4f2a", memory_bytes=10 * 2**30, compute_percent=25,
        cdi=("k/claim=x",),
    )  # fmt: skip
    mig = mig_instance(
        "gpu-1-mig-1g10gb-19-3", gpu="GPU-1", cdi=("k/claim=x",),
        mig=mig_plan(19, "1g.10gb", 3, 1, uuid="MIG-abc", gi_id=2, ci_id=0),
    )  # fmt: skip
    checkpoint = Checkpoint(
        boot_id=BOOT,
        claims={UID_A: CheckpointClaim(ref=ClaimRef("n", "a", UID_A),
                                       state=ClaimState.PREPARE_COMPLETED, devices=(mps, mig))},
    )  # fmt: skip
    assert decode(encode(checkpoint), "cp.json") == checkpoint
    uses = checkpoint.device_uses()
    assert uses[DeviceName("gpu-0")] == [HeldDevice(UID_A, mps)]


# A checkpoint as written before the MPS namespaces moved into core/prepare
# (commit 07c48a9): the format did not change; its devices still give the
# namespaces the engine releases (recomputed, never recorded).
BEFORE_MPS_NAMESPACES = """
{
 "checksum": "sha256:c116754ba06b07a41fa476976bd5124aaf9fa56cfc1cccb2e67c7741d4a87aa4",
 "data": {
  "bootId": "boot",
  "claims": {
   "uid-1": {
    "cdiSpec": null,
    "cdiSpecFile": "/cdi/x.json",
    "devices": [
     {
      "cdiDeviceIDs": [
       "k8s.gpu.fractional.dev/claim=u-gpu-0"
      ],
      "deviceName": "gpu-0",
      "gpuUUID": "GPU-2ad1e3bc-8320-5c36-9778-88e8c4fbdb0a",
      "limits": {
       "computePercent": 25,
       "memoryBytes": 1073741824
      },
      "mig": null,
      "mode": "mps",
      "poolName": "node-a",
      "requestNames": [
       "gpu"
      ],
      "shareID": "s2"
     },
     {
      "cdiDeviceIDs": [
       "k8s.gpu.fractional.dev/claim=u-gpu-0"
      ],
      "deviceName": "gpu-0",
      "gpuUUID": "GPU-2ad1e3bc-8320-5c36-9778-88e8c4fbdb0a",
      "limits": {
       "computePercent": 50,
       "memoryBytes": 2147483648
      },
      "mig": null,
      "mode": "mps",
      "poolName": "node-a",
      "requestNames": [
       "gpu"
      ],
      "shareID": "s1"
     },
     {
      "cdiDeviceIDs": [
       "k8s.gpu.fractional.dev/claim=u-gpu-3-mig-1g10gb-19-1"
      ],
      "deviceName": "gpu-3-mig-1g10gb-19-1",
      "gpuUUID": "GPU-2ad1e3bc-8320-5c36-9778-88e8c4fbdb0a",
      "limits": {
       "computePercent": 30,
       "memoryBytes": 1073741824
      },
      "mig": {
       "ciID": 0,
       "created": true,
       "giID": 13,
       "migUUID": "MIG-a2df5fd2-c5c6-5c84-9803-852fc27d9a9d",
       "placementSize": 1,
       "placementStart": 1,
       "profileID": 19,
       "profileName": "1g.10gb"
      },
      "mode": "mps",
      "poolName": "node-a",
      "requestNames": [
       "gpu"
      ],
      "shareID": "m1"
     }
    ],
    "name": "c",
    "namespace": "default",
    "state": "PrepareCompleted",
    "uid": "uid-1"
   },
   "uid-2": {
    "cdiSpec": null,
    "cdiSpecFile": "/cdi/y.json",
    "devices": [
     {
      "cdiDeviceIDs": [
       "k8s.gpu.fractional.dev/claim=u-gpu-0"
      ],
      "deviceName": "gpu-0",
      "gpuUUID": "GPU-2ad1e3bc-8320-5c36-9778-88e8c4fbdb0a",
      "grantShareID": "g1",
      "limits": {
       "computePercent": 0,
       "memoryBytes": 1073741824
      },
      "mig": null,
      "mode": "mps",
      "poolName": "node-a",
      "requestNames": [
       "gpu"
      ],
      "shareID": null
     }
    ],
    "name": "g",
    "namespace": "default",
    "state": "PrepareCompleted",
    "uid": "uid-2"
   }
  }
 },
 "kind": "FractionalGpuDraCheckpoint",
 "version": 1
}
"""


def test_a_checkpoint_of_the_earlier_code_loads_and_gives_its_namespaces() -> None:
    checkpoint = decode(BEFORE_MPS_NAMESPACES.encode(), "checkpoint.json")
    assert sorted(checkpoint.claims) == ["uid-1", "uid-2"]
    devices = checkpoint.claims[ClaimUID("uid-1")].devices
    gpu = "GPU-2ad1e3bc-8320-5c36-9778-88e8c4fbdb0a"
    mig = "MIG-a2df5fd2-c5c6-5c84-9803-852fc27d9a9d"
    assert owned_shares(devices) == [(gpu, "s1"), (mig, "m1")]
    whole, inside = mps_namespaces(devices)
    assert (whole.memory_limit_bytes, whole.active_thread_percentage) == (3 * 2**30, 75)
    assert (inside.daemon_uuid, inside.memory_limit_bytes) == (mig, 2**30)
    granted = checkpoint.claims[ClaimUID("uid-2")].devices
    assert owned_shares(granted) == [(gpu, "g1")]
    assert mps_namespaces(granted)[0].active_thread_percentage == 100


def test_the_store_says_whether_its_file_exists(tmp_path: Path) -> None:
    s = store(tmp_path)
    assert not s.exists()
    s.save(CHECKPOINT)
    assert s.exists()
