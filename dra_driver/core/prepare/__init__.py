"""Prepare time (pure): what a claim gets on this node and what is said about it.

``plan`` is the prepare plan, ``mps_namespaces`` the MPS namespaces a plan's
devices hold at the mps-agent, ``mig_instances`` the MIG instances a half-done
prepare may have left, ``configs`` the opaque configs that apply to an
allocation result, and ``observers`` what the prepare/unprepare engine tells the
rest of the plugin after each claim. What the node writes about a prepared
claim on API objects is :mod:`dra_driver.core.claim_writes`.
"""

from dra_driver.core.prepare.configs import (
    FROM_CLAIM,
    FROM_CLASS,
    EffectiveConfig,
    applies_to,
    apply_overrides,
    effective_config,
    granted_limits,
    limits_for,
    trusted_grant,
)
from dra_driver.core.prepare.mig_instances import LeftoverMig, leftover_mig_instances
from dra_driver.core.prepare.mps_namespaces import (
    MpsNamespace,
    mps_daemon_conflict,
    mps_namespaces,
    namespace_of,
    owned_shares,
)
from dra_driver.core.prepare.observers import ClaimOperation, DriverObserver, error_reason, notify
from dra_driver.core.prepare.plan import (
    DeviceUse,
    DmemHookSettings,
    MigPlan,
    Mode,
    NodeContext,
    PlannedDevice,
    PreparePlan,
    ShareLimits,
    dmem_hook,
    plan_prepare,
)

__all__ = [
    "FROM_CLAIM",
    "FROM_CLASS",
    "ClaimOperation",
    "DeviceUse",
    "DmemHookSettings",
    "DriverObserver",
    "EffectiveConfig",
    "LeftoverMig",
    "MigPlan",
    "Mode",
    "MpsNamespace",
    "NodeContext",
    "PlannedDevice",
    "PreparePlan",
    "ShareLimits",
    "applies_to",
    "apply_overrides",
    "dmem_hook",
    "effective_config",
    "error_reason",
    "granted_limits",
    "leftover_mig_instances",
    "limits_for",
    "mps_daemon_conflict",
    "mps_namespaces",
    "namespace_of",
    "notify",
    "owned_shares",
    "plan_prepare",
    "trusted_grant",
]
