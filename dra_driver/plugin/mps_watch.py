"""Legacy MPS: an MPS client waiting on another UID's server, from the mps-agent to listeners.

Legacy MPS runs one server per GPU, as one Linux UID at a time: a client of
another UID waits, silently, until every client of the running server's UID has
exited (dra-facts 10.1). The mps-agent sees it (``DaemonStatus.server_uid`` and
``waiting_uids``) but has no API access; the health monitor reads the agent's
status every interval and hands it to :meth:`MpsUidWatch.update`, which turns
it into calls on its listeners (the runtime wires the
:class:`~dra_driver.plugin.claim_reporting.ClaimReporter`, which records the
Events):

* :meth:`MpsUidWaitListener.mps_uid_waiting` at every poll while a GPU's wait
  lasts (the Event recorder's rate limit keeps that to one Event per interval,
  counted on the Event written before);
* :meth:`MpsUidWaitListener.mps_uid_wait_cleared` once, when it is over (the
  agent reports nothing waiting on that GPU, or no longer reports the GPU).

Which claims wait: while a wait lasts the watch reads the agent's share list;
a share whose recorded UID is one of the waiting UIDs is a waiting claim's.
When a share of that GPU has no UID recorded (the plugin does not pass one
today) or the list cannot be read, :attr:`MpsUidWait.claim_uids` is None: any
MPS claim on the GPU may be the one waiting, and the listener tells them all.

Not a health problem: the devices' health (kubelet stream, taints, the claims'
``DeviceHealthy`` condition) is left alone. The GPU and its daemon work; the
waiting pod's containers are held by the scheduling of its UID, which ends by
itself when the serving UID's pods exit, and which marking the device
Unhealthy would make worse (its taint would keep new pods, of the right UID
too, off a working GPU). A Warning Event on the Node and on the claims is what
an operator and the pod's owner see.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from dra_driver.base.errors import DriverError
from dra_driver.mpsagent.port import MpsAgentPort
from dra_driver.mpsagent.protocol import AgentStatus, DaemonStatus, ProtocolError, ShareInfo

log = logging.getLogger(__name__)

FIX = (
    "Run the pods that share this GPU as one UID (securityContext.runAsUser), or use MPS v3 "
    "on a whole GPU (driver 615+, mps-agent --mps-protocol=v3; a MIG instance's MPS daemon "
    "is always legacy) or a MIG device"
)
"""What ends a legacy MPS UID wait for good."""


def _uids(uids: Iterable[int]) -> str:
    return ", ".join(str(u) for u in uids)


@dataclass(frozen=True)
class MpsUidWait:
    """Clients of ``waiting_uids`` wait on GPU ``gpu_uuid``'s server of ``server_uid``."""

    gpu_uuid: str
    server_uid: int | None
    """None when the agent did not say (it always does today)."""
    waiting_uids: tuple[int, ...]
    claim_uids: frozenset[str] | None = None
    """Claims whose share's client UID is one of ``waiting_uids``, from the agent's share
    list; None when that is not known (a share of the GPU has no UID recorded, or the
    list could not be read): every MPS claim on the GPU may be waiting."""

    @property
    def key(self) -> tuple[int | None, tuple[int, ...]]:
        """What makes it a new wait: the serving UID and the set of waiting UIDs."""
        return self.server_uid, self.waiting_uids

    def describe(self) -> str:
        """The wait and its fix (without the GPU): Event messages build on it."""
        server = f"UID {self.server_uid}" if self.server_uid is not None else "another UID"
        return (
            f"legacy MPS serves one UID at a time: its MPS server runs as {server}, and "
            f"client(s) of UID {_uids(self.waiting_uids)} wait until every client of "
            f"{server} has exited. {FIX}"
        )


class MpsUidWaitListener(Protocol):
    def mps_uid_waiting(self, wait: MpsUidWait) -> None:
        """At every poll while ``wait`` lasts; must not block."""
        ...

    def mps_uid_wait_cleared(self, wait: MpsUidWait) -> None:
        """Once, when the wait last seen as ``wait`` is over; must not block."""
        ...


def waiting_claims(
    gpu_uuid: str, waiting_uids: Sequence[int], shares: Iterable[ShareInfo]
) -> frozenset[str] | None:
    """Claim UIDs of ``gpu_uuid``'s shares whose UID waits; None when a share's UID is unknown."""
    on_gpu = [s for s in shares if s.gpu_uuid == gpu_uuid]
    if any(s.uid is None for s in on_gpu):
        return None
    return frozenset(s.claim_uid for s in on_gpu if s.uid in waiting_uids)


class MpsUidWatch:
    """Turns the mps-agent's status into UID-wait calls; see the module docstring.

    ``shares``: where to read the share → UID mapping (None: not read, every MPS
    claim on a waiting GPU is told).
    """

    def __init__(
        self,
        shares: MpsAgentPort | None = None,
        listeners: list[MpsUidWaitListener] | None = None,
    ) -> None:
        self.shares = shares
        self.listeners: list[MpsUidWaitListener] = listeners if listeners is not None else []
        self.waits: dict[str, MpsUidWait] = {}
        """GPU UUID → its wait, as of the last :meth:`update`."""

    async def update(self, status: AgentStatus) -> None:
        """Follow one status read from the agent (call it with every successful read)."""
        found = {d.gpu_uuid: d for d in status.daemons if d.waiting_uids}
        shares = await self._shares() if found else None
        now = {gpu: self._wait(d, shares) for gpu, d in found.items()}
        for gpu, wait in sorted(self.waits.items()):
            if gpu not in now:
                log.info(
                    "GPU %s: no MPS client waits on another UID's server now (UID %s waited "
                    "on UID %s)",
                    gpu,
                    _uids(wait.waiting_uids),
                    wait.server_uid,
                )
                self._tell(wait, cleared=True)
        for gpu, wait in sorted(now.items()):
            before = self.waits.get(gpu)
            if before is None or before.key != wait.key:
                log.info(
                    "GPU %s: %s (recording Events on the Node and claims)", gpu, wait.describe()
                )
            self._tell(wait)
        self.waits = now

    async def _shares(self) -> list[ShareInfo] | None:
        if self.shares is None:
            return None
        try:
            return await self.shares.list_shares()
        except (DriverError, ProtocolError) as err:
            log.warning(
                "cannot read the mps-agent's shares (%s): every MPS claim on a GPU where a "
                "client waits on another UID is told",
                err,
            )
            return None

    @staticmethod
    def _wait(daemon: DaemonStatus, shares: list[ShareInfo] | None) -> MpsUidWait:
        waiting = tuple(sorted(set(daemon.waiting_uids)))
        return MpsUidWait(
            gpu_uuid=daemon.gpu_uuid,
            server_uid=daemon.server_uid,
            waiting_uids=waiting,
            claim_uids=None if shares is None else waiting_claims(daemon.gpu_uuid, waiting, shares),
        )

    def _tell(self, wait: MpsUidWait, *, cleared: bool = False) -> None:
        for listener in list(self.listeners):
            try:
                if cleared:
                    listener.mps_uid_wait_cleared(wait)
                else:
                    listener.mps_uid_waiting(wait)
            except Exception:  # telling must never end the health checks
                log.exception("MPS UID-wait listener %r failed", listener)
