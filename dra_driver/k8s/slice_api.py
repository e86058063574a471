"""The ResourceSlice requests of the publisher, on the event loop.

Writes send our raw JSON (:class:`~dra_driver.k8s.transport.ApiTransport`), never
the client's models:
newer clients validate bodies against their models and would reject or
reshape fields they do not know. A write that finds the listed state gone
(409 Conflict: stale resourceVersion, AlreadyExists, a failed delete
precondition; a PUT that finds the object deleted) raises :class:`StaleView`,
which the publisher answers by listing and planning again.
"""

from __future__ import annotations

from urllib.parse import quote

from dra_driver.base.errors import ApiConflictError, ApiError, ApiNotFoundError
from dra_driver.k8s.nodes import read_node
from dra_driver.k8s.rest import JsonObj
from dra_driver.k8s.transport import ApiTransport

SLICES_PATH = "/apis/resource.k8s.io/v1/resourceslices"
FIELD_MANAGER = "fractional-gpu-dra"
"""``fieldManager`` of our writes (managedFields)."""


class StaleView(Exception):
    """Our list is out of date: re-list and re-plan at once."""


class SliceApi:
    """Node and ResourceSlice requests for one node's pool."""

    def __init__(
        self, http: ApiTransport, *, node_name: str, field_selector: str, timeout_s: float
    ) -> None:
        self._http = http
        self._node = node_name
        self._field_selector = field_selector
        self._timeout_s = timeout_s

    async def read_node_uid(self) -> str:
        what = f"GET nodes {self._node}"
        try:
            node = await read_node(self._http, self._node, self._timeout_s)
        except ApiNotFoundError as err:
            raise ApiNotFoundError(
                f"{err}; ResourceSlices are owned by their Node: is the node name "
                f"{self._node!r} right?",
                status=err.status,
            ) from err
        uid = (node.get("metadata") or {}).get("uid")
        if not uid:
            raise ApiError(f"{what}: the Node has no metadata.uid")
        return str(uid)

    async def list_ours(self) -> list[JsonObj]:
        listed = await self._http.send_json(
            "GET",
            SLICES_PATH,
            query=[("fieldSelector", self._field_selector)],
            what=f"LIST resourceslices {self._field_selector}",
            timeout_s=self._timeout_s,
        )
        items = listed.get("items") or []
        return [i for i in items if isinstance(i, dict) and (i.get("metadata") or {}).get("name")]

    async def create(self, body: JsonObj) -> JsonObj:
        name = body["metadata"]["name"]
        try:
            return await self._http.send_json(
                "POST",
                SLICES_PATH,
                body,
                query=[("fieldManager", FIELD_MANAGER)],
                what=f"POST resourceslices {name}",
                timeout_s=self._timeout_s,
            )
        except ApiConflictError as err:
            raise StaleView(f"ResourceSlice {name} already exists") from err

    async def replace(self, body: JsonObj) -> JsonObj:
        name = body["metadata"]["name"]
        try:
            return await self._http.send_json(
                "PUT",
                f"{SLICES_PATH}/{quote(name, safe='')}",
                body,
                query=[("fieldManager", FIELD_MANAGER)],
                what=f"PUT resourceslices {name}",
                timeout_s=self._timeout_s,
            )
        except ApiConflictError as err:
            raise StaleView(f"ResourceSlice {name} changed since it was listed") from err
        except ApiNotFoundError as err:
            raise StaleView(f"ResourceSlice {name} was deleted since it was listed") from err

    async def delete(self, name: str, uid: str) -> None:
        options: JsonObj = {"apiVersion": "v1", "kind": "DeleteOptions"}
        if uid:
            options["preconditions"] = {"uid": uid}
        try:
            await self._http.send_json(
                "DELETE",
                f"{SLICES_PATH}/{quote(name, safe='')}",
                options,
                what=f"DELETE resourceslices {name}",
                timeout_s=self._timeout_s,
            )
        except ApiNotFoundError:
            pass  # already gone (the kubelet wipes slices too)
        except ApiConflictError as err:
            raise StaleView(f"ResourceSlice {name} was replaced since it was listed") from err
