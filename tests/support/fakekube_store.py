"""The fake API server's state: objects, one resourceVersion counter, watch history.

Independent of HTTP: the server and the test-side API both call :class:`Store`,
so objects seeded from Python produce the same watch events as HTTP writes.

A stored object is never changed once stored: each write stores a new one, built
from a copy of what it changes. So the watch history, a list in progress and every
answer share the stored objects instead of copying them (one copy per write, not
one per step, watcher and answer); :class:`~tests.support.fakekube.FakeKubeApi`
copies what it hands to tests, and the HTTP layer only encodes what it gets.
"""

from __future__ import annotations

import bisect
import secrets
import string
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from tests.support import fakekube_namespaces as namespaces
from tests.support.fakekube_apply import APPLY_MEDIA_TYPE, Owners, apply_claim_devices
from tests.support.fakekube_claims import check_claim_status
from tests.support.fakekube_patch import json_patch, merge_patch
from tests.support.fakekube_raw import (
    as_answered,
    as_generic,
    as_patched,
    as_sent,
    check_claim_update,
    copy_json,
    encode_wire,
    raw_paths,
    same_bytes,
)
from tests.support.fakekube_selectors import Predicate
from tests.support.fakekube_types import (
    FakeApiError,
    JsonObj,
    ResourceKind,
    bad_request,
    not_found,
    unknown_path,
)


@dataclass(frozen=True)
class _Event:
    rv: int
    kind: ResourceKind
    type: str
    obj: JsonObj
    old: JsonObj | None


@dataclass(frozen=True)
class WatchFilter:
    """Which events one watch sees."""

    kind: ResourceKind
    namespace: str | None
    labels: Predicate
    fields: Predicate

    def matches(self, obj: JsonObj) -> bool:
        meta = obj.get("metadata") or {}
        if self.namespace is not None and meta.get("namespace") != self.namespace:
            return False
        return self.labels(meta.get("labels") or {}) and self.fields(obj)

    def view(self, event: _Event) -> tuple[str, JsonObj] | None:
        """The event this watch sends for ``event``, if any."""
        if event.kind != self.kind:
            return None
        now = self.matches(event.obj)
        before = event.old is not None and self.matches(event.old)
        if event.type != "MODIFIED":
            return (event.type, event.obj) if now else None
        if now:
            return ("MODIFIED" if before else "ADDED", event.obj)
        return ("DELETED", event.obj) if before else None


_WIRE_KEPT = 4096
"""Encoded objects kept (:meth:`Store.wire`); the oldest goes first."""

_CONTINUES_KEPT = 64
"""Lists in progress held at once; the oldest token expires first."""


def _check_identity(kind: ResourceKind, namespace: str | None, name: str, meta: JsonObj) -> None:
    """A written object may leave name and namespace out, but not contradict the path."""
    if meta.get("name") not in (None, "", name):
        raise bad_request(f"the name of the object ({meta['name']}) does not match {name}")
    if kind.namespaced and meta.get("namespace") not in (None, "", namespace):
        raise bad_request(
            "the namespace of the provided object does not match the namespace sent on the request"
        )


def _halves(kind: ResourceKind, current: JsonObj, new: JsonObj, *, status_only: bool) -> JsonObj:
    """What an update stores (but its metadata): each endpoint owns its half, the status
    subresource only status, the main resource everything but status. ``new`` is the
    store's own copy; what comes from ``current`` (stored) is copied."""
    if not kind.status_subresource:
        return new
    if status_only:
        # metadata is replaced by the caller, in its place: the key order stays
        obj = {k: None if k == "metadata" else copy_json(v) for k, v in current.items()}
        obj.pop("status", None)
        if "status" in new:
            obj["status"] = new["status"]
        return obj
    obj = without(new, "status")
    if "status" in current:
        obj["status"] = copy_json(current["status"])
    return obj


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def without(obj: JsonObj, *keys: str) -> JsonObj:
    return {k: v for k, v in obj.items() if k not in keys}


_SERVER_METADATA = ("uid", "creationTimestamp", "deletionTimestamp", "generation")

_Key = tuple[str, str, str, str]
"""(group, plural, namespace or "", name)"""

Prepare = Callable[[ResourceKind, JsonObj], None]
"""Called on every object about to be stored (or answered by a dry run): may drop
fields in place or raise :class:`FakeApiError`, as an API server's strategy does."""


def _keep_all(kind: ResourceKind, obj: JsonObj) -> None:
    """The default :data:`Prepare`: store what was sent."""


Validate = Callable[[ResourceKind, JsonObj], None]
"""Called on every object a checked (HTTP) write is about to store: raises
:class:`FakeApiError` when it does not match its kind's schema."""


def accept_all(kind: ResourceKind, obj: JsonObj) -> None:
    """The default :data:`Validate`."""


Admit = Callable[[str, JsonObj | None, JsonObj | None], None]
"""Called with (operation, old, new) after validation and before storing, as the API
server's validating admission runs: raises :class:`FakeApiError` to refuse the write.
``operation`` is CREATE, UPDATE or DELETE; old is None on create, new on delete.
It reads the objects and must not change them (old is the stored one). None (the
Python-side seeding of tests): no admission."""


class Store:
    """All objects and the event history, guarded by one condition variable.

    Every method copies what goes in (a caller may change its dict afterwards) and
    returns stored objects themselves: read-only to the caller (see the module's
    docstring). Writes take ``dry_run``: everything happens (defaults, ``prepare``,
    conflicts) except storing and the watch event.
    """

    def __init__(
        self,
        kinds: tuple[ResourceKind, ...],
        history_limit: int,
        prepare: Prepare = _keep_all,
        validate: Validate = accept_all,
        namespace_delay_s: float | None = namespaces.DEFAULT_DELAY_S,
    ) -> None:
        """``namespace_delay_s``: how long after a namespace is marked deleted, or
        something in it changes, the namespace controller looks at it; None: only when
        :meth:`sync_namespaces` is called (:mod:`fakekube_namespaces`)."""
        self.kinds = kinds
        self._prepare = prepare
        self._validate = validate
        lock = threading.RLock()
        self._cond = threading.Condition(lock)
        self._changed = {kind: threading.Condition(lock) for kind in kinds}
        """Per kind, woken by a commit of that kind: a watch waits for its own kind's
        events only, as a real server's watch cache is kept per resource."""
        self._closing = False
        self._active_watches = 0
        self._objects: dict[_Key, JsonObj] = {}
        self._rv = 0
        self._history: list[_Event] = []
        self._history_limit = history_limit
        self._oldest_rv = 0
        """Watches may resume from any resourceVersion >= this."""
        self._continues: dict[str, tuple[int, list[JsonObj]]] = {}
        """Continue token -> (the list's resourceVersion, the items still to send)."""
        self._wire: dict[int, tuple[JsonObj, bytes]] = {}
        """id(object) -> (the object, its encoding): see :meth:`wire`."""
        self._wire_lock = threading.Lock()
        self._apply_owners: dict[tuple[_Key, str], Owners] = {}
        """Server-side apply ownership per (object, uid); see :mod:`fakekube_apply`."""
        self._namespace_kind = next((k for k in kinds if namespaces.is_namespace(k)), None)
        """The Namespace kind when served: then namespaces have their lifecycle."""
        self._kinds_by_key = {(k.group, k.plural): k for k in kinds}
        self._namespaces = namespaces.NamespaceController(
            lock, self._sync_namespace, namespace_delay_s
        )

    # Reads

    @property
    def resource_version(self) -> int:
        with self._cond:
            return self._rv

    def get(self, kind: ResourceKind, namespace: str | None, name: str) -> JsonObj:
        with self._cond:
            return self._get(kind, namespace, name)

    def list_objects(
        self, kind: ResourceKind, namespace: str | None, labels: Predicate, fields: Predicate
    ) -> tuple[list[JsonObj], int]:
        flt = WatchFilter(kind, namespace, labels, fields)
        with self._cond:
            return list(self._matching(flt)), self._rv

    def list_page(
        self,
        kind: ResourceKind,
        namespace: str | None,
        labels: Predicate,
        fields: Predicate,
        *,
        limit: int,
        token: str,
    ) -> tuple[list[JsonObj], int, str, int]:
        """A chunk of a list (``limit`` and ``continue``, as the API server serves them):
        (items, the list's resourceVersion, the next chunk's token or "", items left);
        ``limit`` 0: all that is left.

        Every chunk of one list comes from the snapshot its first chunk was cut from,
        as the API server reads every chunk at the first one's etcd revision; a token
        this store no longer holds is 410 Expired, as one past compaction is."""
        with self._cond:
            if token:
                held = self._continues.pop(token, None)
                if held is None:
                    raise FakeApiError(
                        410,
                        "The provided continue parameter is too old to display a consistent "
                        "list result. You can start a new list without the continue parameter.",
                    )
                rv, rest = held
            else:
                flt = WatchFilter(kind, namespace, labels, fields)
                rv, rest = self._rv, list(self._matching(flt))
            page, rest = (rest[:limit], rest[limit:]) if limit > 0 else (rest, [])
            following = ""
            if rest:
                following = secrets.token_urlsafe(12)
                self._continues[following] = (rv, rest)
                while len(self._continues) > _CONTINUES_KEPT:
                    del self._continues[next(iter(self._continues))]
            return page, rv, following, len(rest)

    # Writes

    def create(
        self,
        kind: ResourceKind,
        namespace: str | None,
        body: Any,
        *,
        keep_uid: bool = False,
        dry_run: bool = False,
        checked: bool = False,
        admit: Admit | None = None,
    ) -> JsonObj:
        """POST. ``keep_uid`` keeps a given ``metadata.uid`` (seeding tests); the API never does.
        ``checked``: validate against the kind's schema (HTTP writes).

        A dry run answers like the API server's: uid, creationTimestamp and
        generation are filled in, resourceVersion stays empty.
        """
        obj: JsonObj = as_sent(self._checked_body(kind, body), kind)
        meta = obj["metadata"]
        if kind.namespaced:
            if meta.get("namespace") not in (None, "", namespace):
                raise bad_request(
                    "the namespace of the provided object does not match the namespace sent "
                    "on the request"
                )
            meta["namespace"] = namespace
        else:
            meta.pop("namespace", None)
        if meta.get("resourceVersion"):
            raise bad_request("resourceVersion should not be set on objects to be created")
        with self._cond:
            self._check_namespace_open(kind, namespace, meta)
            if not meta.get("name"):
                if not meta.get("generateName"):
                    raise FakeApiError(422, "metadata.name or metadata.generateName is required")
                meta["name"] = self._generated_name(kind, namespace, meta["generateName"])
            key = self._key(kind, namespace, meta["name"])
            self._check_new(kind, key)
            meta.pop("deletionTimestamp", None)
            if not (keep_uid and meta.get("uid")):
                meta["uid"] = str(uuid.uuid4())
            meta.update(creationTimestamp=_now(), generation=1)
            if kind is self._namespace_kind:
                namespaces.prepare_create(obj)
            self._prepare(kind, obj)
            if checked:
                self._validate(kind, obj)
            if admit is not None:
                admit("CREATE", None, obj)
            if not dry_run:
                self._commit(kind, key, "ADDED", obj, None)
            return obj

    def replace(
        self,
        kind: ResourceKind,
        namespace: str | None,
        name: str,
        body: Any,
        *,
        status_only: bool = False,
        dry_run: bool = False,
        checked: bool = False,
        admit: Admit | None = None,
    ) -> JsonObj:
        """PUT, on the main resource or (``status_only``) the status subresource."""
        new = as_sent(self._checked_body(kind, body), kind)
        with self._cond:
            return self._write(
                kind,
                namespace,
                name,
                new,
                status_only=status_only,
                dry_run=dry_run,
                checked=checked,
                resent_status=False,
                admit=admit,
            )

    def patch(
        self,
        kind: ResourceKind,
        namespace: str | None,
        name: str,
        patch: Any,
        content_type: str,
        *,
        status_only: bool = False,
        dry_run: bool = False,
        field_manager: str = "",
        force: bool = False,
        checked: bool = False,
        admit: Admit | None = None,
    ) -> JsonObj:
        """``field_manager``/``force``: server-side apply (claims' status.devices only).

        Opaque parameters are re-encoded as :mod:`fakekube_raw` describes: JSON
        (merge) patches work on the object as answered, strategic merge patches
        and apply on Go's generic form of it.
        """
        media = content_type.split(";", 1)[0].strip().lower()
        with self._cond:
            current = self._get(kind, namespace, name)
            owners: Owners | None = None
            # Each patches its own copy of the stored object, in place.
            if media == "application/merge-patch+json":
                answered = as_answered(copy_json(current), kind)
                patched = as_patched(merge_patch(answered, patch, in_place=True), kind)
            elif media == "application/strategic-merge-patch+json":
                generic = as_generic(copy_json(current), kind)
                patched = as_generic(merge_patch(generic, patch, in_place=True), kind)
            elif media == "application/json-patch+json":
                answered = as_answered(copy_json(current), kind)
                patched = as_patched(json_patch(answered, patch, in_place=True), kind)
            elif media == APPLY_MEDIA_TYPE and kind.kind == "ResourceClaim" and status_only:
                owner_key = (self._key(kind, namespace, name), str(current["metadata"]["uid"]))
                patched, owners = apply_claim_devices(
                    as_generic(copy_json(current), kind),
                    patch,
                    field_manager,
                    self._apply_owners.get(owner_key, {}),
                    force=force,
                )
                patched = as_generic(patched, kind)
            else:
                raise FakeApiError(415, f"the body of the request was in an unknown format {media}")
            new = self._checked_body(kind, patched, fresh=True)
            written = self._write(
                kind,
                namespace,
                name,
                new,
                status_only=status_only,
                dry_run=dry_run,
                checked=checked,
                resent_status=True,
                admit=admit,
            )
            if owners is not None and not dry_run:
                self._apply_owners[owner_key] = owners
            return written

    def delete(
        self,
        kind: ResourceKind,
        namespace: str | None,
        name: str,
        options: Any,
        *,
        dry_run: bool = False,
        admit: Admit | None = None,
    ) -> tuple[bool, JsonObj]:
        """Delete; returns (gone now, object). With finalizers only marks it; a
        Namespace only marks it (the namespace controller ends it)."""
        preconditions = (options or {}).get("preconditions") or {}
        if kind is self._namespace_kind and name in namespaces.IMMORTAL:
            raise namespaces.immortal_refusal(kind, name)
        with self._cond:
            current = self._get(kind, namespace, name)
            meta = current["metadata"]
            for field_name in ("uid", "resourceVersion"):
                wanted = preconditions.get(field_name)
                if wanted and wanted != meta.get(field_name):
                    raise FakeApiError(
                        409,
                        f"Precondition failed: {field_name} in precondition: {wanted}, "
                        f"{field_name} in object meta: {meta.get(field_name)}",
                        kind=kind,
                        name=name,
                    )
            key = self._key(kind, namespace, name)
            if admit is not None:
                admit("DELETE", current, None)
            if kind is self._namespace_kind:
                if not namespaces.terminating(current):
                    obj = namespaces.marked(current, _now())
                    if dry_run:
                        return False, obj
                    self._commit(kind, key, "MODIFIED", obj, current)
                    self._namespaces.schedule(name)
                    return False, obj
                if namespaces.spec_finalizers(current):
                    return False, current
            obj = copy_json(current)
            if obj["metadata"].get("finalizers"):
                if not obj["metadata"].get("deletionTimestamp"):
                    obj["metadata"]["deletionTimestamp"] = _now()
                    if dry_run:
                        return False, obj
                    self._commit(kind, key, "MODIFIED", obj, current)
                return False, self._objects[key]
            if not dry_run:
                self._commit(kind, key, "DELETED", obj, current)
            return True, obj

    def finalize(
        self,
        kind: ResourceKind,
        name: str,
        body: Any,
        *,
        dry_run: bool = False,
        admit: Admit | None = None,
    ) -> JsonObj:
        """PUT ``/api/v1/namespaces/NAME/finalize``: only ``spec.finalizers`` changes
        (the rest of what is sent is ignored); a terminating namespace left with no
        finalizer is gone."""
        if kind is not self._namespace_kind:
            raise unknown_path()
        sent = self._checked_body(kind, body)
        with self._cond:
            current = self._get(kind, None, name)
            _check_identity(kind, None, name, sent["metadata"])
            self._check_version(kind, name, current, sent)
            obj = namespaces.finalized(current, sent)
            if admit is not None:
                admit("UPDATE", current, obj)
            if obj == current:
                return current
            if dry_run:
                return obj
            gone = namespaces.terminating(obj) and not namespaces.held(kind, obj)
            key = self._key(kind, None, name)
            self._commit(kind, key, "DELETED" if gone else "MODIFIED", obj, current)
            return obj

    def sync_namespaces(self) -> None:
        """One pass of the namespace controller over every terminating namespace, now."""
        with self._cond:
            for key in sorted(self._objects):
                if key[:2] == ("", "namespaces") and namespaces.terminating(self._objects.get(key)):
                    self._sync_namespace(key[3])

    def wire(self, kind: ResourceKind, obj: JsonObj) -> bytes:
        """``obj`` (one this store returned) as the server sends it (:func:`encode_wire`),
        encoded once per stored version: a write's answer and every watcher's event
        share the bytes. Keyed by identity, which is safe as stored objects never change
        and the cache holds each one it keys."""
        held = self._wire.get(id(obj))
        if held is not None and held[0] is obj:
            return held[1]
        data = encode_wire(obj, raw_paths(kind))
        with self._wire_lock:
            if len(self._wire) >= _WIRE_KEPT:
                del self._wire[next(iter(self._wire))]  # the oldest
            self._wire[id(obj)] = (obj, data)
        return data

    # Watch

    def watch_start(self, flt: WatchFilter, resource_version: str) -> tuple[list[JsonObj], int]:
        """Initial ADDED objects and the resourceVersion to stream after."""
        with self._cond:
            if resource_version in ("", "0"):
                return list(self._matching(flt)), self._rv
            try:
                start = int(resource_version)
            except ValueError:
                raise bad_request(f"invalid resourceVersion {resource_version!r}") from None
            self._check_retained(start)
            return [], start

    def next_events(
        self, flt: WatchFilter, after: int, deadline: float | None
    ) -> tuple[list[tuple[str, JsonObj]], int, bool]:
        """Block until events after ``after`` exist; returns (events, new cursor, stream done)."""
        with self._cond:
            while True:
                if self._closing:
                    return [], after, True
                self._check_retained(after)
                start = bisect.bisect_right(self._history, after, key=lambda e: e.rv)
                if start < len(self._history):
                    batch = self._history[start:]
                    views = [v for v in map(flt.view, batch) if v is not None]
                    return views, batch[-1].rv, False
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return [], after, True
                self._changed[flt.kind].wait(remaining)

    def watch_opened(self) -> None:
        with self._cond:
            self._active_watches += 1

    def watch_closed(self) -> None:
        with self._cond:
            self._active_watches -= 1
            self._cond.notify_all()

    def end_watches(self) -> None:
        """Make every open and future watch stream end (server shutdown); the namespace
        controller pauses."""
        with self._cond:
            self._namespaces.stop()
            self._closing = True
            self._cond.notify_all()
            for changed in self._changed.values():
                changed.notify_all()

    def wait_watches_ended(self, timeout: float) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: self._active_watches == 0, timeout=timeout)

    def reopen(self) -> None:
        with self._cond:
            self._closing = False
            self._namespaces.resume()

    def compact(self) -> None:
        """Forget the event history, as etcd compaction does."""
        with self._cond:
            self._history.clear()
            self._oldest_rv = self._rv

    # Internals (call with the lock held)

    def _key(self, kind: ResourceKind, namespace: str | None, name: str) -> _Key:
        return (kind.group, kind.plural, namespace or "", name)

    def _get(self, kind: ResourceKind, namespace: str | None, name: str) -> JsonObj:
        obj = self._objects.get(self._key(kind, namespace, name))
        if obj is None:
            raise not_found(kind, name)
        return obj

    def _matching(self, flt: WatchFilter) -> Iterator[JsonObj]:
        for key in sorted(self._objects):
            obj = self._objects[key]
            if key[:2] == (flt.kind.group, flt.kind.plural) and flt.matches(obj):
                yield obj

    def _generated_name(self, kind: ResourceKind, namespace: str | None, prefix: str) -> str:
        alphabet = string.ascii_lowercase + string.digits
        while True:
            name = prefix + "".join(secrets.choice(alphabet) for _ in range(5))
            if self._key(kind, namespace, name) not in self._objects:
                return name

    def _checked_body(self, kind: ResourceKind, body: Any, *, fresh: bool = False) -> JsonObj:
        """``fresh``: ``body`` is the store's own (a patched copy): not copied again."""
        if not isinstance(body, dict) or not isinstance(body.get("metadata", {}), dict):
            raise bad_request("the request body must be a JSON object with object metadata")
        obj = body if fresh else copy_json(body)
        for attr, expected in (("apiVersion", kind.api_version), ("kind", kind.kind)):
            if obj.get(attr) not in (None, "", expected):
                raise bad_request(f"{attr} {obj[attr]!r} does not match {expected!r}")
            obj[attr] = expected
        obj.setdefault("metadata", {})
        return obj

    def _write(
        self,
        kind: ResourceKind,
        namespace: str | None,
        name: str,
        new: JsonObj,
        *,
        status_only: bool,
        dry_run: bool,
        checked: bool,
        resent_status: bool,
        admit: Admit | None,
    ) -> JsonObj:
        """``resent_status``: the write carries the whole object as the server re-encoded
        it (a patch), so a main-resource write is checked against the stored status too."""
        if status_only and not kind.status_subresource:
            raise unknown_path()
        current = self._get(kind, namespace, name)
        check_claim_update(
            kind,
            name,
            current,
            new,
            spec=not status_only,
            status=status_only or resent_status,
        )
        cur_meta, new_meta = current["metadata"], new["metadata"]
        _check_identity(kind, namespace, name, new_meta)
        self._check_version(kind, name, current, new)
        obj = _halves(kind, current, new, status_only=status_only)
        if kind is self._namespace_kind and not status_only:
            namespaces.keep_finalizers(current, obj)
        meta = obj["metadata"] = copy_json(cur_meta) if status_only else new_meta
        for attr in (*_SERVER_METADATA, "namespace", "resourceVersion"):
            if attr in cur_meta:
                meta[attr] = cur_meta[attr]
            else:
                meta.pop(attr, None)
        if status_only:
            check_claim_status(kind, name, current, obj)
        self._prepare(kind, obj)
        if checked:
            self._validate(kind, obj)
        if admit is not None:
            admit("UPDATE", current, obj)
        # A no-op write keeps its resourceVersion. (``!=`` first, in C: every RawJson
        # here says what its text says, so objects unequal as values are never the
        # same bytes; equal ones are compared byte for byte.)
        if obj == current and same_bytes(obj, current):
            return current
        if without(obj, "metadata", "status") != without(current, "metadata", "status"):
            meta["generation"] = int(cur_meta.get("generation", 0)) + 1
        key = self._key(kind, namespace, name)
        if dry_run:
            return obj  # still the stored resourceVersion
        gone = bool(meta.get("deletionTimestamp")) and not namespaces.held(kind, obj)
        self._commit(kind, key, "DELETED" if gone else "MODIFIED", obj, current)
        return obj

    def _check_namespace_open(
        self, kind: ResourceKind, namespace: str | None, meta: JsonObj
    ) -> None:
        """NamespaceLifecycle admission of a create: nothing new in a terminating
        namespace (403). Before the name is generated, as admission runs first."""
        if kind.namespaced and namespaces.terminating(self._namespace(namespace)):
            named = str(meta.get("name") or meta.get("generateName") or "")
            raise namespaces.terminating_refusal(kind, str(namespace), named)

    def _check_new(self, kind: ResourceKind, key: _Key) -> None:
        """409 AlreadyExists when ``key`` is taken, "object is being deleted" when what
        holds it is marked deleted (a finalizer, a terminating namespace)."""
        existing = self._objects.get(key)
        if existing is None:
            return
        err = FakeApiError(
            409,
            f'{kind.qualified} "{key[3]}" already exists',
            reason="AlreadyExists",
            kind=kind,
            name=key[3],
        )
        raise namespaces.being_deleted(err) if namespaces.terminating(existing) else err

    def _check_version(self, kind: ResourceKind, name: str, current: JsonObj, new: JsonObj) -> None:
        """A set ``metadata.resourceVersion`` must be the stored one (409 Conflict)."""
        wanted_rv = new["metadata"].get("resourceVersion")
        if wanted_rv and wanted_rv != current["metadata"]["resourceVersion"]:
            raise FakeApiError(
                409,
                f'Operation cannot be fulfilled on {kind.qualified} "{name}": the object has '
                "been modified; please apply your changes to the latest version and try again",
                kind=kind,
                name=name,
            )

    def _sync_namespace(self, name: str) -> None:
        """One pass of the namespace controller over the namespace ``name``: delete
        its content, write the deletion conditions, and once it is empty remove the
        ``kubernetes`` finalizer (the namespace goes when no finalizer is left)."""
        ns_kind = self._namespace_kind
        current = self._namespace(name)
        if ns_kind is None or current is None or not namespaces.terminating(current):
            return
        if namespaces.FINALIZER not in namespaces.spec_finalizers(current):
            return  # finalized by this controller; other finalizers' owners go on
        content = [
            (key, self._kinds_by_key[key[:2]])
            for key in sorted(self._objects)
            if key[2] == name and self._kinds_by_key[key[:2]].namespaced
        ]
        for key, kind in content:
            obj = self._objects[key]
            if not namespaces.terminating(obj):
                self._remove(kind, key, obj)
        remaining = [(kind, self._objects[key]) for key, kind in content if key in self._objects]
        ns_key = self._key(ns_kind, None, name)
        current = self._objects[ns_key]
        old = (current.get("status") or {}).get("conditions") or []
        wanted = namespaces.conditions(remaining, old, _now())
        if not namespaces.same_conditions(old, wanted):
            updated = copy_json(current)
            updated.setdefault("status", {})["conditions"] = wanted
            self._commit(ns_kind, ns_key, "MODIFIED", updated, current)
            current = updated
        if remaining:
            return  # looked at again when something in it changes
        left = sorted(set(namespaces.spec_finalizers(current)) - {namespaces.FINALIZER})
        obj = namespaces.finalized(current, {"spec": {"finalizers": left}})
        gone = not namespaces.held(ns_kind, obj)
        self._commit(ns_kind, ns_key, "DELETED" if gone else "MODIFIED", obj, current)

    def _remove(self, kind: ResourceKind, key: _Key, current: JsonObj) -> None:
        """Delete a stored object as a DELETE without options does: one with
        finalizers is only marked."""
        obj = copy_json(current)
        if obj["metadata"].get("finalizers"):
            obj["metadata"]["deletionTimestamp"] = _now()
            self._commit(kind, key, "MODIFIED", obj, current)
        else:
            self._commit(kind, key, "DELETED", obj, current)

    def _namespace(self, name: str | None) -> JsonObj | None:
        """The Namespace ``name``, if namespaces are served and it exists."""
        if self._namespace_kind is None or not name:
            return None
        return self._objects.get(("", "namespaces", "", name))

    def _commit(
        self,
        kind: ResourceKind,
        key: _Key,
        event_type: str,
        obj: JsonObj,
        old: JsonObj | None,
    ) -> None:
        self._rv += 1
        obj["metadata"]["resourceVersion"] = str(self._rv)
        if event_type == "DELETED":
            del self._objects[key]
        else:
            self._objects[key] = obj
        self._history.append(_Event(self._rv, kind, event_type, obj, old))
        if len(self._history) > self._history_limit:
            dropped = self._history[: len(self._history) - self._history_limit]
            del self._history[: len(dropped)]
            self._oldest_rv = dropped[-1].rv
        self._changed[kind].notify_all()
        if kind.namespaced and namespaces.terminating(self._namespace(key[2])):
            self._namespaces.schedule(key[2])  # content changed: the controller looks again

    def _check_retained(self, resource_version: int) -> None:
        if resource_version < self._oldest_rv:
            raise FakeApiError(
                410, f"too old resource version: {resource_version} ({self._oldest_rv})"
            )
