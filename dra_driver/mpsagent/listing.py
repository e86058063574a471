"""Reading what MPS v3 ``list`` commands print (pure).

What the documents show (docs:mpsv3-interface "Server", "Namespace"; NVIDIA
Dynamo, "Per-GPU Compute and Memory Limits with MPS", step 4, run on driver
615.71.09):

* ``server list --format=csv,noheader``: one line per server, columns name, uid,
  pid, status, pipe-directory, allowed-devices, context-ids; an empty cell is
  ``-`` (``training,1000,48201,Ready,/run/nvidia-mps/training,GPU-abcd-1234,-``).
* ``namespace list``: columns name, server, server-status, pinned-memory-limit,
  active-thread-percentage, client-priority, pipe-directory (the v3 page); the
  Dynamo guide's table shows the first five, with memory as set (``20G``) and
  the percentage with two decimals (``30.00``).

Not documented, and so read leniently but named here: the CSV cells of
``namespace list`` (taken to be the table's values, comma-separated, like
``server list``'s), and how an unset limit prints (taken to be ``-``, as
``server list`` prints an empty cell). gpu-unverified: no real daemon has been
listed by this code yet.

A line that is not in this form never raises: it becomes a :class:`ListingProblem`
naming the line, what it says and what was expected, and the rest of the
listing is still read. The caller logs the problems (:mod:`.daemon_shares`), so one
odd line costs at most the one row.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_NAME = re.compile(r"^[a-z0-9_]{1,64}$")
"""Server and namespace names (docs:mpsv3-interface "CLI Command Structure")."""
UNSET = ("", "-")
_MEMORY = re.compile(r"^(\d+(?:\.\d+)?)([KMGT])$")
_UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
_PERCENT = re.compile(r"^\d{1,3}(?:\.\d+)?$")
NAMESPACE_COLUMNS = 5
"""name, server, server-status, pinned-memory-limit, active-thread-percentage
(the Dynamo table's five; the v3 page lists two more after them)."""
SERVER_COLUMNS = 4
"""name, uid, pid, status (of the seven the v3 page lists)."""


@dataclass(frozen=True)
class ListingProblem:
    """One line of a listing that is not in the documented form."""

    command: str
    line_number: int
    line: str
    expected: str

    def __str__(self) -> str:
        return (
            f"`{self.command}` line {self.line_number} {self.line!r} is not in the "
            f"documented form: expected {self.expected}"
        )


@dataclass(frozen=True)
class NamespaceRow:
    name: str
    server: str
    pinned_memory_limit: int | None
    """Bytes; None when unset (``-``) or unreadable (then a problem names the line)."""
    active_thread_percentage: float | None
    """As printed (``30.00`` -> 30.0); None when unset or unreadable."""


@dataclass(frozen=True)
class NamespaceListing:
    rows: tuple[NamespaceRow, ...]
    problems: tuple[ListingProblem, ...]


@dataclass(frozen=True)
class ServerListing:
    names: tuple[str, ...]
    problems: tuple[ListingProblem, ...]


def parse_memory_limit(text: str) -> int:
    """A memory limit as MPS v3 writes one (``4G``, ``512M``, ``1024K``) -> bytes.

    Binary units (Dynamo: "``10G`` is 10,737,418,240 bytes"). The documented
    forms are an integer and K, M or G; a decimal mantissa and T are accepted
    too, in case a daemon prints a limit in a larger unit than it was set in
    (undocumented either way). Anything else raises ValueError naming the forms.
    """
    match = _MEMORY.match(text.strip())
    if not match:
        raise ValueError(
            f"{text!r} is not a memory limit (an integer with a unit suffix: 4G, 512M, 1024K)"
        )
    return int(float(match.group(1)) * _UNITS[match.group(2)])


def parse_percentage(text: str) -> float:
    """An active thread percentage as ``namespace list`` prints it (``30.00``)."""
    value = text.strip()
    if not _PERCENT.match(value) or not 0 <= float(value) <= 100:
        raise ValueError(f"{text!r} is not a percentage (0-100, such as 30.00)")
    return float(value)


def _cells(stdout: str) -> list[tuple[int, str, list[str]]]:
    """Non-blank lines with their 1-based number, split at commas."""
    return [
        (number, line, [cell.strip() for cell in line.split(",")])
        for number, line in enumerate(stdout.splitlines(), start=1)
        if line.strip()
    ]


def parse_v3_namespace_list(stdout: str, command: str = "namespace list") -> NamespaceListing:
    """``namespace list --format=csv,noheader`` -> the namespaces, and the lines that
    were not in the documented form (see the module docstring)."""
    rows: list[NamespaceRow] = []
    problems: list[ListingProblem] = []
    for number, line, cells in _cells(stdout):

        def problem(expected: str, number: int = number, line: str = line) -> None:
            problems.append(ListingProblem(command, number, line, expected))

        if len(cells) < NAMESPACE_COLUMNS:
            problem(
                f"at least {NAMESPACE_COLUMNS} comma-separated cells (name, server, "
                f"server-status, pinned-memory-limit, active-thread-percentage), got "
                f"{len(cells)}; the line is skipped"
            )
            continue
        name, server, _status, memory, percent = cells[:NAMESPACE_COLUMNS]
        if not _NAME.match(name) or not _NAME.match(server):
            problem("a namespace and a server name (lowercase letters, digits, '_'); skipped")
            continue
        # The row counts (the namespace exists) even where a limit cell is odd:
        # its limits are set again by whoever needs them.
        mem: int | None = None
        pct: float | None = None
        try:
            mem = None if memory in UNSET else parse_memory_limit(memory)
        except ValueError as err:
            problem(f"pinned-memory-limit: {err} (the namespace is kept, that limit unknown)")
        try:
            pct = None if percent in UNSET else parse_percentage(percent)
        except ValueError as err:
            problem(f"active-thread-percentage: {err} (the namespace is kept, that limit unknown)")
        rows.append(NamespaceRow(name, server, mem, pct))
    return NamespaceListing(tuple(rows), tuple(problems))


def parse_v3_server_names(stdout: str, command: str = "server list") -> ServerListing:
    """``server list --format=csv,noheader`` -> the servers' names (first column)."""
    names: list[str] = []
    problems: list[ListingProblem] = []
    for number, line, cells in _cells(stdout):
        if len(cells) < SERVER_COLUMNS or not _NAME.match(cells[0]):
            problems.append(
                ListingProblem(
                    command,
                    number,
                    line,
                    f"a server name (lowercase letters, digits, '_') and at least "
                    f"{SERVER_COLUMNS} comma-separated cells (name, uid, pid, status); skipped",
                )
            )
            continue
        names.append(cells[0])
    return ServerListing(tuple(names), tuple(problems))
