"""The plugin's checkpoint: which claims are prepared, and how.

Our own versioned schema (never upstream types, whose new fields would change
the checksum). The file is::

    {"kind": "FractionalGpuDraCheckpoint", "version": 2,
     "checksum": "sha256:<hex of the canonical JSON of data>",
     "data": {"bootId": "...", "claims": {"<uid>": {...}}}}

Claims go through two phases: ``PrepareStarted`` is recorded before any side
effect (CDI spec), ``PrepareCompleted`` after all of them; an entry still
``PrepareStarted`` at start-up is a prepare that died half-way and is rolled
back. The boot id ties entries to one boot: after a reboot nothing prepared
survives (device nodes, MIG instances and /var/run/cdi are gone), so a
checkpoint from another boot is read as empty.

Decoding is lenient about unknown fields (a newer driver may add some and a
downgrade must still read the file) and strict about the checksum and about
the values it interprets: a new ``state`` or ``mode`` value is a schema change,
so a release that adds one bumps ``VERSION`` and converts older files forward
(:data:`DEVICE_READERS`: version 1 files are read as the device variants of
version 2); an older driver then says which release wrote the file instead of
guessing.
"""

from __future__ import annotations

import enum
import hashlib
import json
import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from dra_driver.base.errors import CheckpointCorruptError, CheckpointError
from dra_driver.base.ids import ClaimRef, ClaimUID, DeviceName
from dra_driver.base.kept_encodings import KeptEncodings
from dra_driver.core.prepare import HeldDevice, PlannedDevice
from dra_driver.state.checkpoint_devices import device_from_json, device_from_v1, device_to_json
from dra_driver.state.files import atomic_write

log = logging.getLogger(__name__)

KIND = "FractionalGpuDraCheckpoint"
VERSION = 2
"""The format this driver writes. 2: each device's ``mode`` names its variant
(:mod:`dra_driver.state.checkpoint_devices`); 1: one record for every mode."""

DEVICE_READERS: Mapping[int, Callable[[Mapping[str, Any]], PlannedDevice]] = {
    1: device_from_v1,
    2: device_from_json,
}
"""The formats this driver reads, each with its device reader: version 1 files (of
earlier releases) are read forward, and written as version 2 by the next save."""


class ClaimState(enum.StrEnum):
    PREPARE_STARTED = "PrepareStarted"
    PREPARE_COMPLETED = "PrepareCompleted"


@dataclass(frozen=True)
class CheckpointClaim:
    ref: ClaimRef
    state: ClaimState
    devices: tuple[PlannedDevice, ...] = ()
    cdi_spec_file: str | None = None
    """Absolute path of the claim's transient CDI spec."""
    cdi_spec: Mapping[str, Any] | None = None
    """The rendered spec, so a missing file can be rewritten without re-planning."""


@dataclass(frozen=True)
class Checkpoint:
    boot_id: str
    claims: Mapping[ClaimUID, CheckpointClaim] = field(default_factory=dict)

    def with_claim(self, claim: CheckpointClaim) -> Checkpoint:
        return replace(self, claims={**self.claims, claim.ref.uid: claim})

    def without(self, *uids: ClaimUID) -> Checkpoint:
        return replace(self, claims={u: c for u, c in self.claims.items() if u not in uids})

    def device_uses(self) -> dict[DeviceName, list[HeldDevice]]:
        """Devices held by recorded claims, for the plan's guards."""
        uses: dict[DeviceName, list[HeldDevice]] = {}
        for claim in self.claims.values():
            for device in claim.devices:
                uses.setdefault(device.device_name, []).append(HeldDevice(claim.ref.uid, device))
        return uses


# --- encoding -----------------------------------------------------------------


def _claim_to_json(c: CheckpointClaim) -> dict[str, Any]:
    return {
        "namespace": c.ref.namespace,
        "name": c.ref.name,
        "uid": c.ref.uid,
        "state": c.state.value,
        "devices": [device_to_json(d) for d in c.devices],
        "cdiSpecFile": c.cdi_spec_file,
        "cdiSpec": c.cdi_spec,
    }


def _canonical(data: Mapping[str, Any]) -> bytes:
    return json.dumps(data, sort_keys=True, separators=(",", ":")).encode()


Fragments = KeptEncodings[ClaimUID, "CheckpointClaim", bytes]
"""Each claim's member of ``claims`` (its uid, a colon, its canonical JSON), kept by
:class:`CheckpointStore` between writes."""


def _member(uid: ClaimUID, claim: CheckpointClaim) -> bytes:
    return json.dumps(uid).encode() + b":" + _canonical(_claim_to_json(claim))


def encode(checkpoint: Checkpoint, fragments: Fragments | None = None) -> bytes:
    """The file: compact JSON, keys sorted, ``data`` in its canonical form.

    ``data``'s bytes are its canonical JSON (what the checksum covers), built
    from each claim's canonical fragment; ``fragments`` keeps them between
    writes, so a write re-encodes only the claims that changed (a claim entry
    is immutable: the same object is the same JSON).
    """
    kept = fragments if fragments is not None else Fragments()
    parts = kept.encode_all(sorted(checkpoint.claims.items()), _member)
    data = b'{"bootId":%s,"claims":{%s}}' % (
        json.dumps(checkpoint.boot_id).encode(),
        b",".join(parts),
    )
    checksum = "sha256:" + hashlib.sha256(data).hexdigest()
    head = b'{"checksum":%s,"data":' % json.dumps(checksum).encode()
    tail = b',"kind":%s,"version":%s}\n' % (json.dumps(KIND).encode(), json.dumps(VERSION).encode())
    return head + data + tail


def _claim_from_json(
    raw: Mapping[str, Any], device_from_json: Callable[[Mapping[str, Any]], PlannedDevice]
) -> CheckpointClaim:
    return CheckpointClaim(
        ref=ClaimRef(raw["namespace"], raw["name"], ClaimUID(raw["uid"])),
        state=ClaimState(raw["state"]),
        devices=tuple(device_from_json(d) for d in raw.get("devices") or ()),
        cdi_spec_file=raw.get("cdiSpecFile"),
        cdi_spec=raw.get("cdiSpec"),
    )


def decode(blob: bytes, where: str) -> Checkpoint:
    """Parse and verify a checkpoint file's bytes; ``where`` names it in errors."""
    fix = f"move {where} aside and restart the plugin; the kubelet prepares the claims again"
    try:
        doc = json.loads(blob)
    except ValueError as err:
        raise CheckpointCorruptError(
            f"checkpoint {where} is not valid JSON ({err}); {fix}"
        ) from err
    if not isinstance(doc, dict) or doc.get("kind") != KIND:
        raise CheckpointCorruptError(f"checkpoint {where} is not a {KIND} document; {fix}")
    version = doc.get("version")
    devices = DEVICE_READERS.get(version) if isinstance(version, int) else None
    if devices is None:
        later = isinstance(version, int) and version > VERSION
        raise CheckpointError(
            f"checkpoint {where} has version {version!r}; this driver reads versions "
            f"{', '.join(map(str, sorted(DEVICE_READERS)))}. It was written by "
            + ("a later driver release: run that release again" if later else "another driver")
            + ", or "
            + fix
        )
    data = doc.get("data")
    if not isinstance(data, dict):
        raise CheckpointCorruptError(f"checkpoint {where} has no data; {fix}")
    expected = "sha256:" + hashlib.sha256(_canonical(data)).hexdigest()
    if doc.get("checksum") != expected:
        raise CheckpointCorruptError(
            f"checkpoint {where} fails its checksum (stored {doc.get('checksum')!r}, "
            f"computed {expected!r}): the file was modified or truncated; {fix}"
        )
    try:
        claims = {
            ClaimUID(uid): _claim_from_json(raw, devices)
            for uid, raw in (data.get("claims") or {}).items()
        }
        return Checkpoint(boot_id=str(data.get("bootId", "")), claims=claims)
    except (AttributeError, KeyError, TypeError, ValueError) as err:
        raise CheckpointCorruptError(
            f"checkpoint {where} has a malformed entry ({err!r}); {fix}"
        ) from err


# --- the file -------------------------------------------------------------------


def read_boot_id(path: str = "/proc/sys/kernel/random/boot_id") -> str:
    try:
        with open(path, encoding="ascii") as handle:
            return handle.read().strip()
    except OSError as err:
        raise CheckpointError(f"cannot read the boot id from {path}: {err}") from err


class CheckpointStore:
    """Reads and writes the checkpoint file.

    Callers hold the node lock (:mod:`dra_driver.state.locks`) around a
    load, mutate, save sequence: another plugin process may share the file
    during a rolling update, so every sequence starts with :meth:`load`.
    Re-parsing is skipped when the bytes on disk are the ones we wrote last.
    """

    def __init__(self, path: str, boot_id: str) -> None:
        self.path = path
        self.boot_id = boot_id
        self._last: tuple[bytes, Checkpoint] | None = None
        self._fragments = Fragments()

    def exists(self) -> bool:
        """Whether the checkpoint file is there (:meth:`load` reads a missing one as empty)."""
        return os.path.exists(self.path)

    def load(self) -> Checkpoint:
        try:
            with open(self.path, "rb") as handle:
                blob = handle.read()
        except FileNotFoundError:
            return Checkpoint(boot_id=self.boot_id)
        except OSError as err:
            raise CheckpointError(f"cannot read checkpoint {self.path}: {err}") from err
        if self._last is not None and self._last[0] == blob:
            return self._last[1]
        checkpoint = decode(blob, self.path)
        if checkpoint.boot_id != self.boot_id:
            log.warning(
                "checkpoint %s is from another boot (%s, now %s): its %d claim(s) are not "
                "trusted and will be prepared again",
                self.path,
                checkpoint.boot_id,
                self.boot_id,
                len(checkpoint.claims),
            )
            checkpoint = Checkpoint(boot_id=self.boot_id)
        self._last = (blob, checkpoint)
        return checkpoint

    def save(self, checkpoint: Checkpoint) -> None:
        blob = encode(checkpoint, self._fragments)
        try:
            atomic_write(self.path, blob, mode=0o600)
        except OSError as err:
            raise CheckpointError(f"cannot write checkpoint {self.path}: {err}") from err
        self._last = (blob, checkpoint)
