"""What to write to make the stored ResourceSlices the desired ones (pure: no I/O).

:func:`plan_publish` compares the desired slices with the stored slices of
our driver on our node and returns the writes (:class:`PublishPlan`);
:class:`~dra_driver.k8s.publisher.SlicePublisher` applies them. Rules:

* object name ``<node>-<driver, '.' -> '-'>-<key>`` (:func:`slice_name`), made
  a DNS subdomain of at most 253 characters; when that had to change the name
  (case, odd characters, length) a hash of the unchanged name is appended, so
  two keys never share an object;
* label ``app.kubernetes.io/managed-by: fractional-gpu-dra``, annotation
  ``gpu.fractional.dev/slice-key: <key>``, and the Node as controlling owner
  (``apiVersion: v1, kind: Node, controller: true``) so the garbage collector
  removes the slices with their Node;
* the pool is unchanged when the stored slices are exactly the desired names,
  share one generation and have the desired specs (ignoring
  ``pool.generation``); then nothing is written at all. Otherwise every slice
  gets generation ``max(stored generations, last one we wrote) + 1``; writes
  go first (creates, updates), deletions of slices no longer desired last;
* the spec to compare with is what we sent when the stored resourceVersion is
  still the one our write got back, else the stored spec. So fields the server
  drops (gates off) or canonicalises (quantities) do not look like a change on
  every publish; after a restart they cause one extra generation at most;
* a device taint's ``timeAdded`` is the API server's (it sets it on create and
  update when unset): it is left out of the comparison, and every write
  carries the stored ``timeAdded`` of a taint that is still desired on the
  same device (same key, value and effect), so rewriting a slice for another
  reason does not restart the clock of ``tolerationSeconds``.

:func:`missing_fields` finds what a write sent that the server did not store.
"""

from __future__ import annotations

import copy
import hashlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dra_driver.core.slices import DesiredSlice
from dra_driver.k8s.rest import JsonObj

MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY = "fractional-gpu-dra"
SLICE_KEY_ANNOTATION = "gpu.fractional.dev/slice-key"
"""The :attr:`DesiredSlice.key` an object was written for (informational)."""
MAX_NAME_LEN = 253


# --- Names and objects -----------------------------------------------------------------

_NOT_DNS = re.compile(r"[^a-z0-9.-]+")
_BAD_DOTS = re.compile(r"[.-]*\.[.-]*")  # a dot next to '-' or '.' starts no valid label


def dns_subdomain(raw: str, max_len: int = MAX_NAME_LEN) -> str:
    """``raw`` as a DNS subdomain (RFC 1123) of at most ``max_len`` characters.

    Lower-cased, runs of other characters become ``-``, dots keep only where
    they separate labels. If that changed anything, or the name is too long,
    ``-<10 hex digits of sha256(raw)>`` is appended (after cutting), so that
    distinct inputs stay distinct.
    """
    name = _BAD_DOTS.sub(".", _NOT_DNS.sub("-", raw.lower())).strip(".-")
    if name == raw and len(name) <= max_len:
        return name
    digest = hashlib.sha256(raw.encode()).hexdigest()[:10]
    stem = name[: max_len - len(digest) - 1].rstrip(".-")
    return f"{stem}-{digest}" if stem else digest


def slice_name(node_name: str, driver_name: str, key: str) -> str:
    """The object name of our slice ``key`` on ``node_name``."""
    return dns_subdomain(f"{node_name}-{driver_name.replace('.', '-')}-{key}")


def node_owner(node_name: str, node_uid: str) -> JsonObj:
    """The ownerReference that lets the garbage collector delete slices with their Node."""
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "name": node_name,
        "uid": node_uid,
        "controller": True,
    }


def missing_fields(sent: Any, stored: Any, path: str = "") -> list[str]:
    """Paths of non-empty values in ``sent`` that ``stored`` lacks.

    Changed scalars are not reported (the server canonicalises quantities);
    neither are empty lists and maps (the server omits them).
    """
    if isinstance(sent, dict) and isinstance(stored, dict):
        found = []
        for key, value in sent.items():
            sub = f"{path}.{key}" if path else key
            if key not in stored:
                if value not in (None, {}, []):
                    found.append(sub)
            else:
                found.extend(missing_fields(value, stored[key], sub))
        return found
    if isinstance(sent, list) and isinstance(stored, list):
        found = []
        for index, value in enumerate(sent):
            sub = f"{path}[{index}]"
            if index >= len(stored):
                found.append(sub)
            else:
                found.extend(missing_fields(value, stored[index], sub))
        return found
    return []


# --- The plan ---------------------------------------------------------------------------


@dataclass(frozen=True)
class SentSpec:
    """What one of our writes sent, and the resourceVersion the server gave it."""

    resource_version: str
    spec: Mapping[str, Any]


@dataclass(frozen=True)
class PublishPlan:
    """The writes that bring the stored slices to the desired ones (pure output)."""

    generation: int
    """The pool's generation after the plan; 0 for an empty pool."""
    create: tuple[JsonObj, ...] = ()
    update: tuple[JsonObj, ...] = ()
    """Full objects for PUT, ``metadata.resourceVersion`` set to the stored one."""
    delete: tuple[tuple[str, str], ...] = ()
    """``(name, uid)`` of stored slices no longer desired."""

    @property
    def writes(self) -> int:
        return len(self.create) + len(self.update) + len(self.delete)


def check_desired(desired: Sequence[DesiredSlice], driver_name: str, node_name: str) -> None:
    """Raise ``ValueError`` when ``desired`` breaks the :class:`DesiredSlice` contract."""
    keys = [d.key for d in desired]
    if len(set(keys)) != len(keys):
        raise ValueError(f"desired slices have duplicate keys: {sorted(keys)}")
    pools = {str((d.spec.get("pool") or {}).get("name")) for d in desired}
    if len(pools) > 1:
        raise ValueError(f"desired slices span several pools {sorted(pools)}; expected one")
    for d in desired:
        spec = d.spec
        if spec.get("driver") != driver_name or spec.get("nodeName") != node_name:
            raise ValueError(
                f"desired slice {d.key!r} is for driver {spec.get('driver')!r} on node "
                f"{spec.get('nodeName')!r}; this publisher serves {driver_name!r} on "
                f"{node_name!r}"
            )
        count = (spec.get("pool") or {}).get("resourceSliceCount")
        if count != len(desired):
            raise ValueError(
                f"desired slice {d.key!r} has pool.resourceSliceCount {count!r}, "
                f"but {len(desired)} slices are desired"
            )


def plan_publish(
    desired: Sequence[DesiredSlice],
    stored: Sequence[Mapping[str, Any]],
    *,
    driver_name: str,
    node_name: str,
    owner: Mapping[str, Any],
    last_generation: int = 0,
    sent: Mapping[str, SentSpec] | None = None,
) -> PublishPlan:
    """Desired slices + the stored slices of our driver on our node → the writes (pure).

    ``last_generation`` is the highest generation this process wrote, so the
    pool never goes back to an old generation after the kubelet wiped it;
    ``sent`` maps object names to what we last wrote there (see module docs).
    """
    sent = sent or {}
    wanted = {slice_name(node_name, driver_name, d.key): d for d in desired}
    by_name = {str(o["metadata"]["name"]): o for o in stored}

    def comparable(name: str, obj: Mapping[str, Any]) -> Any:
        meta = obj["metadata"]
        mine = sent.get(name)
        spec = mine.spec if mine and mine.resource_version == meta.get("resourceVersion") else None
        return _comparable_spec(spec if spec is not None else obj.get("spec") or {})

    generations = {_generation(o) for o in stored}
    unchanged = (
        set(wanted) == set(by_name)
        and len(generations) <= 1
        and all(comparable(n, by_name[n]) == _comparable_spec(d.spec) for n, d in wanted.items())
    )
    times = _stored_taint_times(stored)
    if unchanged:
        generation = next(iter(generations), 0)
    else:
        generation = max([*generations, last_generation]) + 1
    create, update = [], []
    for name, d in wanted.items():
        spec = copy.deepcopy(dict(d.spec))
        spec["pool"] = {**spec["pool"], "generation": generation}
        _keep_taint_times(spec, times)
        current = by_name.get(name)
        if current is None:
            meta = _our_metadata(name, d.key, owner, None)
            create.append({**_TYPE, "metadata": meta, "spec": spec})
        elif not unchanged or not _has_our_metadata(current["metadata"], d.key, owner):
            meta = _our_metadata(name, d.key, owner, current["metadata"])
            update.append({**_TYPE, "metadata": meta, "spec": spec})
    delete = [
        (name, str(obj["metadata"].get("uid", "")))
        for name, obj in sorted(by_name.items())
        if name not in wanted
    ]
    return PublishPlan(generation if wanted else 0, tuple(create), tuple(update), tuple(delete))


_TYPE = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice"}


def _generation(obj: Mapping[str, Any]) -> int:
    return int(((obj.get("spec") or {}).get("pool") or {}).get("generation") or 0)


def _without_generation(spec: Mapping[str, Any]) -> JsonObj:
    out = dict(spec)
    out["pool"] = {k: v for k, v in (spec.get("pool") or {}).items() if k != "generation"}
    return out


# --- Device taints' timeAdded ----------------------------------------------------------

_TaintId = tuple[str, str, str, str]
"""(device name, key, value, effect)"""


def _taint_id(device: Mapping[str, Any], taint: Mapping[str, Any]) -> _TaintId:
    return (
        str(device.get("name")),
        str(taint.get("key")),
        str(taint.get("value") or ""),
        str(taint.get("effect")),
    )


def _comparable_spec(spec: Mapping[str, Any]) -> JsonObj:
    """``spec`` without what the server decides: the pool generation, taints' ``timeAdded``."""
    out = _without_generation(spec)
    devices = out.get("devices")
    if isinstance(devices, list):
        out["devices"] = [_without_taint_times(device) for device in devices]
    return out


def _without_taint_times(device: Any) -> Any:
    if not isinstance(device, Mapping) or not device.get("taints"):
        return device
    taints = [{k: v for k, v in t.items() if k != "timeAdded"} for t in device["taints"]]
    return {**device, "taints": taints}


def _stored_taint_times(stored: Sequence[Mapping[str, Any]]) -> dict[_TaintId, Any]:
    """When each stored device taint was added, by device and taint."""
    times: dict[_TaintId, Any] = {}
    for obj in stored:
        for device in (obj.get("spec") or {}).get("devices") or []:
            for taint in device.get("taints") or []:
                if taint.get("timeAdded"):
                    times[_taint_id(device, taint)] = taint["timeAdded"]
    return times


def _keep_taint_times(spec: JsonObj, times: Mapping[_TaintId, Any]) -> None:
    """Give each desired taint without ``timeAdded`` the stored one of the same taint."""
    for device in spec.get("devices") or []:
        for taint in device.get("taints") or []:
            if "timeAdded" not in taint and (when := times.get(_taint_id(device, taint))):
                taint["timeAdded"] = when


# --- Our metadata -----------------------------------------------------------------------


def _our_metadata(
    name: str, key: str, owner: Mapping[str, Any], stored: Mapping[str, Any] | None
) -> JsonObj:
    """Metadata to write: ours merged over what is stored (others' labels stay)."""
    stored = stored or {}
    others = [
        ref
        for ref in stored.get("ownerReferences") or []
        if (ref.get("apiVersion"), ref.get("kind")) != ("v1", "Node")
    ]
    meta: JsonObj = {
        "name": name,
        "labels": {**(stored.get("labels") or {}), MANAGED_BY_LABEL: MANAGED_BY},
        "annotations": {**(stored.get("annotations") or {}), SLICE_KEY_ANNOTATION: key},
        "ownerReferences": [dict(owner), *others],
    }
    for attr in ("resourceVersion", "finalizers"):
        if stored.get(attr):
            meta[attr] = stored[attr]
    return meta


def _has_our_metadata(meta: Mapping[str, Any], key: str, owner: Mapping[str, Any]) -> bool:
    return (
        (meta.get("labels") or {}).get(MANAGED_BY_LABEL) == MANAGED_BY
        and (meta.get("annotations") or {}).get(SLICE_KEY_ANNOTATION) == key
        and dict(owner) in (meta.get("ownerReferences") or [])
    )
