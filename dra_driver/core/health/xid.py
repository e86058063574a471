"""The XID catalogue (pure): what each NVIDIA XID says about the GPU that reported it.

:func:`classify_xid` sorts an XID into an :class:`XidClass` from NVIDIA's
catalogue (the tables below, with their source), so that the health model
(:mod:`dra_driver.core.health.model`) knows whether a device needs a reset, clears by
itself, or was never at fault. :func:`parse_xid_list` reads the operator's
``--ignored-xids``, which wins over the tables; :func:`describe_xid` names an
XID in messages.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterable, Mapping

from dra_driver.base.errors import ConfigError


class XidClass(enum.StrEnum):
    """What an XID says about the device it names."""

    FATAL = "fatal"
    """The GPU needs a reset (or the node a reboot) before it can be trusted again."""
    DEVICE = "device"
    """A problem on the GPU's side that clears by itself; the device is avoided meanwhile."""
    APPLICATION = "application"
    """Caused by, and fatal to, one workload; the device stays healthy."""
    INFORMATIONAL = "informational"
    """A report that needs no action."""
    IGNORED = "ignored"
    """Listed in ``--ignored-xids`` by the operator."""


# Source: NVIDIA's XID catalog for Ampere and newer GPUs,
# https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html, column
# "Resolution Bucket (Immediate Action)". The classes follow that column:
#   RESET_GPU / RESTART_BM, and the DBE (48) and NVLink (74) workflows, which end
#     in a GPU reset                                      -> FATAL
#   RESTART_APP, and IGNORE where the workload is the cause (43, 44, 45, 141)
#                                                         -> APPLICATION
#   IGNORE for pure reports (row remapping done, test messages, power
#     smoothing, recovery-action notes)                   -> INFORMATIONAL
#   everything else (CONTACT_SUPPORT, CHECK_MECHANICALS, UPDATE_SWFW, CHECK_UVM,
#     the NVLink5 workflows 144-150, codes newer than the catalog) -> DEVICE
# Differences from NVIDIA's k8s-device-plugin, which skips 13, 31, 43, 45, 68
# and 109 as application errors: 109 (context-switch timeout) is RESET_GPU in
# the catalog, so it is fatal here.
FATAL_XIDS: frozenset[int] = frozenset(
    {
        46,  # GPU stopped processing (GPU timeout)
        48,  # double-bit ECC error
        62,  # internal micro-controller halt
        64,  # GPU memory remapping failure
        74,  # NVLink error
        79,  # GPU has fallen off the bus
        95,  # uncontained memory error
        109,  # context-switch timeout
        110,  # security fault
        119,  # GSP RPC timeout
        120,  # GSP error
        136,  # link training failed
        140,  # unrecovered ECC error
        143,  # GPU initialisation error
        155,  # NVLink software-defined error
        156,  # resource retirement event (applied at the next reset)
        158,  # GPU fatal timeout
        167,  # PCIe fatal timeout (newer than the catalog's buckets)
    }
)
APPLICATION_XIDS: frozenset[int] = frozenset(
    {
        8,  # GPU stopped processing (idle timeout)
        11,  # invalid or corrupted push buffer stream
        13,  # graphics engine exception
        25,  # invalid or illegal push buffer stream
        31,  # GPU memory page fault
        32,  # invalid or corrupted push buffer stream
        *range(39, 42),  # copy engine exceptions
        43,  # GPU stopped processing (channel reset)
        44,  # graphics engine fault during context switch
        45,  # preemptive cleanup after earlier errors
        60,  # video processor exception
        68,  # NVDEC0 exception
        69,  # graphics engine class error
        *range(70, 73),  # copy engine errors
        *range(75, 78),  # copy engine errors
        80,  # corrupted data sent to the GPU
        *range(82, 87),  # NVJPG, NVDEC, copy engine and OFA errors
        88,  # NVDEC3
        89,  # NVDEC4
        94,  # contained memory error (the workload hit it; the GPU carries on)
        *range(96, 106),  # NVDEC and NVJPG errors
        *range(126, 136),  # copy engine errors
        139,  # OFA1 error
        141,  # CUDA fast-path error
    }
)
INFORMATIONAL_XIDS: frozenset[int] = frozenset(
    {
        14,  # fake error (unused)
        37,  # driver firmware error
        38,  # driver firmware error
        63,  # row remapping event (the remap itself succeeded)
        66,  # illegal access by driver
        67,  # illegal access by driver
        92,  # high single-bit ECC error rate
        93,  # InfoROM wear limit
        106,  # SMBPBI test message
        107,  # SMBPBI test message (silent)
        108,  # NVLink remote translation error (unused)
        121,  # C2C error
        137,  # NVLink privilege error
        154,  # GPU recovery action changed (a note on another XID)
        157,  # resource retirement failure
        160,  # channel retirement event
        161,  # channel retirement failure
        *range(162, 166),  # power smoothing circuitry reports
        171,  # detail of an XID 48 (DRAM)
        172,  # detail of an XID 48 (SRAM)
    }
)
XID_NAMES: Mapping[int, str] = {
    13: "graphics engine exception",
    31: "GPU memory page fault",
    43: "GPU stopped processing",
    45: "preemptive cleanup",
    46: "GPU stopped processing",
    48: "double-bit ECC error",
    62: "internal micro-controller halt",
    63: "row remapping event",
    64: "memory remapping failure",
    68: "NVDEC0 exception",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    92: "high single-bit ECC error rate",
    94: "contained memory error",
    95: "uncontained memory error",
    109: "context-switch timeout",
    119: "GSP RPC timeout",
    120: "GSP error",
    140: "unrecovered ECC error",
    143: "GPU initialisation error",
    158: "GPU fatal timeout",
}
"""Short descriptions for messages (the catalog's wording, shortened)."""

NOT_AN_XID = 0
"""What backends report when their event source itself failed (no XID is known)."""


def classify_xid(xid: int, ignored: Iterable[int] = ()) -> XidClass:
    """The class of ``xid``; ``ignored`` (the ``--ignored-xids`` list) wins over the table."""
    if xid in set(ignored):
        return XidClass.IGNORED
    if xid in FATAL_XIDS:
        return XidClass.FATAL
    if xid in APPLICATION_XIDS:
        return XidClass.APPLICATION
    if xid in INFORMATIONAL_XIDS:
        return XidClass.INFORMATIONAL
    return XidClass.DEVICE


def describe_xid(xid: int) -> str:
    """``XID 79 (GPU has fallen off the bus)``, or ``XID 150`` when it has no short name."""
    name = XID_NAMES.get(xid)
    return f"XID {xid} ({name})" if name else f"XID {xid}"


def parse_xid_list(text: str, flag: str = "--ignored-xids") -> frozenset[int]:
    """``"13, 31 43"`` → {13, 31, 43}; raises ConfigError naming ``flag`` for anything else."""
    xids = set()
    for item in filter(None, re.split(r"[,\s]+", text.strip())):
        if not item.isdigit() or int(item) == NOT_AN_XID:
            raise ConfigError(
                f"{flag}: {item!r} is not an XID; give positive integers separated by commas, "
                "e.g. 13,31,43"
            )
        xids.add(int(item))
    return frozenset(xids)
