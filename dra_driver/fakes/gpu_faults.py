"""Fault injection for the fake GPU backend from outside the process: a directory of requests.

With ``--backend fake`` the kubelet plugin watches a directory (``--fake-health-dir``,
env ``FAKE_HEALTH_DIR``; default ``<plugin dir>/fake-health``, which the chart's
hostPath puts on the node; ignored with ``--backend nvml``). Each file dropped
there is one request, a JSON object. It is applied once and renamed
``<name>.done``; a file that is no valid request is renamed ``<name>.bad`` and
the plugin logs what is wrong and how to fix it. The directory is checked every
0.5 s, files in the order they were written (modification time, then name).

Requests; ``gpu`` names a GPU by device name (``"gpu-1"``), UUID (``"GPU-..."``)
or index (``1``)::

    {"gpu": "gpu-1", "xid": 79}                   XID 79 on the GPU, as NVML reports it
    {"gpu": "gpu-2", "xid": 94, "mig": 1}         ... on one of its MIG devices: GPU-instance
                                                  id, or MIG UUID ("MIG-...")
    {"gpu": "gpu-1", "xid": 79, "message": "x"}   ... with the text NVML would add
    {"gpu": "gpu-1", "xid": 0}                    the GPU's event source failed
    {"gpu": "gpu-1", "lost": true}                the liveness probe finds the GPU gone
                                                  (fallen off the bus); "message" optional
    {"gpu": "gpu-1", "restore": true}             ... answering again (seen as a reset)
    {"gpu": "gpu-1", "reset": true}               the GPU is reset: the next probe finds it
                                                  resetting, the one after answering; this
                                                  clears a fatal XID
    {"restore": true}, {"reset": true}            without "gpu": every GPU

An XID reaches the health monitor at once; ``lost``, ``restore`` and ``reset``
act through the liveness probe, so they are seen at the next probe
(``--health-probe-interval``; a reset needs two).

Names starting with ``.`` or ending in ``.tmp``, ``.done`` or ``.bad`` are
skipped: write ``x.json.tmp`` and rename it to ``x.json`` so that the plugin
never reads half a file (a file that is not valid JSON yet and changed in the
last 2 s is read again later, so a plain ``echo ... > x.json`` works too). On a
node, or in the kubelet-plugin pod (the directory is mounted at the same path)::

    echo '{"gpu": "gpu-1", "xid": 79}' \\
        > /var/lib/kubelet/plugins/gpu.fractional.dev/fake-health/xid79.json
"""

from __future__ import annotations

import asyncio
import enum
import json
import logging
import os
import stat
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from dra_driver.base.ids import MigUUID
from dra_driver.core.model import GpuInfo

log = logging.getLogger(__name__)

DIR_NAME = "fake-health"
"""The directory's name under the plugin dir, by default."""
POLL_S = 0.5
SETTLE_S = 2.0
"""A file younger than this that is not valid JSON yet may still be being written."""
DONE, BAD = ".done", ".bad"
SKIPPED_SUFFIXES = (".tmp", DONE, BAD)

EXAMPLE = '{"gpu": "gpu-1", "xid": 79}'
_KEYS = ("gpu", "xid", "mig", "message", "lost", "restore", "reset")


class FaultFileError(ValueError):
    """A request file that cannot be applied; the message says how to fix it."""

    def __init__(self, message: str, *, incomplete: bool = False) -> None:
        super().__init__(message)
        self.incomplete = incomplete
        """Not valid JSON: perhaps still being written."""


class FaultKind(enum.StrEnum):
    XID = "xid"
    LOST = "lost"
    RESTORE = "restore"
    RESET = "reset"


GpuRef = str | int
"""A GPU as a request names it: device name, UUID or index."""


@dataclass(frozen=True)
class Fault:
    """One request of the directory, checked for form (the GPUs are checked when applied)."""

    kind: FaultKind
    gpu: GpuRef | None
    """None: every GPU (restore and reset only)."""
    xid: int = 0
    mig: GpuRef | None = None
    """A MIG device of ``gpu``: GPU-instance id or MIG UUID (XIDs only)."""
    message: str = ""


def _ref(value: object, key: str, example: str) -> GpuRef:
    if isinstance(value, str) and value.strip():
        return value.strip()
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    raise FaultFileError(f'"{key}" must be {example}, not {json.dumps(value)}')


def _kind(doc: dict[str, object]) -> FaultKind:
    kinds = [kind for kind in FaultKind if kind.value in doc]
    if len(kinds) != 1:
        raise FaultFileError(
            "give exactly one of xid, lost, restore, reset"
            + (f" (found {', '.join(kinds)})" if kinds else "")
            + f", e.g. {EXAMPLE}"
        )
    (kind,) = kinds
    if kind is not FaultKind.XID and doc[kind.value] is not True:
        raise FaultFileError(f'"{kind}" must be true, not {json.dumps(doc[kind.value])}')
    return kind


def parse_fault(text: str) -> Fault:
    """One request file's content; raises FaultFileError saying what to write instead."""
    try:
        doc = json.loads(text)
    except ValueError as err:
        raise FaultFileError(
            f"not JSON ({err}); write one object such as {EXAMPLE}", incomplete=True
        ) from None
    if not isinstance(doc, dict):
        raise FaultFileError(f"expected a JSON object such as {EXAMPLE}, not {text.strip()[:60]}")
    unknown = sorted(str(k) for k in doc if k not in _KEYS)
    if unknown:
        raise FaultFileError(f"unknown keys {', '.join(unknown)}; allowed: {', '.join(_KEYS)}")
    kind = _kind(doc)
    gpu_example = '"gpu-1", a UUID "GPU-..." or an index such as 1'
    if "gpu" in doc:
        gpu: GpuRef | None = _ref(doc["gpu"], "gpu", gpu_example)
    elif kind in (FaultKind.XID, FaultKind.LOST):
        raise FaultFileError(f'"{kind}" needs "gpu": {gpu_example}, e.g. {EXAMPLE}')
    else:
        gpu = None
    if "mig" in doc and kind is not FaultKind.XID:
        raise FaultFileError(f'"mig" goes with "xid" only; {kind} acts on the whole GPU')
    if "message" in doc and kind not in (FaultKind.XID, FaultKind.LOST):
        raise FaultFileError(f'"message" goes with "xid" or "lost", not with "{kind}"')
    message = doc.get("message", "")
    if not isinstance(message, str):
        raise FaultFileError(f'"message" must be a string, not {json.dumps(message)}')
    xid = doc.get("xid", 0)
    if isinstance(xid, bool) or not isinstance(xid, int) or xid < 0:
        raise FaultFileError(
            f'"xid" must be a whole number such as 79 (0: the event source failed), '
            f"not {json.dumps(xid)}"
        )
    mig = doc.get("mig")
    if mig is not None:
        mig = _ref(mig, "mig", 'a GPU-instance id such as 1 or a MIG UUID "MIG-..."')
    return Fault(kind=kind, gpu=gpu, xid=xid, mig=mig, message=message)


def gpu_index(gpus: Sequence[GpuInfo], ref: GpuRef) -> int:
    """The position of the GPU ``ref`` names; FaultFileError listing the GPUs if none."""
    for position, gpu in enumerate(gpus):
        if ref in (position, gpu.uuid, gpu.device_name):
            return position
    known = ", ".join(f"{gpu.device_name} ({gpu.uuid})" for gpu in gpus)
    raise FaultFileError(
        f"no GPU {json.dumps(ref)} here; name one by device name, UUID or index "
        f"0-{len(gpus) - 1}: {known}"
    )


def mig_uuid(gpu: GpuInfo, ref: GpuRef) -> MigUUID:
    """The MIG device of ``gpu`` that ``ref`` names (GI id or UUID); FaultFileError if none."""
    for device in gpu.mig_devices:
        if ref in (device.gi_id, device.uuid):
            return device.uuid
    known = ", ".join(f"{d.gi_id} ({d.uuid}, {d.profile_name})" for d in gpu.mig_devices)
    raise FaultFileError(
        f"GPU {gpu.device_name} has no MIG device {json.dumps(ref)}; "
        + (
            f"its MIG devices by GPU-instance id: {known}"
            if known
            else 'it has none (omit "mig" for the whole GPU)'
        )
    )


@dataclass(frozen=True)
class _Found:
    name: str
    path: str
    text: str
    age_s: float
    identity: tuple[int, int]
    """Inode and modification time: the same file is never applied twice."""


class FaultDirWatcher:
    """Polls ``directory`` and hands each request to ``apply`` (which returns what it did).

    ``apply`` raises FaultFileError for a request the backend cannot follow
    (an unknown GPU). Nothing here ends the plugin: every failure is logged.
    """

    def __init__(
        self, directory: str, apply: Callable[[Fault], str], interval: float = POLL_S
    ) -> None:
        self.directory = directory
        self.apply = apply
        self.interval = interval
        self._handled: set[tuple[int, int]] = set()
        """Files applied or refused that could not be renamed."""
        self._dir_problem: str | None = None

    async def run(self) -> None:
        """Poll until cancelled."""
        log.info(
            "fake backend: applying fault-injection files dropped in %s (see "
            "dra_driver/fakes/gpu_faults.py for the format, e.g. %s)",
            self.directory,
            EXAMPLE,
        )
        while True:
            try:
                await self.poll_once()
            except Exception:  # a bug here must not end the watcher
                log.exception("fake backend: checking %s failed; trying again", self.directory)
            await asyncio.sleep(self.interval)

    async def poll_once(self) -> list[str]:
        """Apply what is there now; returns the names of the files handled."""
        found = await asyncio.to_thread(self._scan)
        return [item.name for item in found if self._handle(item)]

    def _handle(self, item: _Found) -> bool:
        """Apply one file and rename it; False: look at it again later.

        Applying and renaming happen with no await between them, so that a
        plugin stopping now never leaves a file applied but not renamed.
        """
        try:
            what = self.apply(parse_fault(item.text))
        except FaultFileError as err:
            if err.incomplete and item.age_s < SETTLE_S:
                return False  # perhaps half-written; read it again at the next poll
            renamed = self._rename(item, BAD)
            log.error(
                "fake backend: %s: %s; %s (drop a new file to try again)",
                item.path,
                err,
                f"renamed it {item.name + BAD}" if renamed else "ignoring it",
            )
            return True
        self._rename(item, DONE)
        log.info("fake backend: %s: %s", item.path, what)
        return True

    def _rename(self, item: _Found, suffix: str) -> bool:
        try:
            os.replace(item.path, item.path + suffix)
        except OSError as err:
            self._handled.add(item.identity)
            log.warning(
                "fake backend: cannot rename %s to %s: %s; it will not be applied again "
                "while the plugin runs, but delete it before the next start",
                item.path,
                item.name + suffix,
                err,
            )
            return False
        return True

    def _scan(self) -> list[_Found]:
        """The request files now in the directory, oldest first (runs in a thread)."""
        try:
            os.makedirs(self.directory, exist_ok=True)
            names = os.listdir(self.directory)
        except OSError as err:
            problem = str(err)
            if problem != self._dir_problem:
                log.warning(
                    "fake backend: cannot read the fault-injection directory %s: %s; set "
                    "--fake-health-dir (FAKE_HEALTH_DIR) to a writable directory",
                    self.directory,
                    err,
                )
            self._dir_problem = problem
            return []
        self._dir_problem = None
        now = time.time()
        found: list[tuple[int, _Found]] = []
        for name in names:
            if name.startswith(".") or name.endswith(SKIPPED_SUFFIXES):
                continue
            path = os.path.join(self.directory, name)
            try:
                st = os.stat(path)
                if not stat.S_ISREG(st.st_mode) or (st.st_ino, st.st_mtime_ns) in self._handled:
                    continue
                with open(path, encoding="utf-8", errors="replace") as handle:
                    text = handle.read(64 * 1024)
            except OSError:
                continue  # gone meanwhile, or unreadable: looked at again next time
            identity = (st.st_ino, st.st_mtime_ns)
            item = _Found(name, path, text, now - st.st_mtime, identity)
            found.append((st.st_mtime_ns, item))
        found.sort(key=lambda pair: (pair[0], pair[1].name))
        return [item for _, item in found]


def describe(fault: Fault, gpu: str | None, mig: str | None = None) -> str:
    """What applying ``fault`` did, for the log (``gpu``: the GPU as resolved)."""
    where = f"GPU {gpu}" if gpu is not None else "every GPU"
    if mig is not None:
        where += f" MIG device {mig}"
    if fault.kind is FaultKind.XID:
        what = "an event-source failure" if fault.xid == 0 else f"XID {fault.xid}"
        return f"injected {what} on {where}"
    return {
        FaultKind.LOST: f"{where} is lost until restored or reset (seen at the next probe)",
        FaultKind.RESTORE: f"{where} answers again (seen at the next probe)",
        FaultKind.RESET: f"{where} is being reset (seen over the next two probes)",
    }[fault.kind]
