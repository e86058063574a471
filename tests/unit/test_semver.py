"""Version strings: NVML's forms to the strict semver the API server accepts."""

from __future__ import annotations

import pytest

from dra_driver.base.semver import is_semver, normalise_version


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("580.65.06", "580.65.6"),
        ("570.86.10", "570.86.10"),
        ("9.0", "9.0.0"),
        ("13", "13.0.0"),
        ("12.4", "12.4.0"),
        ("8.9", "8.9.0"),
        ("v9.0.0", "9.0.0"),
        ("V12.2", "12.2.0"),
        ("  535.104.05 ", "535.104.5"),
        ("007.000.010", "7.0.10"),
        ("0.0.0", "0.0.0"),
        ("1.2.3-rc.1", "1.2.3-rc.1"),
        ("1.2.3+build.5", "1.2.3+build.5"),
    ],
    ids=repr,
)
def test_normalise_version(raw: str, expected: str) -> None:
    assert normalise_version(raw) == expected
    assert is_semver(expected)


@pytest.mark.parametrize(
    "raw",
    [
        "",
        "   ",
        "v",
        "N/A",
        "580.65.06.01",
        "9.",
        ".9",
        "9..0",
        "1.2.3-",
        "1.2.3-01",
        "12,4",
        "version 9",
        "vv9.0.0",
        "1" * 70,
        "\u0669.\u0660",  # Arabic-Indic digits: numbers to str.isdigit, but not ASCII
    ],
    ids=repr,
)
def test_normalise_version_rejects(raw: str) -> None:
    with pytest.raises(ValueError, match="strict semver"):
        normalise_version(raw)


@pytest.mark.parametrize(
    ("text", "valid"),
    [
        ("1.2.3", True),
        ("0.0.0", True),
        ("580.65.6", True),
        ("1.0.0-alpha", True),
        ("1.0.0-alpha.1", True),
        ("1.0.0-0.3.7", True),
        ("1.0.0-x.7.z.92", True),
        ("1.0.0-x-y-z.--", True),
        ("1.0.0-alpha+001", True),
        ("1.0.0+20130313144700", True),
        ("1.0.0-beta+exp.sha.5114f85", True),
        ("1.0.0+21AF26D3----117B344092BD", True),
        ("1.0.0-0A.is.legal", True),
        ("1.2.3-" + "a" * 58, True),  # exactly 64 characters
        ("1.2.3-" + "a" * 59, False),  # 65 characters
        ("580.65.06", False),
        ("01.2.3", False),
        ("1.02.3", False),
        ("9.0", False),
        ("9", False),
        ("v9.0.0", False),
        ("1.2.3-01", False),
        ("1.2.3-", False),
        ("1.2.3+", False),
        ("1.2.3-a..b", False),
        ("1.2.3+a..b", False),
        ("1.2.3-a_b", False),
        (" 1.2.3", False),
        ("1.2.3\n", False),
        ("1.2.3.4", False),
        ("", False),
    ],
    ids=repr,
)
def test_is_semver(text: str, valid: bool) -> None:
    assert is_semver(text) is valid
