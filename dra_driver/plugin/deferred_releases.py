"""A plain MPS share's release, sent to the mps-agent in a lull of the plugin's calls.

The kubelet unprepares a claim only once its containers are gone, so a released
share serves no one; and an MPS v3 namespace holds caps, not memory or SMs
(dra-facts 10.1), so a share left a moment longer takes nothing from the next
share of its GPU. So the unprepare of a claim whose side effects are plain MPS
shares of an MPS v3 daemon answers once its checkpoint entry and CDI spec are
gone, and its shares' ``release_share`` requests wait here for a lull in the
plugin's calls, no call in flight (:meth:`~dra_driver.plugin.activity.CallActivity.lull`,
at most its ``max_wait_s``): sent in the middle of an unprepare wave, each would
take the cores from the calls still waiting, on both sides of the agent's socket.
A lull, not a longer pause: the agent then waits for its own quiet spell before
the namespace's ``delete`` (:mod:`dra_driver.mpsagent.agent`), and the two waits
in a row would push that command into the node's next wave.

What keeps it safe:

* a share ensured again (the same claim prepared again, or its key reused) first
  has its pending release sent, or its release in flight finished
  (:meth:`DeferredReleases.settle`), so no release ever follows the new share;
* a claim that uses a GPU other than as an MPS share (a whole GPU, MIG) first has
  that GPU's releases sent (:meth:`DeferredReleases.settle_gpu`): the last one stops
  the GPU's daemon and puts its compute mode back;
* a legacy daemon's share is never deferred (:class:`~dra_driver.plugin.enforcement.Enforcer`
  decides): a legacy daemon keeps one Kubernetes namespace at a time, and a pending
  release of another namespace's share would refuse the next share;
* MIG side effects keep their order (an instance is destroyed after its daemon
  stopped), so a claim with any is released at once;
* a release the agent refuses, or cannot be sent, is logged at ERROR and tried
  again with backoff while the plugin runs;
* the plugin's close sends what is pending (:meth:`DeferredReleases.flush`); a
  plugin that dies first leaves the shares to the next start, whose reconcile
  releases each share no prepared claim owns
  (:meth:`~dra_driver.plugin.enforcement.Enforcer.release_orphan_shares`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from dra_driver.base.errors import DriverError
from dra_driver.base.ids import ClaimRef
from dra_driver.mpsagent.port import MpsAgentPort
from dra_driver.mpsagent.protocol import ProtocolError

log = logging.getLogger(__name__)

RETRY_FIRST_S = 0.5
RETRY_MAX_S = 30.0

ShareKey = tuple[str, str]
"""(daemon UUID, share id): a share at the agent."""


class DeferredReleases:
    """Releases waiting for :attr:`lull`, sent one at a time in the order deferred."""

    def __init__(self, agent: MpsAgentPort, lull: Callable[[], Awaitable[None]]) -> None:
        """``lull``: returns once no call of the plugin's is in flight (or it waited
        long enough)."""
        self.agent = agent
        self.lull = lull
        self._pending: dict[ShareKey, ClaimRef] = {}
        self._in_flight: dict[ShareKey, asyncio.Future[None]] = {}
        self._sender: asyncio.Task[None] | None = None
        self.failures = 0
        """Releases the agent refused or that could not be sent (each try counts)."""

    @property
    def pending(self) -> int:
        """Releases not sent yet, and those in flight."""
        return len(self._pending) + len(self._in_flight)

    def defer(self, claim: ClaimRef, gpu_uuid: str, share_id: str) -> None:
        """Release ``share_id`` of ``claim`` at ``gpu_uuid``'s daemon once the calls pause."""
        self._pending.setdefault((gpu_uuid, share_id), claim)
        if self._sender is None or self._sender.done():
            self._sender = asyncio.create_task(self._send_pending(), name="deferred-releases")

    def holds_gpu(self, gpu_uuid: str) -> bool:
        """Whether a release of a share at ``gpu_uuid``'s daemon is pending or in flight."""
        return any(k[0] == gpu_uuid for k in self._pending) or any(
            k[0] == gpu_uuid for k in self._in_flight
        )

    async def settle_gpu(self, gpu_uuid: str) -> None:
        """:meth:`settle` each release of a share at ``gpu_uuid``'s daemon."""
        for key in [k for k in (*self._pending, *self._in_flight) if k[0] == gpu_uuid]:
            await self.settle(*key)

    def holds(self, gpu_uuid: str, share_id: str) -> bool:
        """Whether a release of this share is pending or in flight (no await: the
        prepare path asks it of every share)."""
        key = (gpu_uuid, share_id)
        return key in self._pending or key in self._in_flight

    async def settle(self, gpu_uuid: str, share_id: str) -> None:
        """Before this share is ensured again: its pending release is sent now, or the
        one in flight awaited. Raises what the agent answered to a release sent here
        (the ensure would fail on the same agent)."""
        key = (gpu_uuid, share_id)
        while True:
            claim = self._pending.pop(key, None)
            if claim is not None:
                try:
                    await self._send(key, claim)
                except BaseException:
                    self.defer(claim, *key)  # still the agent's: the sender tries again
                    raise
                return
            sending = self._in_flight.get(key)
            if sending is None:
                return
            # Shielded: this ensure's cancellation must not cancel the sender's future.
            # A release that failed there is pending again when this wakes: sent here.
            await asyncio.shield(sending)

    async def flush(self) -> None:
        """Send every pending release now, without a lull, each tried once (the
        plugin's close); one that fails is logged and left to the next start's
        reconcile."""
        sender = self._sender
        if sender is not None and not sender.done():
            sender.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sender
        while self._pending:
            key, claim = next(iter(self._pending.items()))
            del self._pending[key]
            try:
                await self._send(key, claim)
            except Exception as err:
                log.error(
                    "MPS share %s of claim %s on %s was not released before the plugin "
                    "stopped (%s); the next start's reconcile releases it",
                    key[1],
                    claim,
                    key[0],
                    err,
                    exc_info=not isinstance(err, DriverError | ProtocolError),
                )

    async def _send_pending(self) -> None:
        """The sender: while releases are pending, one at a time, each in a lull."""
        backoff = RETRY_FIRST_S
        while self._pending:
            await self.lull()
            if not self._pending:  # settled by a prepare meanwhile
                return
            key, claim = next(iter(self._pending.items()))
            del self._pending[key]
            try:
                await self._send(key, claim)
            except asyncio.CancelledError:
                self._pending.setdefault(key, claim)  # flush sends it, once
                raise
            except Exception as err:  # a bug too: the sender must outlive it
                log.error(
                    "releasing MPS share %s of claim %s on %s failed (retrying in %gs; "
                    "the claim is unprepared and its share serves no one): %s",
                    key[1],
                    claim,
                    key[0],
                    backoff,
                    err,
                    exc_info=not isinstance(err, DriverError | ProtocolError),
                )
                self._pending.setdefault(key, claim)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, RETRY_MAX_S)
                continue
            backoff = RETRY_FIRST_S

    async def _send(self, key: ShareKey, claim: ClaimRef) -> None:
        """One release, marked in flight while it runs; raises the agent's refusal."""
        done = asyncio.get_running_loop().create_future()
        self._in_flight[key] = done
        try:
            await self.agent.release_share(*key)
        except Exception:
            self.failures += 1
            raise
        finally:
            del self._in_flight[key]
            done.set_result(None)
        log.debug("released MPS share %s of unprepared claim %s on %s", key[1], claim, key[0])
