"""A claim's MPS shares asked of the mps-agent while its PrepareStarted entry is written.

A prepare records PrepareStarted (a write the kernel must make durable) before its
side effects, so that a crash leaves a trace to undo. An MPS share's ensure is the
one side effect that needs no such trace: the mps-agent records every share in its
own state, and the plugin's start-up reconcile releases each share that no claim
of the checkpoint owns (:meth:`~dra_driver.plugin.enforcement.Enforcer.release_orphan_shares`).
So the ensure of a plain MPS share (one of a whole GPU, not inside a MIG instance,
whose MIG changes keep the write-ahead order) starts as soon as the claim is
decided, and runs while the entry is written; the prepare then takes its answer
instead of asking again. On one call at a time that hides the checkpoint write
(1.2-1.4 ms with fsync in ``hack/bench/prepare.py``) behind the agent's ensure.

An unprepare likewise releases a plain share of a legacy daemon while the entry's
removal is written (:meth:`~dra_driver.plugin.driver.Driver._unprepare_claim`): the
kubelet unprepares a claim only once its containers are gone, and if the write fails
the entry stays for the kubelet's retry, whose release of a released share is a
no-op. A plain share of an MPS v3 daemon is released later still, once the entry is
gone and the calls pause (:mod:`~dra_driver.plugin.deferred_releases`).

What could go wrong, and what happens:

* the entry's write fails: the claim fails, and the shares ensured for it are
  released (:meth:`EarlyShares.abandon`);
* the plugin dies between the ensure and the write: the share is the agent's
  alone, and the next start releases it (the kubelet's retry ensures it again);
* an ensure fails: the prepare fails at that share as it would have, and the
  shares ensured before it are released with the claim's other side effects.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any

from dra_driver.base.errors import DriverError
from dra_driver.base.ids import ClaimRef
from dra_driver.core.cdi import ContainerEdits
from dra_driver.core.prepare import (
    MigInstance,
    MpsInMig,
    MpsNamespace,
    MpsShare,
    PlannedDevice,
    mps_daemon_conflict,
    mps_namespaces,
)

log = logging.getLogger(__name__)

Ensure = Callable[[ClaimRef, MpsNamespace], Coroutine[Any, Any, ContainerEdits]]
"""Ask the agent for one namespace of the claim (its GPU's daemon); its CDI edits."""
Release = Callable[[MpsNamespace], Awaitable[None]]
"""Release one namespace's share at the agent."""


class EarlyShares:
    """One prepare's shares started early: :meth:`start` on the decision, :meth:`take`
    by the side effects, :meth:`abandon` for whatever was not taken."""

    def __init__(self, claim: ClaimRef, ensure: Ensure, release: Release) -> None:
        self.claim = claim
        self._ensure = ensure
        self._release = release
        self._tasks: dict[MpsNamespace, asyncio.Task[ContainerEdits]] = {}
        self._planned: tuple[Sequence[PlannedDevice], tuple[MpsNamespace, ...]] | None = None

    @property
    def started(self) -> int:
        """How many ensures were started early (tests, logs)."""
        return len(self._tasks)

    def start(self, devices: Sequence[PlannedDevice]) -> None:
        """Start the ensure of each of ``devices``' namespaces, when every side effect
        of theirs is a plain MPS share (anything else keeps the write-ahead order).
        On the event loop; never raises (a claim that cannot be served is left to
        the side effects, which fail it with their message)."""
        if not plain_mps(devices):
            return
        namespaces = mps_namespaces(devices)
        self._planned = devices, namespaces
        if mps_daemon_conflict(namespaces) is not None or any(n.key is None for n in namespaces):
            return
        for namespace in namespaces:
            if namespace not in self._tasks:
                self._tasks[namespace] = asyncio.create_task(
                    self._ensure(self.claim, namespace), name=f"early-share-{self.claim.uid}"
                )

    def namespaces(self, devices: Sequence[PlannedDevice]) -> tuple[MpsNamespace, ...] | None:
        """The namespaces :meth:`start` computed, when ``devices`` is the very sequence
        it was given (the side effects then need not compute them again); else None."""
        planned = self._planned
        return planned[1] if planned is not None and planned[0] is devices else None

    async def take(self, namespace: MpsNamespace) -> ContainerEdits | None:
        """The early ensure's edits for ``namespace`` (its error raised); None when
        none was started for it (the caller ensures it itself)."""
        task = self._tasks.pop(namespace, None)
        if task is None:
            return None
        return await task

    async def abandon(self) -> None:
        """Wait for the ensures not taken and release the shares they made (the claim
        failed before its side effects took them). Logged, never raised."""
        tasks, self._tasks = self._tasks, {}
        for namespace, task in tasks.items():
            try:
                await task
            except Exception:  # never made (the agent undoes its own failed ensure)
                continue
            try:
                await self._release(namespace)
                log.info(
                    "claim %s: released MPS share %s ensured before its prepare failed",
                    self.claim,
                    namespace.key,
                )
            except DriverError as err:
                # The agent keeps it until the plugin's next start releases it as an
                # orphan (no claim of the checkpoint owns it).
                log.error(
                    "claim %s: releasing MPS share %s after its prepare failed: %s",
                    self.claim,
                    namespace.key,
                    err,
                )

    def abandon_later(self) -> None:
        """:meth:`abandon` in a task of its own (the caller is being cancelled)."""
        if self._tasks:
            task = asyncio.get_running_loop().create_task(self.abandon())
            _background.add(task)
            task.add_done_callback(_background.discard)


_background: set[asyncio.Task[None]] = set()


def plain_mps(devices: Sequence[PlannedDevice]) -> bool:
    """``devices`` have MPS shares of whole GPUs and no MIG side effect: what may be
    ensured before PrepareStarted is on disk, or released before the entry's removal
    is (a MIG instance's changes keep the write-ahead order)."""
    return any(isinstance(d, MpsShare) for d in devices) and not any(
        isinstance(d, MpsInMig | MigInstance) for d in devices
    )
