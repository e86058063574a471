"""The shares one live MPS daemon holds: its server, namespaces and limits (I/O
through :class:`.daemon_control.DaemonControl`; the commands come from :mod:`.commands`).

v3 keeps what the daemon holds (the server, the namespaces) in memory, learnt from
its listings after an adoption or a failed command (a half-done earlier attempt),
so an apply sends only what is missing. Legacy MPS has no namespaces: every
change re-sends the limits of all the GPU's shares.

A dead daemon takes its servers, namespaces and limits with it (they live only
in the daemon); :meth:`DaemonShares.restore` re-creates them for the live shares.

Spare namespaces (v3): made ahead of the shares that will take them
(:meth:`DaemonShares.add_spare`, when the agent's calls pause), so a new share's
apply sends only ``namespace set``. A spare made once the agent knows what limits
the GPU's shares ask for (those of the last share made there) has them set ahead
too: a new share asking for the same limits takes such a spare and its apply sends
no command at all (a node's pods on one GPU are mostly replicas of one workload,
each claiming the same share). A share asking for other limits sets its own, as
on a spare made bare. No container can reach a spare: a container is given only
its own namespace's directory, once its share holds it with the share's limits in
force. Spares are not recorded: a restore deletes them with every other namespace
of ours no share holds, and a dead daemon takes them with it.

Several shares' v3 applies and removes run at once (:mod:`.gpu_gate`); each
sends only its own namespace's commands. The server is created once, under a
lock; a listing replaces the known namespaces in one step. The view may lag
behind the daemon (a listing taken while another share's create ran): an apply
or remove that fails looks again and retries, as after a half-done attempt.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Sequence

from dra_driver.mpsagent import commands as cmd
from dra_driver.mpsagent import listing
from dra_driver.mpsagent.commands import ControlCall, Limits, ShareLimits
from dra_driver.mpsagent.daemon_control import DaemonControl
from dra_driver.mpsagent.daemon_files import DaemonError
from dra_driver.mpsagent.layout import spare_namespace_name

log = logging.getLogger(__name__)


class DaemonShares:
    """What one daemon holds, and the commands that change it."""

    def __init__(self, control: DaemonControl, pipe_dir: str) -> None:
        self._control = control
        self._pipe_dir = pipe_dir
        self._server_exists = False
        self._namespaces: set[str] = set()
        self._spares: list[str] = []
        """Namespaces the daemon holds for shares to come (in :attr:`_namespaces` too)."""
        self._preset: dict[str, Limits] = {}
        """Spares whose limits were set ahead, and those limits."""
        self._server_lock = asyncio.Lock()

    @property
    def _gpu_uuid(self) -> str:
        return self._control.gpu_uuid

    @property
    def _v3(self) -> bool:
        return self._control.protocol == "v3"

    def forget(self) -> None:
        """A new daemon holds nothing yet."""
        self._server_exists = False
        self._namespaces = set()
        self._spares = []
        self._preset = {}

    @property
    def spare_count(self) -> int:
        return len(self._spares)

    def take_spare(self, wanted: Limits) -> str | None:
        """A spare namespace for a new share that asks for ``wanted``: one whose limits
        were set to those ahead (its apply then sends nothing), else the oldest (its
        apply sets the limits); None when there is none (v3; legacy daemons have no
        namespaces)."""
        for i, name in enumerate(self._spares):
            if self._preset.get(name) == wanted:
                return self._spares.pop(i)
        return self._spares.pop(0) if self._spares else None

    async def add_spare(self, preset: Limits | None = None) -> bool:
        """Make one spare namespace (v3, once the server exists: a share made it), with
        ``preset``'s limits set when given; False when there is nothing to make it in.
        Raises :class:`DaemonError` when the daemon refuses (a create that half-worked
        is found by a listing and kept; a spare whose limits were refused is kept
        bare, for a share that sets its own)."""
        if not self._v3 or not self._server_exists:
            return False
        name = spare_namespace_name()
        while name in self._namespaces:
            name = spare_namespace_name()
        try:
            await self._control.run(cmd.v3_namespace_create(name))
        except DaemonError:
            await self.refresh()
            if name not in self._namespaces:
                raise
        self._namespaces.add(name)
        # The container's pipe mount needs the directory; made now, off the prepare.
        os.makedirs(self.namespace_dir(name), exist_ok=True)
        if preset is not None:
            try:
                await self._control.run(cmd.v3_namespace_set(preset.of(name)))
            except DaemonError:
                self._spares.append(name)  # bare: a share that takes it sets its limits
                raise
            self._preset[name] = preset
        self._spares.append(name)  # counted once ready to be taken as it is
        return True

    def namespace_dir(self, namespace: str) -> str:
        return cmd.v3_namespace_dir(self._pipe_dir, namespace)

    async def refresh(self) -> None:
        """Learn which server and namespaces the daemon holds (v3)."""
        if not self._v3:
            return
        run = self._control.run
        servers = listing.parse_v3_server_names(await run(cmd.v3_server_list()))
        self._log_problems(servers.problems)
        server_exists = cmd.SERVER_NAME in servers.names
        namespaces: set[str] = set()
        if server_exists:
            spaces = listing.parse_v3_namespace_list(await run(cmd.v3_namespace_list()))
            self._log_problems(spaces.problems)
            namespaces = {r.name for r in spaces.rows if r.server == cmd.SERVER_NAME}
        self._server_exists, self._namespaces = server_exists, namespaces
        self._spares = [name for name in self._spares if name in namespaces]
        self._preset = {n: lim for n, lim in self._preset.items() if n in self._spares}

    def _log_problems(self, problems: Sequence[listing.ListingProblem]) -> None:
        """A listing line not in the documented form costs that line, not the adoption."""
        for problem in problems:
            log.warning("GPU %s: %s", self._gpu_uuid, problem)

    async def restore(self, shares: Sequence[ShareLimits]) -> None:
        """Make the daemon hold exactly ``shares`` (after a start, restart or adoption)."""
        if not self._v3:
            await self._apply_legacy(shares)
            return
        await self._control.run_all(
            cmd.render_v3_restore(shares, self._namespaces, self._server_exists)
        )
        self._server_exists = True
        self._namespaces = {s.namespace for s in shares}
        self._spares = []  # deleted with every other namespace of ours no share holds
        self._preset = {}
        for share in shares:
            os.makedirs(self.namespace_dir(share.namespace), exist_ok=True)

    async def apply(self, share: ShareLimits, all_shares: Sequence[ShareLimits]) -> None:
        """Put one share's limits in force; ``all_shares`` includes it."""
        if not self._v3:
            await self._apply_legacy(all_shares)
            return
        if not self._server_exists:
            async with self._server_lock:  # one create, whoever of the shares comes first
                if not self._server_exists:
                    await self.refresh()
                if not self._server_exists:
                    await self._control.run(cmd.v3_server_create())
                    self._server_exists = True
        exists = share.namespace in self._namespaces
        preset = self._preset.pop(share.namespace, None)
        if exists and preset == Limits.of_share(share):
            return  # a spare whose limits, these, were set ahead (its directory made then)
        try:
            await self._control.run_all(cmd.render_v3_apply(share, exists))
        except DaemonError as first:
            # Our view may be stale (a half-done earlier attempt): look, then retry once.
            await self.refresh()
            try:
                for call in cmd.render_v3_apply(share, share.namespace in self._namespaces):
                    await self._control.run(call)
            except DaemonError as second:
                await self._drop_unlimited(share, first, second)
        self._namespaces.add(share.namespace)
        # The container's pipe mount needs the directory even before a client connects.
        os.makedirs(self.namespace_dir(share.namespace), exist_ok=True)

    async def _drop_unlimited(
        self, share: ShareLimits, first: DaemonError, second: DaemonError
    ) -> None:
        """The share's limits could not be set: a namespace the daemon holds without
        them would give a client the whole GPU ("a namespace that sets no limits gets
        the whole GPU", MPS v3 docs), so it goes, and the apply fails with what each
        attempt and the deletion answered."""
        await self.refresh()
        outcome = "it was never created"
        if share.namespace in self._namespaces:
            try:
                await self._control.run(cmd.v3_namespace_delete(share.namespace))
            except DaemonError as err:
                outcome = f"deleting it failed too, so it may hold no limits: {err}"
            else:
                outcome = "it was deleted, so no client runs in it without them"
                self._namespaces.discard(share.namespace)
        raise DaemonError(
            f"GPU {self._gpu_uuid}: the limits of MPS namespace {share.namespace} could not"
            f" be set ({outcome}); first attempt: {first}; retry: {second}"
        ) from second

    async def remove(self, share: ShareLimits, remaining: Sequence[ShareLimits]) -> None:
        """Drop one share (others remain; the last share stops the daemon instead)."""
        if not self._v3:
            await self._apply_legacy(remaining)
            return
        try:
            await self._control.run(cmd.v3_namespace_delete(share.namespace))
        except DaemonError:
            await self.refresh()
            if share.namespace in self._namespaces:
                raise
        self._namespaces.discard(share.namespace)

    async def _apply_legacy(self, shares: Sequence[ShareLimits]) -> None:
        listed = await self._control.run(ControlCall(stdin="get_server_list\n"))
        pids = cmd.parse_legacy_server_list(listed)
        await self._control.run_all(cmd.render_legacy_apply(self._gpu_uuid, shares, pids))
