"""CDI (Container Device Interface) specs (pure, no file I/O).

``spec`` renders a claim's spec and merges container edits; ``driver_edits``
and ``mig_edits`` are the edits CUDA and a MIG device need; ``rules`` checks a
spec as a container runtime would when it loads it.
"""

from dra_driver.core.cdi.driver_edits import (
    CONTROL_NODES,
    DEFAULT_HOOK_PATH,
    TOOLKIT_KIND,
    DriverFile,
    DriverFiles,
    FoundNode,
    edits_from_driver_files,
    edits_from_toolkit_spec,
    fake_common_edits,
    fake_device_node,
)
from dra_driver.core.cdi.mig_edits import NVIDIACTL, CapNode, fake_cap_nodes, mig_device_edits
from dra_driver.core.cdi.rules import cdi_spec_problems
from dra_driver.core.cdi.spec import (
    CdiDevice,
    CdiSpec,
    ContainerEdits,
    DeviceNode,
    Hook,
    Mount,
    cdi_kind_for_driver,
    merge_edits,
    minimum_version,
    qualified_device_name,
    render_spec,
    transient_spec_filename,
    transient_spec_prefix,
    validate_kind,
)

__all__ = [
    "CONTROL_NODES",
    "DEFAULT_HOOK_PATH",
    "NVIDIACTL",
    "TOOLKIT_KIND",
    "CapNode",
    "CdiDevice",
    "CdiSpec",
    "ContainerEdits",
    "DeviceNode",
    "DriverFile",
    "DriverFiles",
    "FoundNode",
    "Hook",
    "Mount",
    "cdi_kind_for_driver",
    "cdi_spec_problems",
    "edits_from_driver_files",
    "edits_from_toolkit_spec",
    "fake_cap_nodes",
    "fake_common_edits",
    "fake_device_node",
    "merge_edits",
    "mig_device_edits",
    "minimum_version",
    "qualified_device_name",
    "render_spec",
    "transient_spec_filename",
    "transient_spec_prefix",
    "validate_kind",
]
