"""Raw JSON requests through the official client: its transport, not its models.

The generated models of the ``kubernetes`` client lag behind the API and drop
or reject fields they do not know (resource.k8s.io gains fields every
release), so we send and read the objects' JSON ourselves and keep the
client for authentication, TLS and proxies. Every call here blocks; callers
run it off the event loop and inside :func:`~dra_driver.k8s.errors.translate_api_errors`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any, cast

import urllib3
from kubernetes.client import ApiClient
from kubernetes.client.exceptions import ApiException

from dra_driver.core.errors import ApiError
from dra_driver.k8s.errors import truncate

JsonObj = dict[str, Any]

DEFAULT_REQUEST_TIMEOUT_S = 10.0


def request_json(
    api_client: ApiClient,
    method: str,
    path: str,
    *,
    query: Iterable[tuple[str, str]] = (),
    body: Mapping[str, Any] | None = None,
    timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S,
    content_type: str = "application/json",
) -> JsonObj:
    """One blocking call with our JSON as the body and the reply parsed as JSON.

    Goes through the client's request machinery (auth, TLS, proxies) but not
    its models. Raises ``ApiException`` and transport errors: call it inside
    :func:`translate_api_errors`. Works with both client generations: the
    pydantic one (``param_serialize``, kubernetes >= 35) and the older one.
    ``content_type`` names the body's media type, e.g.
    ``application/merge-patch+json`` or ``application/apply-patch+yaml``
    (server-side apply; the JSON body is valid YAML).
    """
    headers = {"Accept": "application/json"}
    payload: Any = body
    if body is not None:
        headers["Content-Type"] = content_type
        if not _is_json_media(content_type):
            # The client serialises only JSON media types itself; any other
            # body must be handed over as text.
            payload = json.dumps(body)
    params = list(query)
    client = cast(Any, api_client)
    if hasattr(client, "param_serialize"):
        request = client.param_serialize(
            method=method,
            resource_path=path,
            query_params=params,
            header_params=headers,
            body=payload,
            auth_settings=["BearerToken"],
        )
        response = client.call_api(*request, _request_timeout=timeout_s)
        try:
            data: bytes = response.read()
        finally:
            response.response.release_conn()
        if not 200 <= response.status <= 299:
            raise ApiException(http_resp=response)
    else:  # kubernetes < 35: raises ApiException itself for non-2xx answers
        raw = client.call_api(
            path,
            method,
            query_params=params,
            header_params=headers,
            body=payload,
            auth_settings=["BearerToken"],
            _preload_content=False,
            _return_http_data_only=True,
            _request_timeout=timeout_s,
        )
        data = read_raw(raw)
    return json_object(f"{method} {path}", data)


def _is_json_media(content_type: str) -> bool:
    """``application/json`` or a ``+json`` suffix type (parameters ignored)."""
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or media.endswith("+json")


def read_raw(response: Any) -> bytes:
    """The body of a ``_preload_content=False`` answer (a urllib3 response)."""
    urllib3_response = cast(urllib3.BaseHTTPResponse, response)
    try:
        return urllib3_response.data
    finally:
        urllib3_response.release_conn()


def json_object(what: str, data: bytes) -> JsonObj:
    try:
        obj = json.loads(data)
    except ValueError as err:
        raise ApiError(f"{what}: response is not JSON: {truncate(repr(data))}") from err
    if not isinstance(obj, dict):
        raise ApiError(f"{what}: response is not a JSON object: {truncate(repr(obj))}")
    return obj
