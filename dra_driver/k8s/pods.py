"""Pods on this node, read and annotated for the disruption guard.

Two calls, on the event loop:

* ``GET /api/v1[/namespaces/<ns>]/pods?fieldSelector=spec.nodeName=<node>``: the
  node's pods (served from the API server's watch cache);
* ``PATCH /api/v1/namespaces/<ns>/pods/<name>`` as a JSON merge patch
  (``application/merge-patch+json``) of only the ``metadata.annotations`` keys that
  change (a key set to null is removed), with the pod's ``uid`` and the
  ``resourceVersion`` it was read at as preconditions: a pod replaced under the
  same name, or changed since, is refused (409) and read again. A pod is never
  PUT: the kubelet and others write it all the time, and a whole-object write
  would race them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dra_driver.k8s.rest import DEFAULT_REQUEST_TIMEOUT_S, JsonObj
from dra_driver.k8s.transport import ApiTransport
from dra_driver.k8s.watch import MERGE_PATCH


def pods_path(namespace: str | None) -> str:
    return f"/api/v1/namespaces/{namespace}/pods" if namespace else "/api/v1/pods"


def annotation_patch(
    changes: Mapping[str, str | None], *, uid: str, resource_version: str
) -> JsonObj:
    """The merge-patch body: the changed annotations, guarded by ``uid`` and ``resourceVersion``."""
    return {
        "metadata": {
            "annotations": dict(changes),
            "resourceVersion": resource_version,
            "uid": uid,
        }
    }


class PodApi:
    """The node's pods through ``http`` (the caller owns it)."""

    def __init__(
        self, http: ApiTransport, node_name: str, *, timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S
    ) -> None:
        self._http = http
        self.node_name = node_name
        self._timeout_s = timeout_s

    async def list_on_node(self, namespace: str | None = None) -> list[JsonObj]:
        """The pods bound to this node (in ``namespace``; None: every namespace)."""
        path = pods_path(namespace)
        answer = await self._http.send_json(
            "GET",
            path,
            query=[("fieldSelector", f"spec.nodeName={self.node_name}")],
            what=f"LIST {path} on node {self.node_name}",
            timeout_s=self._timeout_s,
        )
        items: list[Any] = answer.get("items") or []
        return [p for p in items if isinstance(p, dict)]

    async def patch_annotations(
        self, pod: Mapping[str, Any], changes: Mapping[str, str | None]
    ) -> JsonObj:
        """Merge-patch ``changes`` into ``pod``'s annotations; the pod as stored after."""
        meta = pod.get("metadata") or {}
        namespace, name = str(meta.get("namespace", "")), str(meta.get("name", ""))
        path = f"{pods_path(namespace)}/{name}"
        body = annotation_patch(
            changes,
            uid=str(meta.get("uid", "")),
            resource_version=str(meta.get("resourceVersion", "")),
        )
        return await self._http.send_json(
            "PATCH", path, body, content_type=MERGE_PATCH, timeout_s=self._timeout_s
        )

    async def get(self, namespace: str, name: str) -> JsonObj:
        path = f"{pods_path(namespace)}/{name}"
        return await self._http.send_json("GET", path, timeout_s=self._timeout_s)
