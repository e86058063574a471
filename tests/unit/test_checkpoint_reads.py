"""What the plugin's parts beside the engine read from its checkpoint: the claims
prepared now, and the MIG instances made for claims (hidden from the pool)."""

from __future__ import annotations

import asyncio
import os

from dra_driver.base.ids import ClaimRef, ClaimUID, GpuUUID, MigUUID
from dra_driver.core.model import GpuInfo, Inventory, MigDevice, MigPlacement
from dra_driver.core.prepare import PlannedDevice
from dra_driver.plugin.checkpoint_reads import (
    CheckpointReads,
    completed_claims,
    created_mig_devices,
    prepared_refs,
)
from dra_driver.state.checkpoint import Checkpoint, CheckpointClaim, CheckpointStore, ClaimState
from tests.support.planned import mig_instance, mig_plan

GPU = GpuUUID("GPU-0")
DONE, STARTED = ClaimState.PREPARE_COMPLETED, ClaimState.PREPARE_STARTED


def ref(name: str) -> ClaimRef:
    return ClaimRef("ns", name, ClaimUID(f"uid-{name}"))


def mig_device(
    start: int, *, uuid: str | None = None, created: bool = False, profile: int = 19
) -> PlannedDevice:
    """A 1g.10gb instance at placement ``start`` (``uuid`` None: still to be made)."""
    return mig_instance(
        f"gpu-0-mig-1g10gb-{profile}-{start}",
        gpu=GPU,
        mig=mig_plan(profile, "1g.10gb", start, 1, uuid=uuid, created=created),
    )


def claim(name: str, state: ClaimState, *devices: PlannedDevice) -> CheckpointClaim:
    return CheckpointClaim(ref(name), state, devices)


def checkpoint(*claims: CheckpointClaim) -> Checkpoint:
    return Checkpoint("boot", {c.ref.uid: c for c in claims})


def inventory(*instances: tuple[str, int]) -> Inventory:
    """GPU-0 with MIG on and the instances (uuid, placement start) it lists."""
    migs = tuple(
        MigDevice(MigUUID(uuid), 1, 0, 19, "1g.10gb", MigPlacement(start, 1), 9856)
        for uuid, start in instances
    )
    gpu = GpuInfo(0, GPU, "NVIDIA H100 80GB HBM3", 80 << 30, 0, mig_enabled=True, mig_devices=migs)
    return Inventory((gpu,))


def test_prepared_means_completed() -> None:
    held = checkpoint(claim("a", DONE), claim("b", STARTED), claim("c", DONE))
    assert [c.ref.name for c in completed_claims(held)] == ["a", "c"]
    assert prepared_refs(held) == {ref("a").uid: ref("a"), ref("c").uid: ref("c")}


def test_made_instances_and_the_one_being_made_are_hidden() -> None:
    held = checkpoint(
        claim("made", DONE, mig_device(0, uuid="MIG-made", created=True)),
        claim("kept", DONE, mig_device(1, uuid="MIG-pre-existing")),  # not ours: published
        claim("making", STARTED, mig_device(2)),  # recorded by placement until it completes
        claim("rolled-back", DONE, mig_device(3)),  # no UUID, not in progress: nothing
    )
    listed = inventory(("MIG-made", 0), ("MIG-pre-existing", 1), ("MIG-new", 2), ("MIG-x", 3))
    assert created_mig_devices(held, listed) == {"MIG-made", "MIG-new"}
    # Before a re-discovery lists it, the one being made is not known by UUID yet.
    assert created_mig_devices(held, inventory(("MIG-made", 0))) == {"MIG-made"}


def test_an_instance_being_made_is_matched_by_gpu_profile_and_placement() -> None:
    held = checkpoint(claim("making", STARTED, mig_device(2, profile=14)))
    assert created_mig_devices(held, inventory(("MIG-other-profile", 2))) == set()


def test_the_reads_follow_the_file_and_the_current_inventory(tmp_path: str) -> None:
    store = CheckpointStore(os.path.join(tmp_path, "checkpoint.json"), "boot")
    listed = [inventory()]
    reads = CheckpointReads(store, lambda: listed[-1])
    assert reads.prepared_refs() == {}
    store.save(checkpoint(claim("a", DONE), claim("making", STARTED, mig_device(2))))
    listed.append(inventory(("MIG-new", 2)))
    assert reads.prepared_refs() == {ref("a").uid: ref("a")}
    assert [c.ref.name for c in asyncio.run(reads.completed_claims())] == ["a"]
    assert asyncio.run(reads.created_mig_devices()) == {"MIG-new"}
