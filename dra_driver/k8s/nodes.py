"""Reading this node's Node object (blocking; call it through ``asyncio.to_thread``)."""

from __future__ import annotations

from kubernetes.client import ApiClient, CoreV1Api

from dra_driver.k8s.errors import translate_api_errors
from dra_driver.k8s.rest import JsonObj, json_object, read_raw


def read_node(api_client: ApiClient, name: str, timeout_s: float = 10.0) -> JsonObj:
    """``GET /api/v1/nodes/<name>`` as raw JSON; API errors become ``core.errors`` ones."""
    what = f"GET nodes {name}"
    with translate_api_errors(what):
        raw = CoreV1Api(api_client).read_node(
            name, _preload_content=False, _request_timeout=timeout_s
        )
        return json_object(what, read_raw(raw))
