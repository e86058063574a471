"""The agent's record of every live share: ``<state dir>/mps-agent-state.json`` (I/O).

Written atomically after each change; read once when an agent starts, so it can
bring back each GPU's daemon with the recorded shares' namespaces and limits.
The file carries a ``version``; an agent reads a file of another version (an
agent rolled back or forward) for the fields it knows, and says so. The
top-level ``protocol`` (the agent's MPS protocol) is for a person reading the
file: no agent reads it back, each share records the protocol of its own daemon.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable

from dra_driver.base.kept_encodings import KeptEncodings
from dra_driver.mpsagent import protocol as wire
from dra_driver.mpsagent.protocol import MpsProtocol, ShareInfo
from dra_driver.state.files import atomic_write

log = logging.getLogger(__name__)

STATE_FILE = "mps-agent-state.json"
STATE_VERSION = 1


def state_path(state_dir: str) -> str:
    return os.path.join(state_dir, STATE_FILE)


class StateEncoder:
    """The state file's text, each share's JSON kept from the write before.

    A wave's ensures are answered one after another, each once a file holding it is
    written: ten writes of the whole file, of which all but one share is unchanged.
    Encoding every share each time was about 0.13 ms of the agent's CPU a write
    with 18 shares (issue 35, the 2-core machine); a share's text is now made once
    (:class:`~dra_driver.base.kept_encodings.KeptEncodings`: a :class:`ShareInfo`
    is frozen, so a changed share is a new object)."""

    def __init__(self) -> None:
        self._texts: KeptEncodings[tuple[str, str], ShareInfo, str] = KeptEncodings()

    def encode(self, protocol: MpsProtocol, shares: Iterable[ShareInfo]) -> bytes:
        """What ``json.dumps`` of the document, compact, gives (a test holds it to that)."""
        parts = self._texts.encode_all([((s.gpu_uuid, s.share_id), s) for s in shares], _share)
        head = _COMPACT.encode({"version": STATE_VERSION, "protocol": protocol})
        return f'{head[:-1]},"shares":[{",".join(parts)}]}}'.encode()


_COMPACT = json.JSONEncoder(separators=(",", ":"))


def _share(_: tuple[str, str], share: ShareInfo) -> str:
    return _COMPACT.encode(wire.share_to_json(share))


def save_state(
    path: str,
    protocol: MpsProtocol,
    shares: Iterable[ShareInfo],
    encoder: StateEncoder | None = None,
) -> None:
    """Write the state file; ``encoder``: one kept across writes (the agent's)."""
    data = (encoder or StateEncoder()).encode(protocol, shares)
    # Atomic, not fsynced: a killed agent loses nothing (the page cache outlives
    # it), and after an OS crash nothing here matters: the state directory is a
    # tmpfs (the daemons and their namespaces are gone too). An fsync here would
    # stall every GPU's requests, since this runs on the event loop.
    atomic_write(path, data, fsync=False)


def load_state(path: str) -> list[ShareInfo]:
    """The recorded shares; none when there is no file or it is unreadable (logged).

    Lenient: what we wrote ourselves, maybe by a newer or older agent. A file of
    another version is read for the fields this version knows, and said so."""
    try:
        with open(path, "rb") as f:
            doc = json.load(f)
        if not isinstance(doc, dict) or not isinstance(doc.get("version"), int):
            raise ValueError("no integer 'version': not a state file an agent wrote")
        shares = [wire.share_from_json(s) for s in doc.get("shares", [])]
    except FileNotFoundError:
        return []
    except (OSError, ValueError) as err:
        log.error("ignoring unreadable MPS agent state %s: %s", path, err)
        return []
    if doc["version"] != STATE_VERSION:
        log.warning(
            "MPS agent state %s is of version %d, this agent writes version %d: "
            "reading the fields it knows (an agent rolled %s)",
            path,
            doc["version"],
            STATE_VERSION,
            "back" if doc["version"] > STATE_VERSION else "forward",
        )
    return shares


def relaid(recorded: ShareInfo, current: ShareInfo) -> ShareInfo:
    """The record to keep for a share an earlier agent recorded, given how this agent
    lays it out (``current``: its daemon's protocol, namespace and directories)."""
    if recorded == current:
        return recorded
    if recorded.protocol == current.protocol:
        # An earlier agent's directory layout (long names, see .migrate).
        log.warning(
            "share %s on GPU %s moves from %s to %s (the short directory layout); "
            "its running containers keep the old mounts and reach no MPS daemon "
            "until they restart",
            recorded.share_id,
            recorded.gpu_uuid,
            recorded.pipe_dir,
            current.pipe_dir,
        )
    else:
        log.warning(
            "share %s on GPU %s was made under %s MPS; the agent now runs %s there and "
            "re-creates it so (its running containers keep the old mounts)",
            recorded.share_id,
            recorded.gpu_uuid,
            recorded.protocol,
            current.protocol,
        )
    return current
