"""What a prepare or an unprepare of one claim does to the checkpoint (pure).

Each function takes the checkpoint as decided so far and returns the checkpoint to
write with what the claim's transaction must do next. They run inside a
:class:`~dra_driver.plugin.journal.CheckpointJournal` pass, so the entry they
write is durable before the transaction's first side effect.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, replace

from dra_driver.base.errors import DriverError
from dra_driver.base.ids import ClaimRef
from dra_driver.core.cdi import CdiSpec
from dra_driver.core.model import Inventory, ResourceClaim
from dra_driver.core.prepare import NodeContext, plan_prepare
from dra_driver.kubeletplugin.dra_servicer import ClaimOutcome
from dra_driver.state.checkpoint import Checkpoint, CheckpointClaim, ClaimState
from dra_driver.state.mig_shares import hand_over

log = logging.getLogger("dra_driver.plugin.driver")
# The engine's lines about claims keep the logger they were written under.


@dataclass(frozen=True)
class Answered:
    """The claim needs no work: its answer (a repeated prepare, or why it cannot be)."""

    outcome: ClaimOutcome


@dataclass(frozen=True)
class Started:
    """PrepareStarted is recorded; side effects, CDI spec and PrepareCompleted follow."""

    entry: CheckpointClaim
    spec: CdiSpec | None
    """The plan's CDI spec, before the side effects add theirs; None: the claim was
    prepared and lost its spec file, which is written again from ``entry.cdi_spec``."""


PrepareDecision = Answered | Started


@dataclass(frozen=True)
class PrepareInputs:
    """What a prepare decision reads besides the checkpoint."""

    ref: ClaimRef
    fetched: ResourceClaim | BaseException
    """The claim as read from the API, or why it could not be read."""
    inventory: Inventory
    ctx: NodeContext
    spec_file: str
    """Where the claim's CDI spec goes."""
    spec_exists: Callable[[str], bool]


def decide_prepare(
    checkpoint: Checkpoint, claim: PrepareInputs
) -> tuple[Checkpoint, PrepareDecision]:
    """Answer a claim prepared before; otherwise plan it and record PrepareStarted."""
    ref = claim.ref
    recorded = checkpoint.claims.get(ref.uid)
    if recorded is not None and recorded.state is ClaimState.PREPARE_COMPLETED:
        if (
            recorded.cdi_spec is not None
            and recorded.cdi_spec_file
            and not claim.spec_exists(recorded.cdi_spec_file)
        ):
            # Someone emptied the CDI dir under a prepared claim: the runtime would
            # fail to start the container, so write it again.
            log.warning("CDI spec of prepared claim %s is missing; writing it again", ref)
            started = replace(recorded, state=ClaimState.PREPARE_STARTED)
            return checkpoint.with_claim(started), Started(started, None)
        return checkpoint, Answered(ClaimOutcome(devices=recorded.devices, repeated=True))
    if isinstance(claim.fetched, BaseException):
        return checkpoint, Answered(ClaimOutcome.failed(ref, claim.fetched))
    try:
        # A PrepareStarted entry is an attempt that died half-way; planning again is
        # safe because the plan is deterministic.
        in_use = checkpoint.without(ref.uid).device_uses()
        plan = plan_prepare(claim.fetched, claim.inventory, claim.ctx, in_use)
    except DriverError as err:
        return checkpoint, Answered(ClaimOutcome.failed(ref, err))
    # The spec is rendered once, after the side effects: a PrepareStarted entry is
    # rolled back, never served, so it needs only the file's path.
    entry = CheckpointClaim(
        ref=ref,
        state=ClaimState.PREPARE_STARTED,
        devices=plan.devices,
        cdi_spec_file=claim.spec_file,
    )
    return checkpoint.with_claim(entry), Started(entry, plan.cdi_spec)


def decide_unprepare(
    checkpoint: Checkpoint, ref: ClaimRef
) -> tuple[Checkpoint, CheckpointClaim | None]:
    """Drop the claim's entry; returns it as it must be released (None: not prepared).

    A MIG instance other claims still share passes to them (:mod:`mig_shares`)."""
    recorded = checkpoint.claims.get(ref.uid)
    if recorded is None:
        return checkpoint, None
    leaving, rest = hand_over(recorded, checkpoint.without(ref.uid))
    return rest, leaving
