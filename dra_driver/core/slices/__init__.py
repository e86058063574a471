"""The ResourceSlices a node publishes, and the API server's rules for them (pure).

``build`` turns the inventory, node settings and cluster capabilities into the
slices; ``rules`` checks them as the API server would before we publish, split
by what the checks look at (``limits``, ``grammar``, ``nodes``, ``devices``,
``attributes``, ``counters``, ``pool``). ``extended_resources`` is the check
that a DeviceClass's extended resource is not also advertised by a device
plugin on this node. The device names themselves live in
:mod:`dra_driver.core.published`.
"""

from dra_driver.core.slices.build import (
    MIB,
    TENANCY_ATTRIBUTE,
    DesiredSlice,
    build_slices,
    mig_share_policy,
)
from dra_driver.core.slices.extended_resources import (
    EVENT_REASON,
    advertised,
    conflict_message,
    parse_names,
)
from dra_driver.core.slices.rules import (
    SliceInvalidError,
    pool_problems,
    slice_problems,
    validate_pool,
    validate_slice,
)

__all__ = [
    "EVENT_REASON",
    "MIB",
    "TENANCY_ATTRIBUTE",
    "DesiredSlice",
    "SliceInvalidError",
    "advertised",
    "build_slices",
    "conflict_message",
    "mig_share_policy",
    "parse_names",
    "pool_problems",
    "slice_problems",
    "validate_pool",
    "validate_slice",
]
