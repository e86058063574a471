"""One HTTP request to the fake API server with the standard library, answered as JSON.

For tests that must control the exact bytes sent (opaque parameters are compared
byte for byte) or see error answers as the server sent them. These requests stand for
a user's ``kubectl`` or the scheduler, not for the driver: against a fake that enforces
the chart they authenticate as the cluster admin (``system:masters``) unless ``user``
names another identity.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

from tests.support.fakekube import FakeKubeApi
from tests.support.fakekube_auth import ADMIN, User


def send(
    fake: FakeKubeApi,
    method: str,
    path: str,
    data: bytes | None = None,
    content_type: str = "application/json",
    *,
    user: User = ADMIN,
) -> tuple[int, Any]:
    """``data`` sent byte for byte; (status, parsed JSON body) for successes and errors."""
    request = urllib.request.Request(fake.url + path, data=data, method=method)
    request.add_header("Content-Type", content_type)
    if fake.security is not None:
        request.add_header("Authorization", f"Bearer {fake.token_for(user)}")
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        with err:
            return err.code, json.loads(err.read())


def send_json(
    fake: FakeKubeApi,
    method: str,
    path: str,
    body: Any = None,
    content_type: str = "application/json",
) -> tuple[int, Any]:
    """``body`` as Python's ``json.dumps`` writes it (spaces after separators)."""
    data = None if body is None else json.dumps(body).encode()
    return send(fake, method, path, data, content_type)
