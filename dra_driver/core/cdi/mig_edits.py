"""CDI container edits for one MIG device: pure, no file I/O.

A container reaches a MIG device through three character devices (NVIDIA's
``cdi.go``/``nvcaps.go`` do the same):

- the parent GPU's ``/dev/nvidia<minor>`` (major 195);
- the GPU instance's capability node ``/dev/nvidia-caps/nvidia-cap<N>``;
- the compute instance's capability node ``/dev/nvidia-caps/nvidia-cap<M>``.

``N`` and ``M`` come from the driver's ``access`` files and the major of the
``nvidia-caps`` nodes from ``/proc/devices``; :mod:`dra_driver.gpu.mig_caps`
reads them into :class:`CapNode` values, so this module stays pure. The nodes
need not exist on the host: the runtime creates them in the container from
the explicit type, major, minor and file mode. Control nodes (``/dev/nvidiactl``) are
added as well, so a device's edits are complete on their own.

Environment: none is set, on purpose.

- With CDI injection, what a container can use is decided by the nodes
  injected: the driver lets a process use a MIG device only through the
  capability nodes it can open, so CUDA in the container enumerates exactly
  the MIG devices whose GI and CI nodes it got. (``NVIDIA_VISIBLE_DEVICES`` is
  the knob of nvidia-container-runtime's non-CDI mode; NVIDIA's DRA driver
  sets it, to ``void``, only for passthrough and compute domains.)
- ``CUDA_VISIBLE_DEVICES=<MIG UUID>`` would add no isolation, and it would
  do harm as a per-device edit: a container given two devices (two MIG
  devices, or a MIG device and a whole GPU from another claim) would get two
  values for one variable, the runtime keeping one, which hides the other
  device. CUDA enumerates only one MIG device per process anyway; a workload
  that holds several picks one itself with ``CUDA_VISIBLE_DEVICES``.
- A node whose runtime runs nvidia-container-runtime in legacy mode would
  inject every GPU for images that carry ``NVIDIA_VISIBLE_DEVICES=all`` (the
  CUDA base images do); that is a node set-up error (use CDI mode), as it is
  for NVIDIA's driver, and is not patched over here.
"""

from __future__ import annotations

from dataclasses import dataclass

from dra_driver.core.cdi.driver_edits import fake_device_node
from dra_driver.core.cdi.spec import ContainerEdits, DeviceNode
from dra_driver.core.model import GpuInfo, MigDevice

# docs/nvidia-interfaces.md: cdi-gpu-node, cdi-control-nodes (gpu-unverified: the toolkit's specs)
NVIDIA_MAJOR = 195
"""Character-device major of ``/dev/nvidia<N>`` and ``/dev/nvidiactl`` (fixed by the driver)."""
NVIDIACTL_MINOR = 255
NVIDIACTL = DeviceNode("/dev/nvidiactl", major=NVIDIA_MAJOR, minor=NVIDIACTL_MINOR)
DEFAULT_CONTROL_NODES: tuple[DeviceNode, ...] = (NVIDIACTL,)
"""``/dev/nvidiactl``, whose major and minor are fixed. ``/dev/nvidia-uvm*``
have a dynamic major and are left to the caller (or the driver-library edits)."""

CAPS_DIR = "/dev/nvidia-caps"


@dataclass(frozen=True)
class CapNode:
    """One ``/dev/nvidia-caps/nvidia-cap<minor>`` node, as the driver's ``access`` file says."""

    path: str
    major: int
    """The ``nvidia-caps`` major from ``/proc/devices`` (dynamic: read, never assume)."""
    minor: int
    """``DeviceFileMinor`` of the capability's ``access`` file."""
    mode: int
    """``DeviceFileMode`` of the ``access`` file (permission bits, e.g. ``0o444``)."""

    @classmethod
    def for_minor(cls, major: int, minor: int, mode: int) -> CapNode:
        return cls(path=f"{CAPS_DIR}/nvidia-cap{minor}", major=major, minor=minor, mode=mode)

    def device_node(self) -> DeviceNode:
        """The CDI node: explicit type and numbers (the host may lack it), the driver's mode."""
        return DeviceNode(
            self.path, type="c", major=self.major, minor=self.minor, file_mode=self.mode
        )


# docs/nvidia-interfaces.md: cdi-mig-caps
def mig_device_edits(
    parent: GpuInfo,
    mig: MigDevice,
    caps: tuple[CapNode, CapNode],
    control_nodes: tuple[DeviceNode, ...] = DEFAULT_CONTROL_NODES,
) -> ContainerEdits:
    """The edits that give a container the MIG device ``mig`` of ``parent``.

    ``caps`` is (GI node, CI node) for ``mig``, as
    :meth:`dra_driver.gpu.mig_caps.MigCapabilities.cap_nodes` returns them.
    Order: parent node, GI node, CI node, control nodes. No environment: see
    the module docstring. ``mig`` need not be in ``parent.mig_devices``
    (it may have been created after that inventory); it names the device in
    errors only.
    """
    gi, ci = caps
    if gi.path == ci.path:
        raise ValueError(
            f"MIG device {mig.uuid}: GI and CI capability nodes are both {gi.path}; "
            "the access files of the GPU instance and of the compute instance were mixed up"
        )
    parent_node = DeviceNode(parent.device_node, type="c", major=NVIDIA_MAJOR, minor=parent.minor)
    nodes = (parent_node, gi.device_node(), ci.device_node())
    extra = tuple(node for node in control_nodes if node.path not in {n.path for n in nodes})
    return ContainerEdits(device_nodes=nodes + extra)


def fake_cap_nodes(gpu_minor: int, gi_id: int, ci_id: int) -> tuple[CapNode, CapNode]:
    """Stand-in GI and CI capability nodes for the fake backend: ``/dev/null``'s
    numbers (as :func:`~dra_driver.core.cdi.fake_device_node`) at distinct paths."""
    stand_in = fake_device_node("/dev/null")
    major, minor = stand_in.major or 1, stand_in.minor or 3
    return (
        CapNode(f"/dev/nvidia-caps/nvidia-cap-gpu{gpu_minor}-gi{gi_id}", major, minor, 0o444),
        CapNode(
            f"/dev/nvidia-caps/nvidia-cap-gpu{gpu_minor}-gi{gi_id}-ci{ci_id}",
            major,
            minor,
            0o444,
        ),
    )
