"""Raw JSON requests through the official client: its transport, not its models.

The generated models of the ``kubernetes`` client lag behind the API and drop
or reject fields they do not know (resource.k8s.io gains fields every
release), and its serialiser adds spaces that the API server keeps in opaque
parameters, so we send and read the objects' JSON ourselves and keep the
client for its configuration: host, credentials, TLS and proxies. Every call here blocks; callers
run it off the event loop and inside :func:`~dra_driver.k8s.errors.translate_api_errors`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any, cast
from urllib.parse import urlencode

import urllib3
from kubernetes.client import ApiClient
from kubernetes.client.exceptions import ApiException

from dra_driver.base.errors import ApiError
from dra_driver.k8s.errors import truncate
from dra_driver.k8s.wire import encode_body

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

    The body is serialised by :func:`~dra_driver.k8s.wire.encode_body` (compact,
    as the API server itself re-encodes it), never by the client, whose
    ``json.dumps`` adds spaces that the API server keeps in opaque parameters.
    Raises ``ApiException`` and transport errors: call it inside
    :func:`translate_api_errors`. ``content_type`` names the body's media type,
    e.g. ``application/merge-patch+json`` or ``application/apply-patch+yaml``
    (server-side apply; the JSON body is valid YAML).
    """
    payload = None if body is None else encode_body(body)
    response = open_request(
        api_client,
        method,
        path,
        query=query,
        body=payload,
        content_type=content_type,
        timeout=urllib3.Timeout(total=timeout_s),
    )
    try:
        data = response.read()
    finally:
        response.release_conn()
    if not 200 <= response.status <= 299:
        raise api_exception(response.status, response.reason, data)
    return json_object(f"{method} {path}", data)


def open_request(
    api_client: ApiClient,
    method: str,
    path: str,
    *,
    query: Iterable[tuple[str, str]] = (),
    body: bytes | None = None,
    content_type: str = "application/json",
    timeout: urllib3.Timeout,
) -> urllib3.BaseHTTPResponse:
    """Send ``body`` as it is, with the client's host, credentials, TLS and proxies.

    The answer is not read (watch streams read it line by line) and its status
    is not checked. The bearer token is asked of the configuration on every
    call, so a rotated service-account token is picked up.
    """
    client = cast(Any, api_client)
    configuration = client.configuration
    headers: dict[str, str] = {**client.default_headers, "Accept": "application/json"}
    for setting in configuration.auth_settings().values():
        if setting.get("in") == "header" and setting.get("value"):
            headers[setting["key"]] = setting["value"]
    if body is not None:
        headers["Content-Type"] = content_type
    params = list(query)
    url = configuration.host + path + (f"?{urlencode(params)}" if params else "")
    pool = client.rest_client.pool_manager
    return cast(
        urllib3.BaseHTTPResponse,
        pool.request(
            method, url, body=body, headers=headers, timeout=timeout, preload_content=False
        ),
    )


def api_exception(status: int, reason: str | None, data: bytes) -> ApiException:
    """The client's exception for a non-2xx answer, as its own calls raise it."""
    err = ApiException(status=status, reason=reason)
    err.body = data.decode("utf-8", errors="replace")
    return err


def json_object(what: str, data: bytes) -> JsonObj:
    try:
        obj = json.loads(data)
    except ValueError as err:
        raise ApiError(f"{what}: response is not JSON: {truncate(repr(data))}") from err
    if not isinstance(obj, dict):
        raise ApiError(f"{what}: response is not a JSON object: {truncate(repr(obj))}")
    return obj
