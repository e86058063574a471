"""The blocking ResourceSlice calls of the publisher (run in its executor).

Writes send our raw JSON (:func:`request_json`), never the client's models:
newer clients validate bodies against their models and would reject or
reshape fields they do not know. A write that finds the listed state gone
(409 Conflict: stale resourceVersion, AlreadyExists, a failed delete
precondition; a PUT that finds the object deleted) raises :class:`StaleView`,
which the publisher answers by listing and planning again.
"""

from __future__ import annotations

from urllib.parse import quote

from dra_driver.base.errors import ApiConflictError, ApiError, ApiNotFoundError
from dra_driver.k8s.client import KubeClient
from dra_driver.k8s.errors import translate_api_errors
from dra_driver.k8s.nodes import read_node
from dra_driver.k8s.rest import JsonObj, request_json

SLICES_PATH = "/apis/resource.k8s.io/v1/resourceslices"
FIELD_MANAGER = "fractional-gpu-dra"
"""``fieldManager`` of our writes (managedFields)."""


class StaleView(Exception):
    """Our list is out of date: re-list and re-plan at once."""


class SliceApi:
    """Node and ResourceSlice requests for one node's pool; every method blocks."""

    def __init__(
        self, api_client: KubeClient, *, node_name: str, field_selector: str, timeout_s: float
    ) -> None:
        self._api_client = api_client
        self._node = node_name
        self._field_selector = field_selector
        self._timeout_s = timeout_s

    def read_node_uid(self) -> str:
        what = f"GET nodes {self._node}"
        try:
            node = read_node(self._api_client, self._node, self._timeout_s)
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

    def list_ours(self) -> list[JsonObj]:
        what = f"LIST resourceslices {self._field_selector}"
        with translate_api_errors(what):
            listed = request_json(
                self._api_client,
                "GET",
                SLICES_PATH,
                query=[("fieldSelector", self._field_selector)],
                timeout_s=self._timeout_s,
            )
        items = listed.get("items") or []
        return [i for i in items if isinstance(i, dict) and (i.get("metadata") or {}).get("name")]

    def create(self, body: JsonObj) -> JsonObj:
        name = body["metadata"]["name"]
        try:
            with translate_api_errors(f"POST resourceslices {name}"):
                return request_json(
                    self._api_client,
                    "POST",
                    SLICES_PATH,
                    query=[("fieldManager", FIELD_MANAGER)],
                    body=body,
                    timeout_s=self._timeout_s,
                )
        except ApiConflictError as err:
            raise StaleView(f"ResourceSlice {name} already exists") from err

    def replace(self, body: JsonObj) -> JsonObj:
        name = body["metadata"]["name"]
        try:
            with translate_api_errors(f"PUT resourceslices {name}"):
                return request_json(
                    self._api_client,
                    "PUT",
                    f"{SLICES_PATH}/{quote(name, safe='')}",
                    query=[("fieldManager", FIELD_MANAGER)],
                    body=body,
                    timeout_s=self._timeout_s,
                )
        except ApiConflictError as err:
            raise StaleView(f"ResourceSlice {name} changed since it was listed") from err
        except ApiNotFoundError as err:
            raise StaleView(f"ResourceSlice {name} was deleted since it was listed") from err

    def delete(self, name: str, uid: str) -> None:
        options: JsonObj = {"apiVersion": "v1", "kind": "DeleteOptions"}
        if uid:
            options["preconditions"] = {"uid": uid}
        try:
            with translate_api_errors(f"DELETE resourceslices {name}"):
                request_json(
                    self._api_client,
                    "DELETE",
                    f"{SLICES_PATH}/{quote(name, safe='')}",
                    body=options,
                    timeout_s=self._timeout_s,
                )
        except ApiNotFoundError:
            pass  # already gone (the kubelet wipes slices too)
        except ApiConflictError as err:
            raise StaleView(f"ResourceSlice {name} was replaced since it was listed") from err
