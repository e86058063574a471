"""What the kubelet plugin needs of the mps-agent: one Protocol, :class:`MpsAgentPort`.

:class:`~dra_driver.mpsagent.client.MpsAgentClient` implements it; the
enforcement (shares), the UID-wait watch (the share list) and the health
monitor (the daemons' status) depend on it, never on the client itself.
"""

from __future__ import annotations

from typing import Protocol

from dra_driver.mpsagent.protocol import AgentStatus, ShareInfo


class MpsAgentPort(Protocol):
    """The mps-agent as the plugin sees it (``MpsAgentClient``)."""

    async def ensure_share(
        self,
        gpu_uuid: str,
        share_id: str,
        *,
        claim_uid: str,
        memory_limit_bytes: int,
        active_thread_percentage: int,
        uid: int | None = None,
        tenant: str | None = None,
        cooperative: bool = False,
    ) -> ShareInfo:
        """Ensure the GPU's (or MIG instance's) daemon and the share's namespace and limits.

        ``tenant``: the claim's Kubernetes namespace; a legacy daemon refuses a share of
        another namespace than its shares' unless ``cooperative``."""
        ...

    async def release_share(self, gpu_uuid: str, share_id: str) -> bool:
        """Release a share (the agent stops the daemon after its last); False: it had none."""
        ...

    async def list_shares(self) -> list[ShareInfo]:
        """The agent's live shares."""
        ...

    async def status(self) -> AgentStatus:
        """The agent's daemons and their state."""
        ...
