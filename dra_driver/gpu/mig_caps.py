"""The NVIDIA driver's MIG capability nodes, read from ``/proc`` (I/O).

Each GPU instance and compute instance has a capability: a character device
``/dev/nvidia-caps/nvidia-cap<N>`` a process must be able to open to use it.
The driver publishes ``N`` in an ``access`` file per capability::

    <proc>/driver/nvidia/capabilities/gpu<parent minor>/mig/gi<GI>/access
    <proc>/driver/nvidia/capabilities/gpu<parent minor>/mig/gi<GI>/ci<CI>/access

with lines ``DeviceFileMinor: N`` and ``DeviceFileMode: M`` (``M`` in decimal,
as the driver prints it: 292 is 0o444), and the major of every capability node
is the ``nvidia-caps`` entry of the "Character devices:" section of
``<proc>/devices``. ``proc_root`` is the host's ``/proc`` as mounted in the
plugin's container (``--proc-root``); tests point it at a fixture tree.

The parsers are pure functions; :class:`MigCapabilities` only reads files.
"""

from __future__ import annotations

from pathlib import Path

from dra_driver.base.errors import InventoryError
from dra_driver.core.cdi import CapNode

CAPS_DEVICE = "nvidia-caps"


# docs/nvidia-interfaces.md: mig-caps-access
def parse_char_major(text: str, name: str) -> int | None:
    """The major of character device ``name`` in a ``/proc/devices`` text, None if absent."""
    in_char = False
    for raw in text.splitlines():
        line = raw.strip()
        if line.endswith(":"):
            in_char = line == "Character devices:"
            continue
        fields = line.split()
        if in_char and len(fields) == 2 and fields[1] == name and fields[0].isdigit():
            return int(fields[0])
    return None


def parse_access(text: str) -> tuple[int, int]:
    """``(DeviceFileMinor, DeviceFileMode)`` of an ``access`` file; ValueError if missing."""
    values: dict[str, int] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() in ("DeviceFileMinor", "DeviceFileMode"):
            values[key.strip()] = int(value.strip())
    missing = [k for k in ("DeviceFileMinor", "DeviceFileMode") if k not in values]
    if missing:
        raise ValueError(f"no {' or '.join(missing)} line")
    return values["DeviceFileMinor"], values["DeviceFileMode"]


class MigCapabilities:
    """Reads capability nodes under ``proc_root`` (the host's ``/proc``)."""

    def __init__(self, proc_root: str | Path = "/proc") -> None:
        self.proc_root = Path(proc_root)

    def caps_major(self) -> int:
        """The ``nvidia-caps`` character-device major from ``<proc_root>/devices``."""
        path = self.proc_root / "devices"
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as err:
            raise InventoryError(
                f"cannot read {path}: {err.strerror or err}; is --proc-root the host's /proc?"
            ) from err
        major = parse_char_major(text, CAPS_DEVICE)
        if major is None:
            raise InventoryError(
                f"{path} lists no '{CAPS_DEVICE}' character device: the NVIDIA driver "
                "creates it with MIG support (driver R450+ with nvidia-caps loaded); is "
                "--proc-root the host's /proc, and is MIG enabled on this node?"
            )
        return major

    def access_file(self, parent_minor: int, gi_id: int, ci_id: int | None = None) -> Path:
        """The ``access`` file of GPU instance ``gi_id`` (or of its compute instance ``ci_id``)."""
        base = self.proc_root / "driver/nvidia/capabilities" / f"gpu{parent_minor}" / "mig"
        gi = base / f"gi{gi_id}"
        return (gi if ci_id is None else gi / f"ci{ci_id}") / "access"

    def cap_nodes(self, parent_minor: int, gi_id: int, ci_id: int) -> tuple[CapNode, CapNode]:
        """(GI node, CI node) of MIG device ``gi_id``/``ci_id`` on ``/dev/nvidia<parent_minor>``."""
        major = self.caps_major()
        gi = self._node(self.access_file(parent_minor, gi_id), major)
        ci = self._node(self.access_file(parent_minor, gi_id, ci_id), major)
        return gi, ci

    def _node(self, path: Path, major: int) -> CapNode:
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError as err:
            raise InventoryError(
                f"{path} does not exist: is the MIG device gone (destroyed since it was "
                "listed), or is --proc-root not the host's /proc?"
            ) from err
        except OSError as err:
            raise InventoryError(
                f"cannot read {path}: {err.strerror or err}; is --proc-root the host's /proc?"
            ) from err
        try:
            minor, mode = parse_access(text)
        except ValueError as err:
            raise InventoryError(
                f"{path}: {err} (expected 'DeviceFileMinor: N' and 'DeviceFileMode: M'); "
                "is this an NVIDIA driver capability file?"
            ) from err
        return CapNode.for_minor(major, minor, mode)
