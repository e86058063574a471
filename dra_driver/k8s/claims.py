"""ClaimSource backed by the API server, on the event loop.

The claim is read as raw JSON through the loop transport
(:class:`~dra_driver.k8s.transport.ApiTransport`) and converted with
:func:`claim_from_dict`: never the client's generated API classes, whose models
lag behind new API fields and whose per-call argument validation costs more CPU
than the rest of the GET (and 5 MB of memory to import).
"""

from __future__ import annotations

import json
from urllib.parse import quote

from dra_driver.base.errors import ApiNotFoundError, ClaimNotFoundError
from dra_driver.base.ids import ClaimRef
from dra_driver.core.allocation import claim_from_dict
from dra_driver.core.model import ResourceClaim
from dra_driver.core.ports import ensure_same_claim
from dra_driver.k8s.rest import DEFAULT_REQUEST_TIMEOUT_S
from dra_driver.k8s.transport import ApiTransport

__all__ = ["DEFAULT_REQUEST_TIMEOUT_S", "KubernetesClaimSource", "claim_path"]


class KubernetesClaimSource:
    """:class:`~dra_driver.core.ports.ClaimSource` reading ``resource.k8s.io/v1`` ResourceClaims.

    Each GET is a request on the event loop (no thread): a wave of pods' claims is read
    at once over the transport's kept connections, and a hung API server holds only
    the requests' own timeouts (``request_timeout_s``, below the kubelet's Prepare
    deadline). The caller owns ``http`` (and closes it).
    """

    def __init__(
        self, http: ApiTransport, *, request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S
    ) -> None:
        self._http = http
        self._request_timeout_s = request_timeout_s

    async def get_claim(self, ref: ClaimRef) -> ResourceClaim:
        """Read and convert the claim; see the :class:`ClaimSource` contract for errors."""
        what = f"GET resourceclaims {ref.namespace}/{ref.name}"
        try:
            raw = await self._http.send_json(
                "GET", claim_path(ref), what=what, timeout_s=self._request_timeout_s
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
        return ensure_same_claim(ref, claim_from_dict(raw))


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
