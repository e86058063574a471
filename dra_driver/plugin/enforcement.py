"""Side effects of a prepare beyond the CDI spec: MPS shares and MIG instances.

The plan (pure) says what each device gets; this module makes it so and
returns the CDI edits that only exist afterwards:

* an **MPS share** asks the mps-agent (its own process and DaemonSet, so a
  plugin restart never touches a running daemon) to ensure the GPU's daemon
  and the share's namespace and limits; the container then gets the share's
  pipe directory and the GPU's shm directory;
* an **MPS share inside a MIG instance** gets the instance (created like a MIG
  device below when it does not exist yet) and then a share at the daemon for
  that instance, whose key is the instance's MIG UUID (the agent's daemon for it
  runs with ``CUDA_VISIBLE_DEVICES=MIG-<uuid>``). That daemon speaks legacy MPS
  whatever the agent's protocol (v3 namespaces and memory partitioning are
  documented for non-MIG GPUs only: :func:`dra_driver.mpsagent.commands.daemon_protocol`),
  so what holds there is legacy's: the daemon's defaults are the largest share's
  limits, each share's own caps are its containers' environment (cooperative:
  a client can drop them, up to the defaults), its clients run as one UID at a
  time, and no dmem limit is set (MIG is unsupported there);
* a **MIG device** on a free placement is created through the GPU backend
  (idempotent: a retry finds the instance it made), then its GI and CI
  capability nodes are read from the driver's files under ``--proc-root``;
  an existing instance only needs its capability nodes. With the fake backend
  the capability nodes are harmless stand-ins.

Release reverses both: the share is released (the agent stops the daemon
after the last one), an instance *we* created is destroyed; instances that
existed before are never touched. An instance shared by MPS clients is
destroyed by the last claim to leave it (the engine hands ``created`` over,
:mod:`dra_driver.state.mig_shares`). An unprepare whose claim has only plain
shares of MPS v3 daemons leaves their release to a lull in the calls
(:meth:`Enforcer.release_later`, :mod:`dra_driver.plugin.deferred_releases`).

At start, :func:`dmem_hook_settings` finds which GPUs have cgroup v2 ``dmem``
regions and installs the hook script on the host; the result is the plan's
input (``NodeContext.dmem``), so planning stays pure and deterministic.
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import logging
import os
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from dra_driver.base.errors import AllocationError, DriverError, InventoryError
from dra_driver.base.ids import ClaimRef, GpuUUID, MigUUID
from dra_driver.core.cdi import (
    CapNode,
    CdiDevice,
    CdiSpec,
    ContainerEdits,
    Mount,
    fake_cap_nodes,
    merge_edits,
    mig_device_edits,
)
from dra_driver.core.model import GpuInfo, Inventory, MigDevice, MigPlacement
from dra_driver.core.ports import GpuBackend
from dra_driver.core.prepare import (
    DmemHookSettings,
    MigInstance,
    MigInstanceIds,
    MigPlan,
    MpsInMig,
    MpsNamespace,
    MpsShare,
    PlannedDevice,
    leftover_mig_instances,
    mps_daemon_conflict,
    mps_namespaces,
    namespace_of,
)
from dra_driver.core.settings import NodeSettings, Tenancy
from dra_driver.dmemhook import install_hook
from dra_driver.gpu.dmem import detect_dmem
from dra_driver.gpu.mig_caps import MigCapabilities
from dra_driver.mpsagent.commands import share_cdi_edits
from dra_driver.mpsagent.layout import is_mig_uuid
from dra_driver.mpsagent.port import MpsAgentPort
from dra_driver.plugin.deferred_releases import DeferredReleases
from dra_driver.plugin.early_shares import EarlyShares, plain_mps

log = logging.getLogger(__name__)


class DmemLimits(enum.StrEnum):
    """``--dmem-limits``: kernel-enforced GPU-memory limits for MPS shares (cgroup v2 dmem)."""

    AUTO = "auto"
    """A hook on the GPUs that have dmem regions; a failing hook is logged, the
    container starts with the MPS daemon's limit only."""
    STRICT = "strict"
    """As auto, but a failing hook fails the container's start."""
    OFF = "off"


DMEM_HOOK_LOG = "dmem-hook.log"


async def dmem_hook_settings(
    gpus: Sequence[GpuInfo], *, cgroup_root: str, hook_dir: str, mode: DmemLimits
) -> DmemHookSettings | None:
    """At plugin start: detect dmem regions, log the outcome per GPU, install the hook.

    None (no hook in any CDI spec) when ``mode`` is off or no GPU has a region;
    the script is installed only when some GPU will use it.
    """
    if mode is DmemLimits.OFF:
        log.info("dmem GPU-memory limits off (--dmem-limits=off)")
        return None
    found = await asyncio.to_thread(detect_dmem, gpus, cgroup_root)
    for note in found.notes:
        log.info("%s", note)
    if not found.regions:
        return None
    path = await asyncio.to_thread(install_hook, hook_dir)
    log.info("dmem hook installed at %s (%s)", path, mode.value)
    return DmemHookSettings(
        hook_path=path,
        regions=found.regions,
        strict=mode is DmemLimits.STRICT,
        log_path=os.path.join(hook_dir, DMEM_HOOK_LOG),
    )


class Enforcer:
    def __init__(
        self,
        *,
        backend: GpuBackend,
        inventory: Callable[[], Inventory],
        mig_caps: MigCapabilities | None,
        mps: MpsAgentPort | None,
        settings: NodeSettings | None = None,
        lull: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        """``mig_caps`` None: stand-in capability nodes (fake backend);
        ``mps`` None: MPS shares fail with a message naming the missing agent;
        ``settings``: the node's (default: the defaults), for who may share a legacy
        MPS daemon (:meth:`_tenancy`); ``lull``: returns once no call of the plugin's is
        in flight, when the releases :meth:`release_later` defers are sent (None: every
        release is sent at once)."""
        self.backend = backend
        self.inventory = inventory
        self.mig_caps = mig_caps
        self.mps = mps
        self.settings = settings or NodeSettings()
        self.releases = (
            DeferredReleases(mps, lull) if mps is not None and lull is not None else None
        )

    def early_shares(self, claim: ClaimRef) -> EarlyShares:
        """What :meth:`apply` takes for ``claim``'s MPS shares started before it
        (:mod:`~dra_driver.plugin.early_shares`)."""
        return EarlyShares(claim, self._ensure_gpu_share, self._release_gpu_share)

    async def apply(
        self,
        claim: ClaimRef,
        devices: Sequence[PlannedDevice],
        spec: CdiSpec,
        early: EarlyShares | None = None,
    ) -> tuple[tuple[PlannedDevice, ...], CdiSpec]:
        """Run each device's side effects; on failure undo this claim's and raise.

        ``early``: the claim's MPS shares already asked of the agent, taken instead
        of asking again."""
        done: list[PlannedDevice] = []
        cdi_devices = list(spec.devices)
        known = early.namespaces(devices) if early is not None else None
        namespaces = known if known is not None else mps_namespaces(devices)
        conflict = mps_daemon_conflict(namespaces)
        if conflict is not None:
            raise AllocationError(claim, conflict)
        shares: dict[MpsNamespace, ContainerEdits] = {}
        instances: dict[str, tuple[MpsInMig, ContainerEdits]] = {}
        try:
            for i, device in enumerate(devices):
                applied: PlannedDevice
                extra: ContainerEdits | None
                match device:
                    case MpsInMig():
                        namespace = namespace_of(namespaces, device)
                        applied, extra = await self._mig_share(claim, device, namespace, instances)
                    case MpsShare():
                        # All of a claim's shares of one GPU are one MPS namespace:
                        # a container sees one pipe directory.
                        namespace = namespace_of(namespaces, device)
                        if namespace not in shares:
                            taken = await early.take(namespace) if early is not None else None
                            if taken is None:
                                taken = await self._ensure_gpu_share(claim, namespace)
                            shares[namespace] = taken
                        applied, extra = device, shares[namespace]
                    case MigInstance():
                        plan, _, extra = await self._instance(device.gpu_uuid, device.mig)
                        applied = dataclasses.replace(device, mig=plan)
                    case _:
                        applied, extra = device, None  # the plan's edits are all it needs
                done.append(applied)
                if extra is not None:
                    # Ours first: its explicit numbers win over the plan's node.
                    cdi_devices[i] = CdiDevice(
                        name=cdi_devices[i].name, edits=merge_edits(extra, cdi_devices[i].edits)
                    )
        except Exception:
            await self.release(claim, done)
            if early is not None:
                await early.abandon()  # ensured early but not reached: released too
            raise
        return tuple(done), dataclasses.replace(spec, devices=tuple(cdi_devices))

    async def release(self, claim: ClaimRef, devices: Sequence[PlannedDevice]) -> None:
        """Undo ``devices``' side effects; errors are logged and raised after trying all."""
        failures: list[str] = []
        namespaces = mps_namespaces(devices)
        released: set[str] = set()
        destroyed: set[tuple[str, int]] = set()
        for device in devices:
            try:
                match device:
                    case MpsInMig():
                        namespace = namespace_of(namespaces, device)
                        await self._release_mig_share(device, namespace, released, destroyed)
                    case MpsShare():
                        namespace = namespace_of(namespaces, device)
                        if self.mps is not None and device.gpu_uuid not in released:
                            released.add(device.gpu_uuid)
                            if namespace.key is not None:
                                await self.mps.release_share(device.gpu_uuid, namespace.key)
                    case MigInstance(mig=MigPlan(created=True, instance=MigInstanceIds() as ids)):
                        await self.backend.destroy_mig_device(device.gpu_uuid, ids.gi_id)
                        log.info("destroyed MIG device %s on %s", ids.uuid, device.gpu_uuid)
                    case _:
                        pass  # nothing to undo: no side effect was ours
            except DriverError as err:
                failures.append(str(err))
                log.error("claim %s: releasing %s failed: %s", claim, device.device_name, err)
        if failures:
            raise InventoryError("; ".join(failures))

    def must_settle_releases(self, devices: Sequence[PlannedDevice]) -> bool:
        """Whether ``devices`` use a GPU other than as an MPS share (a whole GPU, MIG)
        whose MPS shares' releases are still deferred (no await: asked of every
        prepare)."""
        releases = self.releases
        if releases is None or not releases.pending:
            return False
        return any(not isinstance(d, MpsShare) and releases.holds_gpu(d.gpu_uuid) for d in devices)

    async def settle_releases(self, devices: Sequence[PlannedDevice]) -> None:
        """Before ``devices`` use their GPUs other than as MPS shares: those GPUs' deferred
        releases sent (the last stops the daemon and puts the compute mode back)."""
        if self.releases is None:
            return
        for gpu in sorted({d.gpu_uuid for d in devices if not isinstance(d, MpsShare)}):
            await self.releases.settle_gpu(gpu)

    def may_defer_release(self, devices: Sequence[PlannedDevice]) -> bool:
        """Whether :meth:`release_later` takes ``devices``: plain MPS shares of MPS v3
        daemons, and nothing else to undo (a legacy daemon's next share may be another
        namespace's, which a pending release would refuse)."""
        return (
            self.releases is not None
            and plain_mps(devices)
            and self.settings.daemon_keeps_tenants_apart(mig=False)
        )

    def release_later(self, claim: ClaimRef, devices: Sequence[PlannedDevice]) -> bool:
        """Defer the release of ``devices``' MPS shares to a lull in the calls
        (:mod:`~dra_driver.plugin.deferred_releases` says why that is safe), once the
        claim's entry is gone, when :meth:`may_defer_release`. False, and nothing done,
        otherwise (:meth:`release` then releases them at once)."""
        releases = self.releases
        if releases is None or not self.may_defer_release(devices):
            return False
        for namespace in mps_namespaces(devices):
            if namespace.key is not None:
                releases.defer(claim, namespace.gpu_uuid, namespace.key)
        return True

    async def flush_releases(self) -> None:
        """Send the deferred releases now (the plugin's close)."""
        if self.releases is not None:
            await self.releases.flush()

    async def release_orphan_shares(self, owned: Sequence[tuple[str, str]]) -> list[str]:
        """Release the agent's shares no prepared claim owns (after a crash or reboot)."""
        if self.mps is None:
            return []
        keep = set(owned)
        released = []
        for share in await self.mps.list_shares():
            if (share.gpu_uuid, share.share_id) not in keep:
                await self.mps.release_share(share.gpu_uuid, share.share_id)
                released.append(share.share_id)
                log.warning(
                    "released MPS share %s of claim %s: no prepared claim owns it",
                    share.share_id,
                    share.claim_uid,
                )
        return released

    # --- MPS -------------------------------------------------------------------

    async def _ensure_gpu_share(self, claim: ClaimRef, namespace: MpsNamespace) -> ContainerEdits:
        """A namespace of a whole GPU's shares, at that GPU's daemon."""
        return await self._ensure_share(claim, namespace, namespace.gpu_uuid)

    async def _release_gpu_share(self, namespace: MpsNamespace) -> None:
        if self.mps is not None and namespace.key is not None:
            await self.mps.release_share(namespace.gpu_uuid, namespace.key)

    async def _ensure_share(
        self, claim: ClaimRef, namespace: MpsNamespace, daemon_uuid: str
    ) -> ContainerEdits:
        """Ask the agent for ``namespace`` (a claim's shares of one GPU, or of one MIG
        instance) at the daemon ``daemon_uuid`` names (the GPU's, or the instance's)."""
        if self.mps is None:
            raise InventoryError(
                f"{namespace.device_name} is MPS-shared but this plugin has no mps-agent "
                "(--mps-agent-socket); deploy the mps-agent DaemonSet on this node"
            )
        if namespace.key is None:
            raise InventoryError(
                f"the MPS share of {namespace.device_name} has neither a shareID nor a "
                "GpuShareGrant to name it; delete the claim so it is allocated again"
            )
        releases = self.releases
        if releases is not None and releases.holds(daemon_uuid, namespace.key):
            await releases.settle(daemon_uuid, namespace.key)  # no release after this ensure
        share = await self.mps.ensure_share(
            daemon_uuid,
            namespace.key,
            claim_uid=claim.uid,
            memory_limit_bytes=namespace.memory_limit_bytes,
            active_thread_percentage=namespace.active_thread_percentage,
            **self._tenancy(claim, namespace.gpu_uuid, daemon_uuid),
        )
        edits = share_cdi_edits(share)
        return ContainerEdits(
            env=edits.env,
            mounts=tuple(Mount(m.host_path, m.container_path, m.options) for m in edits.mounts),
        )

    def _tenancy(self, claim: ClaimRef, gpu_uuid: str, daemon_uuid: str) -> dict[str, Any]:
        """What the agent needs to keep a legacy daemon to one namespace: nothing for
        an MPS v3 daemon, whose clients each reach their own namespace directory (so
        an agent older than the tenancy rule still serves MPS v3 shares)."""
        if self.settings.daemon_keeps_tenants_apart(mig=is_mig_uuid(daemon_uuid)):
            return {}
        gpu = next((g for g in self.inventory().gpus if g.uuid == gpu_uuid), None)
        tenancy = self.settings.for_gpu(gpu.index, gpu.uuid).tenancy if gpu is not None else None
        return {"tenant": claim.namespace, "cooperative": tenancy is Tenancy.COOPERATIVE}

    # --- MPS inside MIG -----------------------------------------------------------

    async def _mig_share(
        self,
        claim: ClaimRef,
        device: MpsInMig,
        namespace: MpsNamespace,
        instances: dict[str, tuple[MpsInMig, ContainerEdits]],
    ) -> tuple[MpsInMig, ContainerEdits]:
        """A share inside a MIG instance: the instance (made if it does not exist yet),
        then the claim's namespace at the daemon for that instance (one per claim and
        instance, selected by the instance's UUID); the container gets both edits."""
        seen = instances.get(device.device_name)
        if seen is None:
            plan, ids, mig_edits = await self._instance(device.gpu_uuid, device.mig)
            share_edits = await self._ensure_share(claim, namespace, ids.uuid)
            seen = dataclasses.replace(device, mig=plan), merge_edits(share_edits, mig_edits)
            instances[device.device_name] = seen
            return seen
        # A second share of the same instance in this claim: same instance and namespace.
        first, edits = seen
        return dataclasses.replace(device, mig=dataclasses.replace(first.mig, created=False)), edits

    async def _release_mig_share(
        self,
        device: MpsInMig,
        namespace: MpsNamespace,
        released: set[str],
        destroyed: set[tuple[str, int]],
    ) -> None:
        """Release the claim's namespace at the instance's daemon (the agent stops the
        daemon after its last share), then destroy the instance if this claim is the
        one to (``created``: it made the instance, or inherited it, and no other
        prepared claim holds a share of it; see :mod:`dra_driver.state.mig_shares`)."""
        mig = device.mig
        ids = mig.instance
        if ids is None:
            return  # never made: nothing to release or destroy
        if self.mps is not None and ids.uuid not in released:
            released.add(ids.uuid)
            if namespace.key is not None:
                await self.mps.release_share(ids.uuid, namespace.key)
        instance = (device.gpu_uuid, ids.gi_id)
        if mig.created and instance not in destroyed:
            destroyed.add(instance)
            await self.backend.destroy_mig_device(device.gpu_uuid, ids.gi_id)
            log.info(
                "destroyed MIG device %s on %s after its last MPS share",
                ids.uuid,
                device.gpu_uuid,
            )

    # --- MIG -------------------------------------------------------------------

    def _gpu(self, uuid: GpuUUID) -> GpuInfo:
        for gpu in self.inventory().gpus:
            if gpu.uuid == uuid:
                return gpu
        raise InventoryError(f"GPU {uuid} is no longer on this node")

    async def _instance(
        self, gpu_uuid: GpuUUID, plan: MigPlan
    ) -> tuple[MigPlan, MigInstanceIds, ContainerEdits]:
        """The MIG instance ``plan`` names (made now if it does not exist yet): the plan
        as it is then, the instance's ids, and the container edits that reach it."""
        gpu = self._gpu(gpu_uuid)
        ids = plan.instance
        if ids is None:
            placement = MigPlacement(plan.placement_start, plan.placement_size)
            created = await self.backend.create_mig_device(gpu.uuid, plan.profile_id, placement)
            ids = MigInstanceIds(created.uuid, created.gi_id, created.ci_id)
            plan = dataclasses.replace(plan, instance=ids, created=True)
            log.info("created MIG device %s (%s) on %s", created.uuid, plan.profile_name, gpu.uuid)
        mig = MigDevice(
            uuid=MigUUID(ids.uuid),
            gi_id=ids.gi_id,
            ci_id=ids.ci_id,
            profile_id=plan.profile_id,
            profile_name=plan.profile_name,
            placement=MigPlacement(plan.placement_start, plan.placement_size),
            memory_mib=0,
        )
        return plan, ids, mig_device_edits(gpu, mig, self._caps(gpu, ids.gi_id, ids.ci_id))

    def _caps(self, gpu: GpuInfo, gi_id: int, ci_id: int) -> tuple[CapNode, CapNode]:
        if self.mig_caps is not None:
            return self.mig_caps.cap_nodes(gpu.minor, gi_id, ci_id)
        # Fake backend: stand-ins with /dev/null's numbers at distinct paths.
        return fake_cap_nodes(gpu.minor, gi_id, ci_id)

    async def destroy_leftover(self, devices: Sequence[PlannedDevice]) -> None:
        """After a crash: destroy instances a half-done prepare may have created.

        A planned MIG device without a UUID was to be created at a placement
        that was free when planned; an instance there now is ours.
        """
        for leftover in leftover_mig_instances(devices, self.inventory()):
            await self.backend.destroy_mig_device(leftover.gpu_uuid, leftover.gi_id)
            if leftover.found is not None:
                log.warning("destroyed MIG device %s left by a half-done prepare", leftover.found)
