"""Raw JSON answers, not the official client's models.

The generated models of the ``kubernetes`` client lag behind the API and drop
or reject fields they do not know (resource.k8s.io gains fields every
release), and its serialiser adds spaces that the API server keeps in opaque
parameters, so we send and read the objects' JSON ourselves
(:mod:`dra_driver.k8s.transport`) and keep the client for its configuration: host,
credentials, TLS and proxies. Here: an answer's body as a JSON object, a refusal as
the client's ``ApiException`` (which :func:`~dra_driver.k8s.errors.translate_api_errors`
turns into ours).
"""

from __future__ import annotations

import json
from typing import Any

from dra_driver.base.errors import ApiError
from dra_driver.k8s.errors import truncate
from dra_driver.k8s.official import ApiException

JsonObj = dict[str, Any]

DEFAULT_REQUEST_TIMEOUT_S = 10.0


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
