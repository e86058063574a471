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
from typing import Any
from urllib.parse import urlencode

import urllib3

from dra_driver.base.errors import ApiError
from dra_driver.k8s.client import KubeClient
from dra_driver.k8s.errors import truncate
from dra_driver.k8s.official import ApiException
from dra_driver.k8s.wire import encode_body

JsonObj = dict[str, Any]

DEFAULT_REQUEST_TIMEOUT_S = 10.0


def request_json(
    api_client: KubeClient,
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
    api_client: KubeClient,
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
    is not checked. The bearer token comes from :meth:`KubeClient.auth_headers`,
    so a rotated service-account token is picked up within seconds.
    """
    headers = {
        **api_client.default_headers,
        "Accept": "application/json",
        **api_client.auth_headers(),
    }
    if body is not None:
        headers["Content-Type"] = content_type
    params = list(query)
    target = path + (f"?{urlencode(params)}" if params else "")
    pool = api_client.connection_pool()
    if pool is None:
        response = api_client.rest_client.pool_manager.request(
            method,
            api_client.configuration.host + target,
            body=body,
            headers=headers,
            timeout=timeout,
            preload_content=False,
        )
    else:
        # The API server does not redirect API calls; a 3xx is answered as an error.
        response = pool.urlopen(
            method,
            api_client.path_prefix + target,
            body=body,
            headers=headers,
            timeout=timeout,
            preload_content=False,
            redirect=False,
            assert_same_host=False,
        )
    return response


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
