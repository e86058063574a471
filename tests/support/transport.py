"""The driver's API transport to a test's server, as a driver process makes it.

A driver process closes its transport on its loop before the loop ends; a test that
hands one transport to several ``asyncio.run`` calls cannot. The transports made here
are therefore remembered, and :func:`close_made` (run at the end of every
``asyncio.run`` of a test: ``tests/conftest.py``) closes the connections each kept on
that loop, so none is left for the garbage collector to report (aiohttp logs an
unclosed session as an asyncio error, which a later test's ``caplog`` would see).
"""

from __future__ import annotations

import weakref

from dra_driver.k8s.client import KubeClient, make_api_client
from dra_driver.k8s.transport import ApiTransport, api_transport

UNUSED_HOST = "http://127.0.0.1:1"
"""A host for a transport that is built but never sends (nothing listens on port 1)."""

_made: weakref.WeakSet[ApiTransport] = weakref.WeakSet()


def transport_of(client: KubeClient) -> ApiTransport:
    """The loop transport of ``client`` (closed at the end of each ``asyncio.run``)."""
    transport = api_transport(client)
    _made.add(transport)
    return transport


def transport_to(url: str) -> ApiTransport:
    """The loop transport to ``url`` without credentials (``--host``'s configuration)."""
    return transport_of(make_api_client(None, host=url))


async def close_made() -> None:
    """Close the connections the transports made here keep on the running loop."""
    for transport in list(_made):
        await transport.close()
