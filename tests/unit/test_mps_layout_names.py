"""Spare namespace names (:mod:`dra_driver.mpsagent.layout`) and ``--spare-namespaces``."""

from __future__ import annotations

import pytest

from dra_driver.base.errors import ConfigError
from dra_driver.cli.mps_agent import spare_count
from dra_driver.mpsagent.layout import (
    LONGEST_SOCKET_SUFFIX,
    NAMESPACE_PREFIX,
    is_short_namespace,
    namespace_name,
    spare_namespace_name,
)


def test_a_spare_name_is_as_long_as_a_shares_and_never_one_derived_from_a_share() -> None:
    names = {spare_namespace_name() for _ in range(200)}
    assert len(names) == 200
    for name in names:
        assert len(name) == len(namespace_name("any share"))  # the socket path still fits
        assert name.startswith(NAMESPACE_PREFIX + "p")  # "p" is no hex digit
        assert is_short_namespace(name)
    assert LONGEST_SOCKET_SUFFIX > 0


@pytest.mark.parametrize(
    ("name", "ours"),
    [
        (namespace_name("share-1"), True),
        ("s_p0123456789a", True),
        ("s_0123456789ab", True),
        ("s_p0123456789", False),  # one short
        ("s_g0123456789a", False),  # neither hex nor the spare mark
        ("s_0123456789AB", False),
        ("share_0123456789abcdef", False),  # an earlier layout's long name
        ("x_0123456789ab", False),
    ],
)
def test_which_recorded_names_a_share_keeps(name: str, ours: bool) -> None:
    assert is_short_namespace(name) is ours


def test_spare_namespaces_flag_takes_zero_or_more() -> None:
    assert spare_count("0") == 0
    assert spare_count("3") == 3
    for wrong in ("-1", "two", ""):
        with pytest.raises(ConfigError, match=r"--spare-namespaces \(SPARE_NAMESPACES\)"):
            spare_count(wrong)
