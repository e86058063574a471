"""A checkpoint of format version 1 (one record for every mode), written by the code
before the device model became a tagged union, read as the variants of version 2."""

from __future__ import annotations

import json
import pathlib
from typing import Any

import pytest

from dra_driver.base.errors import CheckpointCorruptError
from dra_driver.base.ids import ClaimRef, ClaimUID
from dra_driver.core.prepare import PlannedDevice
from dra_driver.state.checkpoint import (
    VERSION,
    Checkpoint,
    CheckpointClaim,
    CheckpointStore,
    ClaimState,
    decode,
    encode,
)
from tests.support.checkpoint_files import with_valid_checksum
from tests.support.planned import (
    GIB,
    admin,
    exclusive,
    mig_instance,
    mig_plan,
    mps_in_mig,
    mps_share,
    time_sliced,
)

V1_FILE = pathlib.Path(__file__).parents[1] / "fixtures" / "checkpoint" / "v1.json"
BOOT = "boot-fixture"


def cdi(name: str) -> tuple[str, ...]:
    return (f"k8s.gpu.fractional.dev/claim=x-{name}",)


def uid(n: int) -> ClaimUID:
    return ClaimUID(f"00000000-0000-4000-8000-00000000000{n}")


def claim(n: int, state: ClaimState, *devices: PlannedDevice, spec: bool = True) -> CheckpointClaim:
    return CheckpointClaim(
        ref=ClaimRef("team-a", f"claim-{n}", uid(n)),
        state=state,
        devices=devices,
        cdi_spec_file=f"/var/run/cdi/k8s.gpu.fractional.dev-claim_{uid(n)}.json" if spec else None,
        cdi_spec=(
            {"cdiVersion": "0.5.0", "kind": "k8s.gpu.fractional.dev/claim", "devices": []}
            if spec
            else None
        ),
    )


def mps(name: str, gpu: str, share: str, gib: int, percent: int, **kw: Any) -> PlannedDevice:
    return mps_share(
        name, gpu=gpu, share_id=share, memory_bytes=gib * GIB, compute_percent=percent,
        cdi=cdi(name), **kw,
    )  # fmt: skip


DONE, STARTED = ClaimState.PREPARE_COMPLETED, ClaimState.PREPARE_STARTED
MIG_SHARED = mig_plan(19, "1g.10gb", 1, 1, uuid="MIG-shared", gi_id=5, ci_id=0)
EXPECTED = [
    claim(
        1, DONE,
        exclusive("gpu-0", gpu="GPU-0", cdi=cdi("gpu-0")),
        admin("gpu-1", gpu="GPU-1", requests=("watch", "x"), cdi=cdi("gpu-1")),
    ),
    claim(
        2, DONE,
        time_sliced("gpu-2", gpu="GPU-2", share_id="ts-1", cdi=cdi("gpu-2")),
        time_sliced("gpu-3", gpu="GPU-3", share_id=None, grant="grant-ts", cdi=cdi("gpu-3")),
    ),
    claim(3, DONE, mps("gpu-4", "GPU-4", "s-1", 10, 25), mps("gpu-4", "GPU-4", "s-2", 2, 0)),
    claim(4, DONE, mps_share(
        "gpu-5", gpu="GPU-5", share_id=None, memory_bytes=GIB, compute_percent=50,
        grant="grant-1", cdi=cdi("gpu-5"),
    )),
    claim(
        5, DONE,
        mig_instance(
            "gpu-6-mig-1g10gb-19-0", gpu="GPU-6", cdi=cdi("gpu-6-mig-1g10gb-19-0"),
            mig=mig_plan(19, "1g.10gb", 0, 1, uuid="MIG-existing", gi_id=1, ci_id=0),
        ),
        mig_instance(
            "gpu-6-mig-2g20gb-14-2", gpu="GPU-6", share_id="m-1", cdi=cdi("gpu-6-mig-2g20gb-14-2"),
            mig=mig_plan(14, "2g.20gb", 2, 2, uuid="MIG-made", gi_id=3, ci_id=0, created=True),
        ),
    ),
    claim(6, STARTED, mig_instance(
        "gpu-6-mig-3g40gb-9-4", gpu="GPU-6", cdi=cdi("gpu-6-mig-3g40gb-9-4"),
        mig=mig_plan(9, "3g.40gb", 4, 4),
    ), spec=False),
    claim(7, DONE, mps_in_mig(
        "gpu-7-mig-1g10gb-19-1", gpu="GPU-7", share_id="p-1", memory_bytes=4 * GIB,
        compute_percent=30, cdi=cdi("gpu-7-mig-1g10gb-19-1"),
        mig=mig_plan(19, "1g.10gb", 1, 1, uuid="MIG-shared", gi_id=5, ci_id=0, created=True),
    )),
    claim(8, STARTED, mps_in_mig(
        "gpu-7-mig-1g10gb-19-2", gpu="GPU-7", share_id="p-2", memory_bytes=3 * GIB,
        cdi=cdi("gpu-7-mig-1g10gb-19-2"), mig=mig_plan(19, "1g.10gb", 2, 1),
    ), spec=False),
    claim(9, DONE, admin(
        "gpu-7-mig-1g10gb-19-1", gpu="GPU-7", cdi=cdi("gpu-7-mig-1g10gb-19-1"), mig=MIG_SHARED
    )),
]  # fmt: skip


def test_the_fixture_is_a_version_1_file() -> None:
    doc = json.loads(V1_FILE.read_bytes())
    assert doc["version"] == 1
    modes = {d["mode"] for c in doc["data"]["claims"].values() for d in c["devices"]}
    assert modes == {"exclusive", "shared", "mps", "mig", "admin"}


def test_every_claim_and_device_of_a_version_1_file_comes_back_as_its_variant() -> None:
    checkpoint = decode(V1_FILE.read_bytes(), str(V1_FILE))
    assert checkpoint.boot_id == BOOT
    assert sorted(checkpoint.claims) == [c.ref.uid for c in EXPECTED]
    for expected in EXPECTED:
        got = checkpoint.claims[expected.ref.uid]
        # Type and value: a time-sliced share is TimeSliced, an MPS share with a
        # MIG plan is MpsInMig, and so on (dataclass equality compares the class too).
        assert [type(d) for d in got.devices] == [type(d) for d in expected.devices]
        assert got == expected


def test_a_version_1_file_is_written_back_as_version_2_with_the_same_claims(
    tmp_path: pathlib.Path,
) -> None:
    path = tmp_path / "checkpoint.json"
    path.write_bytes(V1_FILE.read_bytes())
    store = CheckpointStore(str(path), BOOT)
    loaded = store.load()
    store.save(loaded)
    doc = json.loads(path.read_bytes())
    assert doc["version"] == VERSION == 2
    modes = [d["mode"] for c in doc["data"]["claims"].values() for d in c["devices"]]
    assert "timeSliced" in modes
    assert "shared" not in modes
    assert (
        CheckpointStore(str(path), BOOT).load()
        == loaded
        == Checkpoint(BOOT, {c.ref.uid: c for c in EXPECTED})
    )


def _v1_with_device(device: dict[str, Any]) -> bytes:
    doc = json.loads(V1_FILE.read_bytes())
    doc["data"]["claims"][uid(1)]["devices"] = [device]
    return with_valid_checksum(doc)


V1_DEVICE = {"poolName": "node-a", "deviceName": "gpu-0", "gpuUUID": "GPU-0", "shareID": "s"}
MIG_V1 = {"profileID": 19, "profileName": "1g.10gb", "placementStart": 0, "placementSize": 1}


@pytest.mark.parametrize(
    "device",
    [
        {**V1_DEVICE, "mode": "mps", "limits": None, "mig": None},
        {**V1_DEVICE, "mode": "mig", "limits": None, "mig": None},
        {**V1_DEVICE, "mode": "timeSliced"},
        {**V1_DEVICE, "mode": "mig", "mig": {**MIG_V1, "migUUID": "MIG-x", "giID": None}},
    ],
    ids=["mps-without-limits", "mig-without-mig", "a-version-2-mode", "mig-with-half-its-ids"],
)
def test_a_version_1_device_no_release_wrote_fails_its_file(device: dict[str, Any]) -> None:
    with pytest.raises(CheckpointCorruptError, match="malformed entry") as info:
        decode(_v1_with_device(device), "/plugin/checkpoint.json")
    assert "move /plugin/checkpoint.json aside and restart the plugin" in str(info.value)


COMMON = {"requestNames", "poolName", "deviceName", "shareID", "gpuUUID", "cdiDeviceIDs", "mode"}


@pytest.mark.parametrize(
    ("device", "mode", "fields"),
    [
        (EXPECTED[0].devices[0], "exclusive", set()),
        (EXPECTED[0].devices[1], "admin", set()),
        (EXPECTED[8].devices[0], "admin", {"mig"}),
        (EXPECTED[1].devices[0], "timeSliced", set()),
        (EXPECTED[1].devices[1], "timeSliced", {"grantShareID"}),
        (EXPECTED[2].devices[0], "mpsShare", {"limits"}),
        (EXPECTED[3].devices[0], "mpsShare", {"limits", "grantShareID"}),
        (EXPECTED[4].devices[0], "migInstance", {"mig"}),
        (EXPECTED[6].devices[0], "mpsInMig", {"limits", "mig"}),
    ],
    ids=[
        "exclusive", "admin", "admin-of-mig", "time-sliced", "time-sliced-by-grant", "mps",
        "mps-by-grant", "mig", "mps-in-mig",
    ],
)  # fmt: skip
def test_version_2_writes_each_variants_mode_and_only_its_fields(
    device: PlannedDevice, mode: str, fields: set[str]
) -> None:
    entry = claim(1, DONE, device)
    doc = json.loads(encode(Checkpoint(BOOT, {entry.ref.uid: entry})))
    (written,) = doc["data"]["claims"][entry.ref.uid]["devices"]
    assert written["mode"] == mode
    assert set(written) == COMMON | fields


def test_version_2_writes_a_mig_instance_once_it_exists() -> None:
    made, planned = EXPECTED[4].devices[1], EXPECTED[5].devices[0]
    entry = claim(1, DONE, made, planned)
    doc = json.loads(encode(Checkpoint(BOOT, {entry.ref.uid: entry})))
    migs = [d["mig"] for d in doc["data"]["claims"][entry.ref.uid]["devices"]]
    assert migs == [
        {
            "profileID": 14, "profileName": "2g.20gb", "placementStart": 2, "placementSize": 2,
            "created": True, "instance": {"uuid": "MIG-made", "giID": 3, "ciID": 0},
        },
        {"profileID": 9, "profileName": "3g.40gb", "placementStart": 4, "placementSize": 4,
         "created": False},
    ]  # fmt: skip
