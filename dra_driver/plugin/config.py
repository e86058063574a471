"""The kubelet plugin's configuration (from its flags), and where it keeps its files.

:mod:`dra_driver.app.plugin` builds the plugin from a :class:`PluginConfig`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from dra_driver.base.errors import ConfigError
from dra_driver.core.cdi import DEFAULT_HOOK_PATH, cdi_kind_for_driver
from dra_driver.core.health import HealthSettings, unhealthy_taint_key
from dra_driver.core.settings import NodeSettings
from dra_driver.dmemhook import DEFAULT_HOOK_DIR
from dra_driver.gpu.dmem import DEFAULT_CGROUP_ROOT
from dra_driver.k8s.publisher import SlicePublisher
from dra_driver.plugin.enforcement import DmemLimits
from dra_driver.plugin.publishing import ProbeFn

CHECKPOINT_FILE = "checkpoint.json"
LOCK_FILE = "serialize.lock"
MPS_STATUS_TIMEOUT_S = 10.0
"""How long the health monitor waits for the mps-agent's status."""


@dataclass(frozen=True)
class PluginConfig:
    driver_name: str
    node_name: str
    registry_dir: str
    plugin_dir: str
    cdi_root: str
    rolling_update_uid: str | None = None
    boot_id_file: str = "/proc/sys/kernel/random/boot_id"
    inventory_interval: float = 60.0
    """Seconds between re-discoveries of the GPUs (MIG mode changes after a
    reset, a GPU gone); 0 turns it off."""
    settings: NodeSettings = field(default_factory=NodeSettings)
    """Sharing and allocator per GPU, memory reserve and steps (node settings)."""
    driver_root: str = "/"
    """Where the NVIDIA driver is installed, as the plugin sees it (NVML backend)."""
    proc_root: str = "/proc"
    """The host's /proc (MIG capability files)."""
    cdi_hook_path: str | None = DEFAULT_HOOK_PATH
    """The toolkit's CDI hook on the host, for the ldcache update; None: no hook."""
    mps_agent_socket: str | None = None
    """The mps-agent's socket; None: MPS shares fail with a message naming it (and the
    health monitor does not watch MPS daemons)."""
    health: HealthSettings = field(default_factory=HealthSettings)
    """Device health: recovery time, taint effect of fatal problems, ignored XIDs."""
    health_probe_interval: float = 30.0
    """Seconds between GPU liveness probes (and health reports); 0 turns the probe off."""
    dmem_limits: DmemLimits = DmemLimits.AUTO
    """Kernel-enforced GPU-memory limits for MPS shares (cgroup v2 dmem hook)."""
    hook_dir: str = DEFAULT_HOOK_DIR
    """Host directory the dmem hook script is installed into (hostPath, same path)."""
    cgroup_root: str = DEFAULT_CGROUP_ROOT
    """The host's cgroup v2 root as the plugin sees it (dmem detection)."""
    readiness_port: int | None = None
    """Serve ``/readyz`` on this port (plugin/readiness.py); None: not served, 0: any
    free port (tests)."""
    readiness_address: str = "0.0.0.0"

    def validate(self) -> None:
        if not self.node_name:
            raise ConfigError("--node-name (NODE_NAME) is required: the node this plugin serves")
        if not self.driver_name:
            raise ConfigError("--driver-name (DRIVER_NAME) must not be empty")
        cdi_kind_for_driver(self.driver_name)
        unhealthy_taint_key(self.driver_name)
        self.health.validate()
        if self.health_probe_interval < 0:
            raise ConfigError(
                f"--health-probe-interval must be 0 (off) or more seconds, not "
                f"{self.health_probe_interval}"
            )


@dataclass(frozen=True)
class SliceOptions:
    """How to publish the node's ResourceSlices (absent: not published, e.g. the demo)."""

    publisher: SlicePublisher
    probe: ProbeFn
