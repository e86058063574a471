"""ClaimSource backed by the API server, through the official (blocking) client.

The claim is read as raw JSON through the client's transport
(:func:`~dra_driver.k8s.rest.request_json`) and converted with
:func:`claim_from_dict`: never the client's generated API classes, whose models
lag behind new API fields and whose per-call argument validation costs more CPU
than the rest of the GET (and 5 MB of memory to import).
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import json
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import quote

from dra_driver.base.errors import ApiNotFoundError, ClaimNotFoundError
from dra_driver.base.ids import ClaimRef
from dra_driver.core.allocation import claim_from_dict
from dra_driver.core.model import ResourceClaim
from dra_driver.core.ports import ensure_same_claim
from dra_driver.k8s.client import KubeClient
from dra_driver.k8s.errors import translate_api_errors
from dra_driver.k8s.rest import JsonObj, request_json

DEFAULT_REQUEST_TIMEOUT_S = 10.0
"""Total time one GET may take; the kubelet's own Prepare deadline is longer."""

DEFAULT_MAX_WORKERS = 8
"""Concurrent GETs. The kubelet starts a wave of pods at once, one call per pod: with
four, a wave of ten queued for the pool (hack/bench/prepare.py over HTTPS: prepare
p99 43-67 ms in four runs, against 40-50 with eight)."""


class KubernetesClaimSource:
    """:class:`~dra_driver.core.ports.ClaimSource` reading ``resource.k8s.io/v1`` ResourceClaims.

    Calls run in a small pool of its own rather than ``asyncio.to_thread``'s
    default executor, so a hung API server can tie up at most ``max_workers``
    threads and never starves other blocking adapters (NVML). The caller owns
    ``api_client``; :meth:`close` only stops the pool.
    """

    def __init__(
        self,
        api_client: KubeClient,
        *,
        request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S,
        max_workers: int = DEFAULT_MAX_WORKERS,
    ) -> None:
        self._api = api_client
        self._request_timeout_s = request_timeout_s
        self._executor = ThreadPoolExecutor(
            max_workers=max_workers, thread_name_prefix="k8s-claims"
        )

    async def get_claim(self, ref: ClaimRef) -> ResourceClaim:
        """Read and convert the claim; see the :class:`ClaimSource` contract for errors."""
        loop = asyncio.get_running_loop()
        # Like asyncio.to_thread: carry contextvars (request ids) into the thread.
        call = functools.partial(contextvars.copy_context().run, self._read_claim, ref)
        raw = await loop.run_in_executor(self._executor, call)
        return ensure_same_claim(ref, claim_from_dict(raw))

    def close(self) -> None:
        """Stop the worker pool; calls still running finish in the background."""
        self._executor.shutdown(wait=False, cancel_futures=True)

    def _read_claim(self, ref: ClaimRef) -> JsonObj:
        what = f"GET resourceclaims {ref.namespace}/{ref.name}"
        try:
            with translate_api_errors(what):
                return request_json(
                    self._api,
                    "GET",
                    claim_path(ref),
                    timeout_s=self._request_timeout_s,
                )
        except ApiNotFoundError as err:
            if not _names_an_object(err):
                raise ApiNotFoundError(
                    f"{err}; is resource.k8s.io/v1 served by this API server "
                    "(Kubernetes 1.34 or later)?",
                    status=err.status,
                ) from err
            raise ClaimNotFoundError(
                ref, "the ResourceClaim does not exist in the API server (deleted?)"
            ) from err


def claim_path(ref: ClaimRef) -> str:
    """The claim's URL path under ``resource.k8s.io/v1``."""
    return (
        f"/apis/resource.k8s.io/v1/namespaces/{quote(ref.namespace, safe='')}"
        f"/resourceclaims/{quote(ref.name, safe='')}"
    )


def _names_an_object(err: ApiNotFoundError) -> bool:
    """False when the 404 says the API itself is missing, not the object.

    The API server answers both with 404 NotFound; only an object's absence
    fills ``details.name``. An unparsable body counts as the object missing.
    """
    body = getattr(err.__cause__, "body", None)
    try:
        status = json.loads(body) if isinstance(body, str | bytes) else None
    except ValueError:
        return True
    if not isinstance(status, dict) or status.get("kind") != "Status":
        return True
    return bool((status.get("details") or {}).get("name"))
