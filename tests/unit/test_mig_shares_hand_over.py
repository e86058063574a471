"""``hand_over``: the last claim to leave a shared MIG instance destroys it (pure)."""

from __future__ import annotations

import dataclasses

import pytest

from dra_driver.base.ids import ClaimRef, ClaimUID, DeviceName, GpuUUID, PoolName
from dra_driver.core.prepare import MigPlan, Mode, PlannedDevice
from dra_driver.state.checkpoint import Checkpoint, CheckpointClaim, ClaimState
from dra_driver.state.mig_shares import hand_over, keep_handed_over

GPU = GpuUUID("GPU-0")
INSTANCE = MigPlan(19, "1g.10gb", 3, 1, "MIG-x", gi_id=1, ci_id=0, created=False)


def _claim(
    uid: str,
    *,
    created: bool = False,
    known: bool = True,
    device: str = "gpu-0-mig-1g10gb-19-3",
    mode: Mode = Mode.MPS,
) -> CheckpointClaim:
    mig = dataclasses.replace(INSTANCE, created=created)
    if not known:
        mig = dataclasses.replace(mig, mig_uuid=None, gi_id=None, ci_id=None)
    planned = PlannedDevice(
        request_names=("gpu",),
        pool_name=PoolName("node-a"),
        device_name=DeviceName(device),
        share_id=f"s-{uid}",
        gpu_uuid=GPU,
        mode=mode,
        cdi_device_ids=(),
        mig=mig,
    )
    return CheckpointClaim(
        ClaimRef("ns", uid, ClaimUID(uid)), ClaimState.PREPARE_COMPLETED, (planned,)
    )


def _created(claim: CheckpointClaim) -> bool:
    mig = claim.devices[0].mig
    assert mig is not None
    return mig.created


@pytest.mark.parametrize(
    ("leaving", "others", "leaving_destroys", "others_created"),
    [
        (_claim("a", created=True), [], True, []),
        (_claim("a", created=True), [_claim("b")], False, [True]),
        (_claim("a", created=True), [_claim("b"), _claim("c")], False, [True, True]),
        (_claim("a"), [_claim("b", created=True)], False, [True]),
        (_claim("a"), [_claim("b")], False, [False]),  # a pre-existing instance: nobody's
        (_claim("a", created=True), [_claim("b", device="gpu-0-mig-1g10gb-19-4")], True, [False]),
        (_claim("a", created=True), [_claim("b", mode=Mode.MIG)], True, [False]),
    ],
    ids=[
        "last-one", "creator-leaves-first", "two-inherit", "joiner-leaves", "pre-existing",
        "other-instance", "not-a-share",
    ],
)  # fmt: skip
def test_hand_over(
    leaving: CheckpointClaim,
    others: list[CheckpointClaim],
    leaving_destroys: bool,
    others_created: list[bool],
) -> None:
    rest = Checkpoint("boot", {c.ref.uid: c for c in others})
    handed, after = hand_over(leaving, rest)
    assert _created(handed) is leaving_destroys
    assert [_created(after.claims[c.ref.uid]) for c in others] == others_created
    assert handed.devices[0].mig is not None
    assert handed.devices[0].mig.mig_uuid == INSTANCE.mig_uuid


def test_a_share_that_never_learnt_its_instance_takes_it_from_the_others() -> None:
    """A half-done prepare (no UUID recorded) must not destroy what a kept claim uses."""
    handed, _ = hand_over(_claim("a", created=True, known=False), Checkpoint("boot", {
        ClaimUID("b"): _claim("b")
    }))  # fmt: skip
    mig = handed.devices[0].mig
    assert mig is not None
    assert (mig.mig_uuid, mig.created) == (INSTANCE.mig_uuid, False)


def test_an_instance_handed_over_while_the_claims_side_effects_ran_is_kept() -> None:
    """B's prepare was in flight (its entry written before it ran) when A, the maker,
    left: the ``created`` B got must survive B recording its completion."""
    in_flight = _claim("b")
    _, after = hand_over(_claim("a", created=True), Checkpoint("boot", {
        in_flight.ref.uid: in_flight
    }))  # fmt: skip
    completion = _claim("b")  # what B's task records: built from what it knew before
    kept = keep_handed_over(completion, after.claims[in_flight.ref.uid])
    assert _created(kept)
    assert keep_handed_over(completion, None) is completion
    assert not _created(keep_handed_over(completion, _claim("b")))
