"""Raw ResourceClaim JSON (resource.k8s.io/v1) → :mod:`dra_driver.core.model`.

The reading itself is :mod:`dra_driver.core.allocation` (pure; the one reader
of ``status.allocation``); the names stay importable from here.
"""

from __future__ import annotations

from dra_driver.core.allocation import claim_from_dict, claim_ref_from_dict

__all__ = ["claim_from_dict", "claim_ref_from_dict"]
