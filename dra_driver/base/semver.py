"""Version strings as the API server wants them in ``version`` attributes.

A ResourceSlice ``version`` attribute must be strict semver 2.0.0 of at most 64
characters (dra-facts 5.2, verified on a 1.36 API server): ``"580.65.06"`` (a
leading zero) and ``"9.0"`` (two parts) are rejected, and so is ``"v9.0.0"``.
NVML reports exactly such strings, so the slice builder passes every version
through :func:`normalise_version` first.
"""

from __future__ import annotations

import re

MAX_LENGTH = 64
"""``resource.DeviceAttributeMaxValueLength``."""

_NUMERIC = r"(?:0|[1-9][0-9]*)"
_PRERELEASE_ID = r"(?:0|[1-9][0-9]*|[0-9]*[a-zA-Z-][0-9a-zA-Z-]*)"
_BUILD_ID = r"[0-9a-zA-Z-]+"
_SEMVER = re.compile(
    rf"{_NUMERIC}\.{_NUMERIC}\.{_NUMERIC}"
    rf"(?:-{_PRERELEASE_ID}(?:\.{_PRERELEASE_ID})*)?"
    rf"(?:\+{_BUILD_ID}(?:\.{_BUILD_ID})*)?"
)
# What NVML and CUDA print: one to three dot-separated numbers, leading zeros allowed.
_LOOSE = re.compile(r"[0-9]+(?:\.[0-9]+){0,2}")


def is_semver(text: str) -> bool:
    """True if ``text`` is strict semver 2.0.0 (pre-release and build allowed) of ≤64 chars.

    Numeric identifiers have no leading zeros; nothing may surround the version
    (no ``v`` prefix, no whitespace).
    """
    return len(text) <= MAX_LENGTH and _SEMVER.fullmatch(text) is not None


def normalise_version(text: str) -> str:
    """Turn an NVML/CUDA version string into strict semver.

    ``"580.65.06"`` → ``"580.65.6"``, ``"9.0"`` → ``"9.0.0"``, ``"13"`` → ``"13.0.0"``;
    a leading ``v`` is dropped and surrounding whitespace ignored. A string that
    already is strict semver (e.g. with a pre-release) is returned as it is.
    Anything else raises :class:`ValueError`.
    """
    candidate = text.strip()
    if candidate[:1] in ("v", "V"):
        candidate = candidate[1:]
    if _LOOSE.fullmatch(candidate):
        parts = [str(int(part)) for part in candidate.split(".")]
        parts += ["0"] * (3 - len(parts))
        candidate = ".".join(parts)
    if not is_semver(candidate):
        raise ValueError(
            f"version {text!r} cannot be made strict semver: expected 1 to 3 dot-separated"
            f" numbers (e.g. 580.65.06, 9.0) or a semver 2.0.0 string of at most"
            f" {MAX_LENGTH} characters"
        )
    return candidate
