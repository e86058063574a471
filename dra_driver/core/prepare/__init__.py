"""Prepare time (pure): what a claim gets on this node and what is said about it.

``plan`` is the prepare plan, ``mps_namespaces`` the MPS namespaces a plan's
devices hold at the mps-agent, ``mig_instances`` the MIG instances a half-done
prepare may have left, ``configs`` the opaque configs that apply to an
allocation result, ``claim_status`` the ``status.devices`` entries of a
prepared claim, ``disruption_guard`` the node autoscaler annotations on the
pods that use a guarded claim, and ``observers`` what the prepare/unprepare
engine tells the rest of the plugin after each claim.
"""

from dra_driver.core.prepare.claim_status import (
    DATA_LIMIT_BYTES,
    HealthSnapshot,
    HealthStatus,
    check_condition,
    check_entry,
    claim_status_entries,
    condition_reason,
    device_data,
    device_status_entry,
    entry_key,
)
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
from dra_driver.core.prepare.disruption_guard import (
    CA_SAFE_TO_EVICT,
    KARPENTER_DO_NOT_DISRUPT,
    GuardMode,
    Marker,
    annotation_changes,
    annotations_of,
    claim_wants_guard,
    guarded_claims,
    marker_key,
    opt_in_key,
    pod_finished,
    pod_uses_claim,
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
    "CA_SAFE_TO_EVICT",
    "DATA_LIMIT_BYTES",
    "FROM_CLAIM",
    "FROM_CLASS",
    "KARPENTER_DO_NOT_DISRUPT",
    "ClaimOperation",
    "DeviceUse",
    "DmemHookSettings",
    "DriverObserver",
    "EffectiveConfig",
    "GuardMode",
    "HealthSnapshot",
    "HealthStatus",
    "LeftoverMig",
    "Marker",
    "MigPlan",
    "Mode",
    "MpsNamespace",
    "NodeContext",
    "PlannedDevice",
    "PreparePlan",
    "ShareLimits",
    "annotation_changes",
    "annotations_of",
    "applies_to",
    "apply_overrides",
    "check_condition",
    "check_entry",
    "claim_status_entries",
    "claim_wants_guard",
    "condition_reason",
    "device_data",
    "device_status_entry",
    "dmem_hook",
    "effective_config",
    "entry_key",
    "error_reason",
    "granted_limits",
    "guarded_claims",
    "leftover_mig_instances",
    "limits_for",
    "marker_key",
    "mps_daemon_conflict",
    "mps_namespaces",
    "namespace_of",
    "notify",
    "opt_in_key",
    "owned_shares",
    "plan_prepare",
    "pod_finished",
    "pod_uses_claim",
    "trusted_grant",
]
