"""Reading this node's Node object (blocking; call it through ``asyncio.to_thread``)."""

from __future__ import annotations

from urllib.parse import quote

from dra_driver.k8s.client import KubeClient
from dra_driver.k8s.errors import translate_api_errors
from dra_driver.k8s.rest import JsonObj, request_json


def read_node(api_client: KubeClient, name: str, timeout_s: float = 10.0) -> JsonObj:
    """``GET /api/v1/nodes/<name>`` as raw JSON; API errors become ``core.errors`` ones."""
    what = f"GET nodes {name}"
    with translate_api_errors(what):
        # Not CoreV1Api: loading that module alone costs a process ~20 MB.
        return request_json(
            api_client, "GET", f"/api/v1/nodes/{quote(name, safe='')}", timeout_s=timeout_s
        )
