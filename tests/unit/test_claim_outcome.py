"""ClaimOutcome.failed: the one place a failed claim's message and reason are made."""

from __future__ import annotations

import pytest

from dra_driver.base.errors import (
    AllocationError,
    CdiWriteError,
    CheckpointError,
    ClaimNotFoundError,
)
from dra_driver.base.ids import ClaimRef, ClaimUID
from dra_driver.kubeletplugin.dra_servicer import ClaimOutcome

REF = ClaimRef("ns", "c", ClaimUID("u-1"))
OTHER = ClaimRef("ns", "other", ClaimUID("u-2"))


@pytest.mark.parametrize(
    ("err", "message", "reason"),
    [
        # A claim error names its claim already: no second prefix.
        (ClaimNotFoundError(REF, "gone"), "claim ns/c:u-1: gone", "ClaimNotFound"),
        (
            AllocationError(REF, "two daemons"),
            "claim ns/c:u-1: two daemons",
            "AllocationUnservable",
        ),
        # Another claim's error, or any other cause, gets this claim's name in front.
        (
            AllocationError(OTHER, "full"),
            "claim ns/c:u-1: claim ns/other:u-2: full",
            "AllocationUnservable",
        ),
        (CheckpointError("disk full"), "claim ns/c:u-1: disk full", "CheckpointError"),
        (
            CdiWriteError("cannot write CDI spec /cdi/x.json: read-only"),
            "claim ns/c:u-1: cannot write CDI spec /cdi/x.json: read-only",
            "CdiWriteFailed",
        ),
        # A bug: named by its type, to be reported.
        (KeyError("devices"), "claim ns/c:u-1: KeyError('devices')", "InternalError"),
    ],
)
def test_failed_names_the_claim_once(err: BaseException, message: str, reason: str) -> None:
    outcome = ClaimOutcome.failed(REF, err)
    assert (outcome.error, outcome.reason, tuple(outcome.devices)) == (message, reason, ())
