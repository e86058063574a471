"""The resource.k8s.io/v1 limits a ResourceSlice must keep (pure constants).

The name-length limits (DNS label and subdomain, domain, identifier) live with
the name grammar in :mod:`dra_driver.base.names`.

Unmarked limits hold in every release we support. ``# 1.35+`` marks those that
apply only with :attr:`~dra_driver.core.settings.Capabilities.counters_in_own_slice`
and a ``_1_34`` suffix those that apply only without it; the checks choose
between them. The taint effects are the exception: ``TAINT_EFFECTS`` is the 1.34
list and ``TAINT_EFFECTS_1_35`` the 1.35+ one. :mod:`dra_driver.core.slices.rules`
says what changed in 1.35.
"""

from __future__ import annotations

# Limits (resource.k8s.io/v1 constants; see dra-facts 3.1).
MAX_DEVICES = 128
MAX_DEVICES_WITH_TAINTS_OR_COUNTERS = 64  # 1.35+
MAX_COUNTER_SETS = 8  # 1.35+
MAX_COUNTERS_PER_SET = 32
MAX_CONSUMPTIONS_PER_DEVICE = 2  # 1.35+
MAX_COUNTERS_PER_CONSUMPTION = 32
MAX_SHARED_COUNTERS_1_34 = 32  # all counters over all sets of one slice
MAX_CONSUMED_COUNTERS_PER_DEVICE_1_34 = 32
MAX_CONSUMED_COUNTERS_PER_SLICE_1_34 = 1024
MAX_ATTRIBUTES_AND_CAPACITIES = 32
MAX_TAINTS = 16  # 1.35+
MAX_TAINTS_1_34 = 4
MAX_VALID_VALUES = 10
MAX_BINDING_CONDITIONS = 4
MAX_STRING_VALUE = 64
MAX_POOL_NAME = 253

TAINT_EFFECTS = ("NoSchedule", "NoExecute")
TAINT_EFFECTS_1_35 = ("None", "NoSchedule", "NoExecute")
