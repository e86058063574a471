"""``hand_over``: the last claim to leave a shared MIG instance destroys it (pure)."""

from __future__ import annotations

import dataclasses

import pytest

from dra_driver.base.ids import ClaimRef, ClaimUID, GpuUUID
from dra_driver.core.prepare import MigPlan, PlannedDevice, mig_of
from dra_driver.state.checkpoint import Checkpoint, CheckpointClaim, ClaimState
from dra_driver.state.mig_shares import hand_over, keep_handed_over
from tests.support.planned import mig_instance, mig_plan, mps_in_mig

GPU = GpuUUID("GPU-0")
INSTANCE = mig_plan(19, "1g.10gb", 3, 1, uuid="MIG-x", gi_id=1, ci_id=0)


def _claim(
    uid: str,
    *,
    created: bool = False,
    known: bool = True,
    device: str = "gpu-0-mig-1g10gb-19-3",
    share: bool = True,
) -> CheckpointClaim:
    """A claim holding one device of a MIG instance: an MPS share of it, or (``share``
    false) the whole instance; ``known`` false: a share that never learnt its instance."""
    mig = dataclasses.replace(INSTANCE, created=created)
    if not known:
        mig = dataclasses.replace(mig, instance=None)
    planned: PlannedDevice = (
        mps_in_mig(device, gpu=GPU, share_id=f"s-{uid}", mig=mig)
        if share
        else mig_instance(device, gpu=GPU, share_id=f"s-{uid}", mig=mig)
    )
    return CheckpointClaim(
        ClaimRef("ns", uid, ClaimUID(uid)), ClaimState.PREPARE_COMPLETED, (planned,)
    )


def _mig(claim: CheckpointClaim) -> MigPlan:
    mig = mig_of(claim.devices[0])
    assert mig is not None
    return mig


def _created(claim: CheckpointClaim) -> bool:
    return _mig(claim).created


@pytest.mark.parametrize(
    ("leaving", "others", "leaving_destroys", "others_created"),
    [
        (_claim("a", created=True), [], True, []),
        (_claim("a", created=True), [_claim("b")], False, [True]),
        (_claim("a", created=True), [_claim("b"), _claim("c")], False, [True, True]),
        (_claim("a"), [_claim("b", created=True)], False, [True]),
        (_claim("a"), [_claim("b")], False, [False]),  # a pre-existing instance: nobody's
        (_claim("a", created=True), [_claim("b", device="gpu-0-mig-1g10gb-19-4")], True, [False]),
        (_claim("a", created=True), [_claim("b", share=False)], True, [False]),
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
    assert _mig(handed).mig_uuid == INSTANCE.mig_uuid


def test_a_share_that_never_learnt_its_instance_takes_it_from_the_others() -> None:
    """A half-done prepare (no UUID recorded) must not destroy what a kept claim uses."""
    handed, _ = hand_over(_claim("a", created=True, known=False), Checkpoint("boot", {
        ClaimUID("b"): _claim("b")
    }))  # fmt: skip
    assert (_mig(handed).mig_uuid, _mig(handed).created) == (INSTANCE.mig_uuid, False)


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
