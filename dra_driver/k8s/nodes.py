"""Reading this node's Node object, on the event loop."""

from __future__ import annotations

from urllib.parse import quote

from dra_driver.k8s.rest import DEFAULT_REQUEST_TIMEOUT_S, JsonObj
from dra_driver.k8s.transport import ApiTransport


async def read_node(
    http: ApiTransport, name: str, timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S
) -> JsonObj:
    """``GET /api/v1/nodes/<name>`` as raw JSON; API errors become ``core.errors`` ones."""
    # Not CoreV1Api: loading that module alone costs a process ~20 MB.
    path = f"/api/v1/nodes/{quote(name, safe='')}"
    return await http.send_json("GET", path, what=f"GET nodes {name}", timeout_s=timeout_s)
