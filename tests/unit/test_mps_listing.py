"""What MPS v3 ``list`` commands print, read as NVIDIA documents it; any other line
is a named problem, never an exception."""

from __future__ import annotations

import pytest

from dra_driver.mpsagent import listing
from dra_driver.mpsagent.listing import NamespaceRow

GIB = 1 << 30
NS = "s_7d3f52c1_9b1e_4a57_8d8e_2f0c6f1a9b10"


def test_namespace_list_as_nvidia_prints_it() -> None:
    # The Dynamo guide's values (20G, 30.00), comma-separated, with the v3 page's
    # seven columns, and with only the table's first five.
    out = (
        "default,shares,Ready,10G,50.00,0,/p/shares/default\n"
        f"{NS},shares,Ready,20G,30.00,0,/p/shares/{NS}\n"
        "small,shares,Ready,512M,70.50\n"
    )
    parsed = listing.parse_v3_namespace_list(out)
    assert parsed.problems == ()
    assert parsed.rows == (
        NamespaceRow("default", "shares", 10 * GIB, 50.0),
        NamespaceRow(NS, "shares", 20 * GIB, 30.0),
        NamespaceRow("small", "shares", 512 << 20, 70.5),
    )


def test_unset_limits() -> None:
    parsed = listing.parse_v3_namespace_list("default,shares,Ready,-,-,0,/p/shares/default\n")
    assert parsed.rows == (NamespaceRow("default", "shares", None, None),)
    assert parsed.problems == ()


@pytest.mark.parametrize(
    ("line", "kept", "expected"),
    [
        ("garbage", False, "at least 5 comma-separated cells"),
        ("NAME,SERVER,SERVER STATUS,PINNED MEMORY LIMIT,ACTIVE THREAD PERCENTAGE", False, "name"),
        (f"{NS},shares,Ready,20G,lots,0,/p", True, "'lots' is not a percentage"),
        (f"{NS},shares,Ready,20G,130.00,0,/p", True, "'130.00' is not a percentage"),
        (f"{NS},shares,Ready,20 GB,30.00,0,/p", True, "'20 GB' is not a memory limit"),
        (f"{NS},shares,Ready,77,30.00,0,/p", True, "'77' is not a memory limit"),
    ],
    ids=["too-few-cells", "a-header", "word-percent", "percent-over-100", "spaced-unit", "no-unit"],
)
def test_a_bad_line_is_a_named_problem_and_the_rest_is_read(
    line: str, kept: bool, expected: str
) -> None:
    out = f"default,shares,Ready,-,-,0,/p/shares/default\n{line}\nlast,shares,Ready,1G,10.00\n"
    parsed = listing.parse_v3_namespace_list(out)
    names = [r.name for r in parsed.rows]
    assert names == (["default", NS, "last"] if kept else ["default", "last"])
    (problem,) = parsed.problems
    assert problem.line_number == 2 and problem.line == line
    assert expected in str(problem) and "line 2" in str(problem)
    assert "namespace list" in str(problem)


@pytest.mark.parametrize(
    ("text", "expected"),
    [("4G", 4 * GIB), ("512M", 512 << 20), ("1024K", 1 << 20), ("1.5G", 3 * GIB // 2)],
)
def test_parse_memory_limit(text: str, expected: int) -> None:
    assert listing.parse_memory_limit(text) == expected


@pytest.mark.parametrize("text", ["77", "8GiB", "4g", "G", "", "-1G"])
def test_parse_memory_limit_refuses_other_forms(text: str) -> None:
    with pytest.raises(ValueError, match="4G, 512M, 1024K"):
        listing.parse_memory_limit(text)


def test_server_list() -> None:
    parsed = listing.parse_v3_server_names(
        "training,1000,48201,Ready,/run/nvidia-mps/training,GPU-abcd-1234,-\n\nnope\n"
    )
    assert parsed.names == ("training",)
    (problem,) = parsed.problems
    assert problem.line_number == 3 and "server list" in str(problem)
