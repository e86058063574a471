"""The kube-scheduler's and the kubelet's side of DRA extended resources (KEP-5004).

A pod written for a device plugin asks ``resources.limits: {nvidia.com/gpu: 1}``.
With a DeviceClass whose ``spec.extendedResourceName`` is that name (or by the
implicit name ``deviceclass.resource.kubernetes.io/<class>``), the scheduler
makes one ResourceClaim for the pod and the kubelet hands each container the
CDI devices of its own requests. These builders reproduce both, after
kubernetes/kubernetes ``pkg/scheduler/framework/plugins/dynamicresources/
extendeddynamicresources.go`` (``preFilterExtendedResources``,
``filterExtendedResources``, ``createRequestsAndMappings``) and
``pkg/kubelet/cm/dra/manager.go`` (``GetResources``), so tests can give the
plugin exactly the claim it meets on a cluster:

* ``metadata``: ``generateName: <pod>-extended-resources-``, the annotation
  ``resource.kubernetes.io/extended-resource-claim: "true"``, the pod as
  controlling owner, the ``delete-protection`` finalizer (the scheduler
  allocated it);
* ``spec.devices.requests``: one ``ExactCount`` request per (resource, long-lived
  container) with ``count`` = the container's request, named
  ``container-<i>-request-<j>`` (``i``: index in init + regular containers;
  ``j``: index of the resource among *all* the container's request names,
  sorted, cpu and memory included); non-sidecar init containers reuse the
  requests of later containers and add one request for what those lack (the
  largest); requests sorted by name. No selectors, no capacity requests, no
  claim config: the class's own ``config`` reaches the driver as ``FromClass``;
* ``status.allocation``: the results per request, the node selector, the pod
  in ``reservedFor``;
* ``pod.status.extendedResourceClaimStatus``: ``requestMappings``
  (containerName, resourceName, requestName) and ``resourceClaimName``.

A resource the node's ``status.allocatable`` has (non-zero) is left to the
device plugin on that node and gets no request.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dra_driver.fakes.objects import Allocated

ANNOTATION = "resource.kubernetes.io/extended-resource-claim"
IMPLICIT_PREFIX = "deviceclass.resource.kubernetes.io/"
FINALIZER = "resource.kubernetes.io/delete-protection"

JsonObj = dict[str, Any]


@dataclass(frozen=True)
class RequestMapping:
    """One entry of ``pod.status.extendedResourceClaimStatus.requestMappings``."""

    container_name: str
    resource_name: str
    request_name: str

    def to_json(self) -> JsonObj:
        return {
            "containerName": self.container_name,
            "resourceName": self.resource_name,
            "requestName": self.request_name,
        }


def classes_by_resource(classes: Iterable[Mapping[str, Any]]) -> dict[str, str]:
    """Extended resource name -> DeviceClass name: each class's explicit
    ``extendedResourceName`` and its implicit ``deviceclass.resource.kubernetes.io/<name>``."""
    found: dict[str, str] = {}
    for obj in classes:
        name = str(obj["metadata"]["name"])
        found[IMPLICIT_PREFIX + name] = name
        explicit = (obj.get("spec") or {}).get("extendedResourceName")
        if explicit:
            found[str(explicit)] = name
    return found


def _requests_of(container: Mapping[str, Any]) -> dict[str, int]:
    """The container's requests; an extended resource given only as a limit is
    requested at its limit (the API server's defaulting)."""
    resources = container.get("resources") or {}
    merged = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
    out = {}
    for key, value in merged.items():
        text = str(value)
        out[key] = int(text) if text.isdigit() else 0  # cpu "500m", memory "1Gi": not counted
    return out


def _request(index: int, container: Mapping[str, Any], resource: str) -> tuple[str, int]:
    """``container-<i>-request-<j>`` and the count the container asks (0: none)."""
    requests = _requests_of(container)
    if not requests.get(resource):
        return "", 0
    return f"container-{index}-request-{sorted(requests).index(resource)}", requests[resource]


def extended_resource_requests(
    pod: Mapping[str, Any],
    resource_classes: Mapping[str, str],
    node_allocatable: Mapping[str, Any] | None = None,
) -> tuple[list[JsonObj], list[RequestMapping]]:
    """The special claim's ``spec.devices.requests`` and the pod's request mappings."""
    spec = pod["spec"]
    inits = list(spec.get("initContainers") or [])
    containers = inits + list(spec.get("containers") or [])
    allocatable = node_allocatable or {}
    wanted = sorted(
        {
            name
            for c in containers
            for name, count in _requests_of(c).items()
            if count and name in resource_classes and not _positive(allocatable.get(name))
        }
    )
    long_lived = [
        i
        for i, c in enumerate(containers)
        if i >= len(inits) or c.get("restartPolicy") == "Always"  # regular or sidecar
    ]
    short_lived = [i for i in range(len(inits)) if i not in long_lived]
    requests: list[JsonObj] = []
    mappings: list[RequestMapping] = []
    for resource in wanted:
        class_name = resource_classes[resource]
        own: dict[int, tuple[str, int]] = {}  # long-lived container index -> its request
        for i in long_lived:
            name, count = _request(i, containers[i], resource)
            if count:
                own[i] = (name, count)
                mappings.append(RequestMapping(containers[i]["name"], resource, name))
        short: list[RequestMapping] = []
        extra: list[tuple[str, int]] = []  # short-lived containers' own requests
        for i in short_lived:
            name, count = _request(i, containers[i], resource)
            if not count:
                continue
            have = 0
            for j in sorted(k for k in own if k >= i):  # later long-lived ones' requests
                short.append(RequestMapping(containers[i]["name"], resource, own[j][0]))
                have += own[j][1]
                if have >= count:
                    break
            if have < count:
                short.append(RequestMapping(containers[i]["name"], resource, name))
                extra.append((name, count - have))
        if extra:
            # Init containers run one at a time: the largest of their requests serves them all.
            largest = extra[0]
            for candidate in extra[1:]:
                if candidate[1] > largest[1]:
                    largest = candidate
            others = {n for n, _ in extra} - {largest[0]}
            short = [
                RequestMapping(m.container_name, m.resource_name, largest[0])
                if m.request_name in others
                else m
                for m in short
            ]
            requests.append(_exact(largest[0], class_name, largest[1]))
        requests.extend(_exact(name, class_name, count) for _, (name, count) in sorted(own.items()))
        mappings.extend(short)
    requests.sort(key=lambda r: r["name"])
    return requests, mappings


def _positive(amount: object) -> bool:
    text = str(amount or "0")
    return text != "0" and text.strip("0") != ""


def _exact(name: str, class_name: str, count: int) -> JsonObj:
    return {
        "name": name,
        "exactly": {
            "deviceClassName": class_name,
            "allocationMode": "ExactCount",
            "count": count,
        },
    }


def scheduler_claim(
    pod: Mapping[str, Any],
    requests: Sequence[Mapping[str, Any]],
    allocated: Mapping[str, Sequence[Allocated]],
    *,
    node: str,
    driver: str = "gpu.fractional.dev",
    classes: Iterable[Mapping[str, Any]] = (),
    name: str | None = None,
) -> JsonObj:
    """The claim the scheduler writes for ``pod``: ``allocated`` maps each request
    name to its devices; ``classes`` are the DeviceClasses (their ``config`` is
    copied into the allocation as ``FromClass``, as the scheduler does)."""
    meta = pod["metadata"]
    missing = sorted({r["name"] for r in requests} - set(allocated))
    if missing:
        raise ValueError(f"no devices for requests {missing}")
    results = []
    for request in sorted(allocated):
        for device in allocated[request]:
            result: JsonObj = {
                "request": request,
                "driver": device.driver or driver,
                "pool": device.pool or node,
                "device": device.device,
            }
            if device.share_id:
                result["shareID"] = device.share_id
            if device.consumed_capacity:
                result["consumedCapacity"] = dict(device.consumed_capacity)
            results.append(result)
    by_name = {c["metadata"]["name"]: c for c in classes}
    # As the allocator writes them: per request, its class's configs, FromClass.
    config = [
        {"source": "FromClass", "requests": [r["name"]], **entry}
        for r in requests
        for entry in (by_name.get(r["exactly"]["deviceClassName"], {}).get("spec") or {}).get(
            "config"
        )
        or []
    ]
    allocation: JsonObj = {
        "devices": {"results": results},
        "nodeSelector": {
            "nodeSelectorTerms": [
                {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
            ]
        },
    }
    if config:
        allocation["devices"]["config"] = config
    prefix = f"{meta['name']}-extended-resources-"
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {
            "namespace": meta["namespace"],
            "name": name or prefix + uuid.uuid4().hex[:5],
            "generateName": prefix,
            "uid": str(uuid.uuid4()),
            "annotations": {ANNOTATION: "true"},
            "finalizers": [FINALIZER],
            "ownerReferences": [
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "name": meta["name"],
                    "uid": meta["uid"],
                    "controller": True,
                }
            ],
        },
        "spec": {"devices": {"requests": [dict(r) for r in requests]}},
        "status": {
            "allocation": allocation,
            "reservedFor": [{"resource": "pods", "name": meta["name"], "uid": meta["uid"]}],
        },
    }


def extended_resource_claim_status(
    claim: Mapping[str, Any], mappings: Sequence[RequestMapping]
) -> JsonObj:
    """``pod.status.extendedResourceClaimStatus`` as the scheduler patches it."""
    return {
        "requestMappings": [m.to_json() for m in mappings],
        "resourceClaimName": claim["metadata"]["name"],
    }


def container_cdi_devices(
    pod: Mapping[str, Any], cdi_ids_by_request: Mapping[str, Sequence[str]]
) -> dict[str, list[str]]:
    """What the kubelet gives each container from the special claim: for every
    extended resource the container requests, the CDI ids of the prepared devices
    whose request names include a mapped request (``GetResources``).

    ``cdi_ids_by_request``: request name -> CDI ids, from NodePrepareResources'
    devices (each device lists its ``request_names``).
    """
    status = (pod.get("status") or {}).get("extendedResourceClaimStatus") or {}
    mappings = status.get("requestMappings") or []
    spec = pod["spec"]
    out: dict[str, list[str]] = {}
    for container in [*(spec.get("initContainers") or []), *spec["containers"]]:
        asked = {name for name, count in _requests_of(container).items() if count}
        ids: list[str] = []
        for m in mappings:
            if m["containerName"] == container["name"] and m["resourceName"] in asked:
                ids.extend(cdi_ids_by_request.get(m["requestName"], ()))
        out[container["name"]] = ids
    return out
