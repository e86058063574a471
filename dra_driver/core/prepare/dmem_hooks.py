"""Kernel-enforced GPU-memory limits for MPS shares in the plan's CDI spec (pure):
the cgroup v2 ``dmem`` ``createContainer`` hook of each MPS share of a GPU with dmem
regions."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from dra_driver.base.ids import GpuUUID
from dra_driver.core.cdi import CdiDevice, ContainerEdits, Hook, merge_edits
from dra_driver.core.prepare.devices import MpsShare, PlannedDevice
from dra_driver.core.prepare.mps_namespaces import mps_namespaces, namespace_of


@dataclass(frozen=True)
class DmemHookSettings:
    """Kernel-enforced GPU-memory limits for MPS shares: cgroup v2 ``dmem``.

    Where the node's kernel has the ``dmem`` controller and the GPU's driver
    registers a region for it, each container of an MPS share gets a CDI
    ``createContainer`` hook (``dra_driver/dmemhook/dmem-hook.sh``, installed on
    the host) that sets the share's memory limit as the container's hard limit
    (``dmem.max``; its cgroup does not exist at prepare time) and, when the
    claim's config asks for one (``mps.memorySoftLimit``), its soft limit
    (``dmem.min``), through ``nvidia-smi memory-limits`` where the driver offers
    it. The limits are per container: two containers of one pod that use one
    claim may each use them. A GPU without regions gets no hook, and a
    soft limit asked for a share of it has no effect (silently: the field's
    documentation says so, and detection logs the node's dmem state once).
    """

    hook_path: str
    """The installed script, a path on the host."""
    regions: Mapping[GpuUUID, tuple[str, ...]]
    """dmem regions per GPU UUID (detection at start); a GPU absent here gets no hook."""
    strict: bool = False
    """A failing hook fails the container's start (``--strict``); otherwise the
    container starts with the MPS daemon's limit only and the hook logs why."""
    log_path: str | None = None
    """Where the hook appends its failures on the host."""
    timeout_s: int = 10


def dmem_hook(
    settings: DmemHookSettings,
    gpu_uuid: GpuUUID,
    regions: Sequence[str],
    memory_bytes: int,
    soft_memory_bytes: int | None = None,
) -> Hook:
    """The ``createContainer`` hook that sets a container's dmem limits on one GPU.

    ``memory_bytes`` is the hard limit (``dmem.max``); ``soft_memory_bytes``,
    when given, the soft one (``dmem.min``): NVML defines a cgroup's soft limit
    as the memory "guaranteed before allocations may fail due to memory
    pressure" (``nvmlSetMemoryLimits_v1_t``). The hook sets both with
    ``nvidia-smi memory-limits -i <gpu_uuid>`` where the node's driver offers
    it, else by writing ``regions``' lines into the files (the script's header
    says why). The plan passes the claim's ``mps.memorySoftLimit``; without
    one the arguments are those of a hard limit alone.
    """
    args = ["dmem-hook.sh"]
    if settings.strict:
        args.append("--strict")
    if settings.log_path:
        args += ["--log", settings.log_path]
    args += ["--gpu", gpu_uuid, "--max", str(memory_bytes)]
    if soft_memory_bytes is not None:
        args += ["--min", str(soft_memory_bytes)]
    return Hook(
        hook_name="createContainer",
        path=settings.hook_path,
        args=(*args, "--", *regions),
        timeout=settings.timeout_s,
    )


def mps_soft_memory_on(
    devices: Sequence[PlannedDevice], soft_limits: Sequence[int | None], gpu_uuid: GpuUUID
) -> int | None:
    """A claim's soft memory limit on one GPU: the sum of its shares' there (None: none asked).

    Summed like the hard limits (:attr:`MpsNamespace.memory_limit_bytes`) (``count > 1`` on one GPU
    is one namespace and one cgroup limit for the claim's containers); a share
    without a soft limit adds nothing, so the sum stays at most the hard sum.
    """
    asked = [
        soft
        for device, soft in zip(devices, soft_limits, strict=True)
        if isinstance(device, MpsShare) and device.gpu_uuid == gpu_uuid and soft is not None
    ]
    return sum(asked) if asked else None


def with_dmem_hooks(
    cdi_devices: Sequence[CdiDevice],
    planned: Sequence[PlannedDevice],
    soft_limits: Sequence[int | None],
    dmem: DmemHookSettings,
) -> list[CdiDevice]:
    """Each MPS share of a GPU with dmem regions gets the hook with the claim's memory
    there (and its soft limit, when asked). A GPU without regions gets none, so a soft
    limit asked there has no effect; nothing is logged per claim."""
    out = []
    namespaces = mps_namespaces(planned)
    for cdi, device in zip(cdi_devices, planned, strict=True):
        regions = dmem.regions.get(device.gpu_uuid, ())
        if not isinstance(device, MpsShare) or not regions:
            # (dmem accounting is for GPUs without MIG: dra-facts 10.1.)
            out.append(cdi)
            continue
        # count > 1 on one GPU: the claim's hard limits there are summed, and so
        # are its soft limits (one namespace, one dmem limit per container).
        hook = dmem_hook(
            dmem,
            device.gpu_uuid,
            regions,
            namespace_of(namespaces, device).memory_limit_bytes,
            mps_soft_memory_on(planned, soft_limits, device.gpu_uuid),
        )
        out.append(CdiDevice(cdi.name, merge_edits(cdi.edits, ContainerEdits(hooks=(hook,)))))
    return out
