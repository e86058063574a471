"""The opaque configuration API ``<driver name>/v1alpha1`` (pure: stdlib and base only).

* :mod:`.types`: the kinds ``GpuConfig``, ``GpuShare``, ``GpuShareGrant`` as frozen
  dataclasses (a tagged union, :data:`ApiObject`), and :class:`Limits`;
* :mod:`.decode`: strict decoding of one ``parameters`` object, and encoding;
* :mod:`.validate`: value checks, one function per kind.

Which configs apply to one allocation result, merged (class, then claim), the
grant trusted, and the limits they yield, is the planner's business:
:mod:`dra_driver.core.prepare.configs` (it needs the claim model; ``api/`` stands on
``base/`` alone).

Every error is :class:`~dra_driver.base.errors.InvalidConfigError`.
"""

from __future__ import annotations

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
from dra_driver.base.errors import InvalidConfigError

__all__ = [
    "API_VERSION",
    "DEFAULT_DRIVER_NAME",
    "ApiObject",
    "GpuConfig",
    "GpuShare",
    "GpuShareGrant",
    "InvalidConfigError",
    "Kind",
    "Limits",
    "LimitsOrigin",
    "MigConfig",
    "MpsConfig",
    "TimeSliceInterval",
    "TimeSlicingConfig",
    "api_version",
    "decode_config",
    "encode_config",
    "validate",
]
