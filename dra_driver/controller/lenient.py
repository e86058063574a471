"""Lenient reads of a claim, for the loops over every claim.

The loops over every claim (the queueing, the pending gauge) and the claim handler's
"was something freed" read claims through these: a claim whose status or metadata
cannot be read counts as unallocated and alive, so that one such claim stops none of
those loops and is queued, and :func:`~.reconcile.decide` refuses it with an Event that
names the field.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dra_driver.core import claim_shape
from dra_driver.core.claim_shape import MalformedClaimError


def allocated(claim: Mapping[str, Any]) -> bool:
    try:
        return claim_shape.is_allocated(claim)
    except MalformedClaimError:
        return False


def deleting(claim: Mapping[str, Any]) -> bool:
    try:
        return claim_shape.is_deleting(claim)
    except MalformedClaimError:
        return False


def namespace(claim: Mapping[str, Any]) -> str:
    return claim_shape.ref(claim).namespace
