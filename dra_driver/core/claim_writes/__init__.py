"""What the node writes about its prepared claims on API objects (pure).

``claim_status`` builds the ``status.devices`` entries of a prepared claim (and
checks them as the API server does); ``disruption_guard`` decides the node
autoscaler annotations on the pods that use a guarded claim. The writes
themselves are the plugin's (:mod:`dra_driver.plugin.claim_reporting`,
:mod:`dra_driver.plugin.disruption_guard`).
"""

from dra_driver.core.claim_writes.claim_status import (
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
from dra_driver.core.claim_writes.disruption_guard import (
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

__all__ = [
    "CA_SAFE_TO_EVICT",
    "DATA_LIMIT_BYTES",
    "KARPENTER_DO_NOT_DISRUPT",
    "GuardMode",
    "HealthSnapshot",
    "HealthStatus",
    "Marker",
    "annotation_changes",
    "annotations_of",
    "check_condition",
    "check_entry",
    "claim_status_entries",
    "claim_wants_guard",
    "condition_reason",
    "device_data",
    "device_status_entry",
    "entry_key",
    "guarded_claims",
    "marker_key",
    "opt_in_key",
    "pod_finished",
    "pod_uses_claim",
]
