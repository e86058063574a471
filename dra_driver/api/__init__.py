"""The opaque configuration API ``<driver name>/v1alpha1`` (pure: stdlib and core only).

* :mod:`.types`: the kinds ``GpuConfig``, ``GpuShare``, ``GpuShareGrant`` as frozen
  dataclasses (a tagged union, :data:`ApiObject`), and :class:`Limits`;
* :mod:`.decode`: strict decoding of one ``parameters`` object, and encoding;
* :mod:`.validate`: value checks, one function per kind;
* :mod:`.configs`: which configs apply to one allocation result, merged (class,
  then claim), the grant trusted, and the limits they yield.

Every error is :class:`~dra_driver.core.errors.InvalidConfigError`.
"""

from __future__ import annotations

from dra_driver.api.configs import (
    FROM_CLAIM,
    FROM_CLASS,
    EffectiveConfig,
    IgnoredConfig,
    applies_to,
    apply_overrides,
    effective_config,
    granted_limits,
    limits_for,
    merge_gpu_configs,
)
from dra_driver.api.decode import decode_config, encode_config
from dra_driver.api.types import (
    API_VERSION,
    DEFAULT_DRIVER_NAME,
    ApiObject,
    GpuConfig,
    GpuShare,
    GpuShareGrant,
    Kind,
    Limits,
    LimitsOrigin,
    MigConfig,
    MpsConfig,
    TimeSliceInterval,
    TimeSlicingConfig,
    api_version,
)
from dra_driver.api.validate import validate
from dra_driver.core.errors import InvalidConfigError

__all__ = [
    "API_VERSION",
    "DEFAULT_DRIVER_NAME",
    "FROM_CLAIM",
    "FROM_CLASS",
    "ApiObject",
    "EffectiveConfig",
    "GpuConfig",
    "GpuShare",
    "GpuShareGrant",
    "IgnoredConfig",
    "InvalidConfigError",
    "Kind",
    "Limits",
    "LimitsOrigin",
    "MigConfig",
    "MpsConfig",
    "TimeSliceInterval",
    "TimeSlicingConfig",
    "api_version",
    "applies_to",
    "apply_overrides",
    "decode_config",
    "effective_config",
    "encode_config",
    "granted_limits",
    "limits_for",
    "merge_gpu_configs",
    "validate",
]
