"""Prepare time (pure): what a claim gets on this node and what is said about it.

``devices`` is the planned device (one variant per mode), ``plan`` the prepare
plan (with ``mig_planning``, ``node_guards`` and ``dmem_hooks``),
``mps_namespaces`` the MPS namespaces a plan's devices hold at the mps-agent,
``mig_instances`` the MIG instances a half-done prepare may have left,
``configs`` the opaque configs that apply to an allocation result, and
``observers`` what the prepare/unprepare engine tells the rest of the plugin
after each claim. What the node writes about a prepared claim on API objects is
:mod:`dra_driver.core.claim_writes`.
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
from dra_driver.core.prepare.devices import (
    Admin,
    CommonFields,
    Exclusive,
    HeldDevice,
    MigInstance,
    MigInstanceIds,
    MigPlan,
    Mode,
    MpsDevice,
    MpsInMig,
    MpsLimits,
    MpsShare,
    PlannedDevice,
    PreparePlan,
    TimeSliced,
    limits_of,
    mig_of,
    shares_memory,
)
from dra_driver.core.prepare.dmem_hooks import DmemHookSettings, dmem_hook
from dra_driver.core.prepare.mig_instances import LeftoverMig, leftover_mig_instances
from dra_driver.core.prepare.mps_namespaces import (
    MpsNamespace,
    mps_daemon_conflict,
    mps_namespaces,
    namespace_of,
    owned_shares,
)
from dra_driver.core.prepare.observers import ClaimOperation, DriverObserver, error_reason, notify
from dra_driver.core.prepare.plan import NodeContext, plan_prepare

__all__ = [
    "FROM_CLAIM",
    "FROM_CLASS",
    "Admin",
    "ClaimOperation",
    "CommonFields",
    "DmemHookSettings",
    "DriverObserver",
    "EffectiveConfig",
    "Exclusive",
    "HeldDevice",
    "LeftoverMig",
    "MigInstance",
    "MigInstanceIds",
    "MigPlan",
    "Mode",
    "MpsDevice",
    "MpsInMig",
    "MpsLimits",
    "MpsNamespace",
    "MpsShare",
    "NodeContext",
    "PlannedDevice",
    "PreparePlan",
    "TimeSliced",
    "applies_to",
    "apply_overrides",
    "dmem_hook",
    "effective_config",
    "error_reason",
    "granted_limits",
    "leftover_mig_instances",
    "limits_for",
    "limits_of",
    "mig_of",
    "mps_daemon_conflict",
    "mps_namespaces",
    "namespace_of",
    "notify",
    "owned_shares",
    "plan_prepare",
    "shares_memory",
    "trusted_grant",
]
