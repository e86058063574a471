"""A fake Kubernetes API server for tests: real HTTP, real REST paths, real JSON.

:class:`FakeKubeApi` runs a stdlib ``ThreadingHTTPServer`` on ``127.0.0.1``
(port 0) in a background thread, so the official ``kubernetes`` client (or
``urllib``) talks to it exactly as to a cluster: we fake at the transport
seam, never inside the client. Tests seed and inspect state through the same
object (``create``/``get``/``update``/``delete``/``objects``), count requests
(``requests``; ``request_log`` and ``answer_log`` with times and statuses), inject
failures (``fail_next``, ``drop_next``) and slow every write (``write_delay_s``).

Resource kinds live in a registry (``DEFAULT_KINDS`` in
:mod:`tests.support.fakekube_types`: resourceclaims, resourceslices,
deviceclasses, nodes); serving another kind is one :class:`ResourceKind` line
there, e.g. ``ResourceKind("", "v1", "pods", "Pod", namespaced=True)``, or
pass ``FakeKubeApi(kinds=(*DEFAULT_KINDS, extra))`` for one test.

Release emulation: ``FakeKubeApi(kube_minor=34)`` serves ``/version`` as
1.34 and, like a 1.34/1.35 API server with its default feature gates, silently
drops the DRA fields of DRAConsumableCapacity, DRAPartitionableDevices,
DRADeviceTaints (and a few more) from written objects; from 1.35 on it rejects
a ResourceSlice holding both devices and sharedCounters (422). The default is
1.36 (all those gates on); ``drop_gated_fields=`` overrides the choice. The
exact field list, and what is not emulated, is in
:mod:`tests.support.fakekube_version`.

Layout: ``fakekube_types`` (kinds, Status errors), ``fakekube_selectors``,
``fakekube_patch``, ``fakekube_raw``, ``fakekube_claims``, ``fakekube_schema`` (with
its compiled check, ``fakekube_schema_compiled``) and ``fakekube_version`` (pure),
``fakekube_store`` (objects, resourceVersion, watch history under one lock; stored
objects never change, so they are shared, not copied), ``fakekube_http`` (routing,
verbs, watch streams) and this module (lifecycle, test-side API, fault injection).
Each connection gets a thread; :meth:`FakeKubeApi.close` ends open watch streams and cuts idle
keep-alive connections, so it returns promptly.

Implemented, per kind, namespaced or cluster-scoped:

* get, list (``{kind: XList, apiVersion, metadata: {resourceVersion}, items}``,
  items without kind/apiVersion, as the API server writes them), cluster-wide
  list of a namespaced kind;
* create (POST): uid, resourceVersion, creationTimestamp, generation, name from
  generateName; 409 AlreadyExists;
* update (PUT): 409 Conflict when ``metadata.resourceVersion`` is set and stale;
  a no-op update keeps the resourceVersion; generation grows when anything but
  metadata/status changes;
* patch (PATCH): ``application/merge-patch+json`` and
  ``application/strategic-merge-patch+json`` both as RFC 7386 JSON merge patch
  (no strategic-merge list semantics), ``application/json-patch+json`` as RFC
  6902 (add, remove, replace, test, move, copy); a resourceVersion in the
  patched result is a precondition;
* the ``status`` subresource (GET/PUT/PATCH) changes only ``status``; writes to
  the main resource keep the stored ``status``;
* server-side apply (``application/apply-patch+yaml``, ``fieldManager``,
  ``force``) of a ResourceClaim's ``status.devices`` on its ``status``
  subresource, with list-map merge and per-manager ownership; its limits are in
  :mod:`tests.support.fakekube_apply`;
* delete: returns the deleted object; with finalizers it only sets
  ``deletionTimestamp`` (202), and the object goes once an update empties the
  finalizers; ``preconditions`` (uid, resourceVersion) in DeleteOptions; a create
  of a name whose object is being deleted is 409 "object is being deleted: ...";
* namespace lifecycle (:mod:`tests.support.fakekube_namespaces`): a Namespace gets
  the ``kubernetes`` finalizer and ``phase: Active``; DELETE leaves it
  ``Terminating`` (200) while a namespace controller, ``namespace_delay_s`` later,
  deletes its content (honouring the content's finalizers), then its finalizer,
  then it; meanwhile creates inside it are 403 and a create of its name is 409, as
  the API server's NamespaceLifecycle admission and registry answer; the
  ``finalize`` subresource (PUT); :meth:`FakeKubeApi.sync_namespaces` runs the
  controller at once;
* watch (``watch=true|1``): chunked newline-delimited JSON events. Without a
  resourceVersion (or ``0``) it first sends ADDED for every matching object;
  with one it replays retained events after it, or sends an ``ERROR`` event
  carrying a 410 ``Expired`` Status when that version is older than the
  retained history (see :meth:`FakeKubeApi.compact`); ``timeoutSeconds`` ends
  the stream. An object that stops or starts matching the selectors is sent as
  DELETED or ADDED, as the API server's watch cache does;
* ``labelSelector`` (``a=b``, ``a==b``, ``a!=b``, ``a``, ``!a``, ``a in (x,y)``,
  ``a notin (x,y)``) and ``fieldSelector`` (any dotted path, e.g.
  ``metadata.name``, ``spec.nodeName``, ``spec.driver``; ``=``, ``==``, ``!=``);
* ``dryRun=All`` on create, update, patch and delete: validated and answered as
  if stored (a dry-run create gets uid, creationTimestamp and generation but,
  as from the API server, no resourceVersion), nothing stored, no watch event;
  any other ``dryRun`` value is 400;
* ``GET /version`` (``major``, ``minor``, ``gitVersion``, ...);
* one global, monotonically increasing resourceVersion;
* errors as real ``Status`` objects (NotFound, AlreadyExists, Conflict,
  Expired, BadRequest, MethodNotAllowed, Invalid, UnsupportedMediaType).

* a ResourceClaim's ``status.reservedFor`` checked as the API server checks it
  (resource, name, uid required; uids unique; at most 256; only with an allocation;
  none added while the claim is being deleted: :mod:`tests.support.fakekube_claims`),
  and a ``/status`` write's metadata (finalizers, annotations) ignored, as the
  status strategy resets it;
* opaque ``parameters`` and ``status.devices[].data`` kept as the bytes sent,
  a ResourceClaim's spec and (once set) ``status.allocation`` immutable as the
  real server compares them (byte for byte), the re-encoding of patches and
  apply (:mod:`tests.support.fakekube_raw`);
* every HTTP write checked against the release's official OpenAPI schema
  (strict: unknown fields refused; :mod:`tests.support.fakekube_schema`).

Authentication, RBAC authorization and validating admission (the chart's
ValidatingAdmissionPolicies, the ResourceClaim status authorization of 1.36+) when
built with ``security=`` (:class:`~tests.support.fakekube_admission.ApiSecurity`,
from rendered manifests: :func:`tests.support.chart.chart_api`): every request
then needs a token from :meth:`FakeKubeApi.token_for` (none: ``system:anonymous``),
and is answered 401, 403 or 422 as kube-apiserver answers; what is emulated is in
:mod:`tests.support.fakekube_auth` and :mod:`tests.support.fakekube_admission`.
Without it everything is allowed (``--authorization-mode=AlwaysAllow``).

NOT implemented: mutating admission, defaulting, validation
beyond the schema and the rules above, server-side apply of anything but
claims' ``status.devices`` (``application/apply-patch+yaml`` gets 415) and
managedFields, strategic-merge
semantics (list merge keys, ``$patch`` directives), which fields a kind allows
in a fieldSelector (every path is accepted), pagination (``limit``/``continue``
are ignored), ``resourceVersion``/``resourceVersionMatch`` on get and list,
watch bookmarks and ``sendInitialEvents``, deletecollection, graceful deletion
and garbage collection (ownerReferences), protobuf and YAML bodies,
discovery (``/api``, ``/apis``), a namespaced object's namespace need not
exist (the API server answers 404 for a create in a missing one), create-on-PUT
(PUT of a missing object is 404). Create keeps a given ``status``, which real
servers drop for most kinds, and the Python-side ``create`` also keeps a given
``metadata.uid``: shortcuts for seeding tests.
"""

from __future__ import annotations

import contextlib
import socket
import ssl
import threading
from types import TracebackType
from typing import Self

from tests.support.fakekube_admission import ApiSecurity
from tests.support.fakekube_auth import User
from tests.support.fakekube_http import Answer, Fault, RecordedRequest, Server
from tests.support.fakekube_namespaces import DEFAULT_DELAY_S as DEFAULT_NAMESPACE_DELAY_S
from tests.support.fakekube_raw import copy_json
from tests.support.fakekube_store import Store, accept_all
from tests.support.fakekube_types import (
    DEFAULT_KINDS,
    FakeApiError,
    JsonObj,
    ResourceKind,
    status_object,
)
from tests.support.fakekube_version import ServerVersion

__all__ = [
    "DEFAULT_KINDS",
    "Answer",
    "FakeApiError",
    "FakeKubeApi",
    "JsonObj",
    "RecordedRequest",
    "ResourceKind",
    "status_object",
]


class FakeKubeApi:
    """The fake API server and its test-side handle.

    Use as a context manager (or :meth:`start`/:meth:`close`); the
    ``fake_kube`` fixture in ``tests/conftest.py`` yields a started one. The
    Python-side methods act directly on the store (no HTTP, not logged in
    :attr:`requests`), raise :class:`FakeApiError` like the HTTP side answers,
    and produce the same watch events. What they return is a copy: a test may
    change it without touching the stored object.
    """

    def __init__(
        self,
        kinds: tuple[ResourceKind, ...] = DEFAULT_KINDS,
        *,
        history_limit: int = 1000,
        kube_minor: int = 36,
        drop_gated_fields: bool | None = None,
        binary_minor: int | None = None,
        validate_schema: bool = True,
        tls: ssl.SSLContext | None = None,
        security: ApiSecurity | None = None,
        write_delay_s: float = 0.0,
        namespace_delay_s: float | None = DEFAULT_NAMESPACE_DELAY_S,
    ) -> None:
        """``kube_minor``: the release it plays (``/version``, 1.35+ validation);
        ``drop_gated_fields``: drop the fields of the DRA gates that are off
        before 1.36; ``None`` decides by ``kube_minor``; ``binary_minor``: a newer
        binary emulating ``kube_minor`` (``/version`` shows both); ``validate_schema``
        False skips the schema check of HTTP writes (benchmarks: a real API server's
        CPU is not the node's); ``tls``: serve HTTPS with this server context, as
        every real API server does (:func:`tests.support.tls.server_context`);
        ``security``: authenticate, authorize and admit every HTTP request;
        ``write_delay_s``: every HTTP write (POST, PUT, PATCH, DELETE) waits this long
        before it is handled, each on its own connection's thread (a slow etcd: the
        latency of one write, not a limit on how many are in flight);
        ``namespace_delay_s``: how long after a Namespace is deleted (and after each
        change inside it while it is terminating) the fake's namespace controller acts on
        it; None: only when a test calls :meth:`sync_namespaces`."""
        self.tls = tls
        self.write_delay_s = write_delay_s
        self.security = security
        self.version = ServerVersion(kube_minor, drop_gated_fields, binary_minor)
        validate = self.version.validate if validate_schema else accept_all
        self._store = Store(kinds, history_limit, self.version.prepare, validate, namespace_delay_s)
        self._kinds_by_ref: dict[str, ResourceKind] = {}
        """What :meth:`kind` found for each name it was given."""
        self._lock = threading.Lock()  # requests, faults and connections
        self._request_log: list[RecordedRequest] = []
        self._answer_log: list[Answer] = []
        self._faults: list[Fault] = []
        self._connections: set[socket.socket] = set()
        self._server: Server | None = None
        self._thread: threading.Thread | None = None

    # Lifecycle

    def start(self) -> Self:
        if self._server is not None:
            raise RuntimeError("FakeKubeApi already started")
        self._store.reopen()
        self._server = Server(
            self._store,
            self._record,
            self._track_connection,
            self.version.version_info(),
            tls=self.tls,
            security=self.security,
            answered=self._answered,
            write_delay_s=self.write_delay_s,
        )
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.01},  # how long close() waits for the loop
            name="fake-kube-api",
            daemon=True,
        )
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop serving; open watch streams end and idle connections are cut promptly."""
        if self._server is None:
            return
        self._store.end_watches()
        self._server.shutdown()
        self._store.wait_watches_ended(timeout=5)
        with self._lock:
            connections = list(self._connections)
        for conn in connections:
            # Wakes handler threads blocked reading the next keep-alive request.
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._server = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    @property
    def url(self) -> str:
        """``http://127.0.0.1:<port>`` (``https`` with ``tls``), for
        ``make_api_client(None, host=url)``."""
        if self._server is None:
            raise RuntimeError("FakeKubeApi is not started")
        host, port = self._server.server_address[:2]
        return f"{'https' if self.tls else 'http'}://{host!s}:{port}"

    # Identities

    def token_for(self, user: User) -> str:
        """A bearer token that authenticates as ``user`` (needs ``security``)."""
        if self.security is None:
            raise RuntimeError("this FakeKubeApi authorizes nothing: build it with security=")
        return self.security.token_for(user)

    # Objects

    def kind(self, ref: str | ResourceKind) -> ResourceKind:
        """A served kind by Kind (``"ResourceClaim"``), plural, or ``apiVersion/Kind``."""
        if isinstance(ref, ResourceKind):
            return ref
        known = self._kinds_by_ref.get(ref)
        if known is not None:
            return known
        found = [
            k for k in self._store.kinds if ref in (k.kind, k.plural, f"{k.api_version}/{k.kind}")
        ]
        if len(found) != 1:
            raise ValueError(f"{ref!r} names {len(found)} served kinds; pass a ResourceKind")
        self._kinds_by_ref[ref] = found[0]  # the served kinds never change
        return found[0]

    def create(self, obj: JsonObj) -> JsonObj:
        """Store a new object, as POST does, and return it.

        The kind comes from ``apiVersion``/``kind``; the namespace defaults to
        ``default``. Unlike POST, a given ``metadata.uid`` is kept, so tests
        can build a ``ClaimRef`` before seeding.
        """
        kind = self.kind(f"{obj.get('apiVersion')}/{obj.get('kind')}")
        stored = self._store.create(kind, self._namespace_of(kind, obj), obj, keep_uid=True)
        return copy_json(stored)

    def get(self, kind: str | ResourceKind, name: str, namespace: str | None = None) -> JsonObj:
        k = self.kind(kind)
        return copy_json(self._store.get(k, self._namespace(k, namespace), name))

    def update(self, obj: JsonObj) -> JsonObj:
        """Like PUT: a set ``metadata.resourceVersion`` must be current."""
        kind = self.kind(f"{obj.get('apiVersion')}/{obj.get('kind')}")
        name = str((obj.get("metadata") or {}).get("name", ""))
        return copy_json(self._store.replace(kind, self._namespace_of(kind, obj), name, obj))

    def update_status(self, obj: JsonObj) -> JsonObj:
        """Like PUT on ``/status``: only ``status`` changes."""
        kind = self.kind(f"{obj.get('apiVersion')}/{obj.get('kind')}")
        name = str((obj.get("metadata") or {}).get("name", ""))
        namespace = self._namespace_of(kind, obj)
        return copy_json(self._store.replace(kind, namespace, name, obj, status_only=True))

    def patch(
        self,
        kind: str | ResourceKind,
        name: str,
        patch: JsonObj,
        namespace: str | None = None,
        *,
        status: bool = False,
    ) -> JsonObj:
        """JSON merge patch (RFC 7386) of the object, or of its status with ``status=True``."""
        k = self.kind(kind)
        patched = self._store.patch(
            k,
            self._namespace(k, namespace),
            name,
            patch,
            "application/merge-patch+json",
            status_only=status,
        )
        return copy_json(patched)

    def delete(self, kind: str | ResourceKind, name: str, namespace: str | None = None) -> JsonObj:
        k = self.kind(kind)
        return copy_json(self._store.delete(k, self._namespace(k, namespace), name, None)[1])

    def objects(
        self, kind: str | ResourceKind, namespace: str | None = None, *, copies: bool = True
    ) -> list[JsonObj]:
        """Stored objects of ``kind`` (all namespaces unless given), sorted by namespace/name.

        ``copies=False``: the stored objects themselves, which the caller must only read
        (a benchmark reading thousands of claims at the end of a run)."""
        k = self.kind(kind)
        stored = self._store.list_objects(k, namespace, lambda _: True, lambda _: True)[0]
        return copy_json(stored) if copies else stored

    def sync_namespaces(self) -> None:
        """Run the namespace controller over every terminating namespace now (without
        waiting for ``namespace_delay_s``): what has no finalizers in them is deleted,
        and an emptied namespace loses its ``kubernetes`` finalizer and goes."""
        self._store.sync_namespaces()

    @property
    def resource_version(self) -> int:
        """The global resourceVersion of the last write."""
        return self._store.resource_version

    def compact(self) -> None:
        """Drop the watch history: resuming from any older resourceVersion gets 410 Expired."""
        self._store.compact()

    # Requests and faults

    @property
    def requests(self) -> list[tuple[str, str]]:
        """``(method, path)`` of every HTTP request so far, query string excluded."""
        with self._lock:
            return [(r.method, r.path) for r in self._request_log]

    @property
    def request_log(self) -> list[RecordedRequest]:
        with self._lock:
            return list(self._request_log)

    @property
    def peak_writes_in_flight(self) -> int:
        """With ``write_delay_s``: the most writes the server held at one moment."""
        return self._server.peak_delayed_writes if self._server is not None else 0

    @property
    def answer_log(self) -> list[Answer]:
        """Every request answered so far (not watch streams), in the order answered,
        with its status and when it was answered (benchmarks: when a write took effect)."""
        with self._lock:
            return list(self._answer_log)

    def clear_requests(self) -> None:
        with self._lock:
            self._request_log.clear()
            self._answer_log.clear()

    def fail_next(
        self,
        method: str,
        path_substring: str,
        status: int,
        times: int = 1,
        *,
        message: str = "injected failure",
        retry_after: int | None = None,
    ) -> None:
        """Answer the next ``times`` matching requests with a ``status`` Status.

        ``method`` may be ``"*"``; ``path_substring`` is matched against the
        path with its query string. Leave ``retry_after`` unset for 429/503:
        urllib3 itself retries those when a Retry-After header is present.
        """
        self._add_fault(Fault(method.upper(), path_substring, status, times, message, retry_after))

    def drop_next(self, method: str, path_substring: str, times: int = 1) -> None:
        """Close the connection without a response for the next ``times`` matching requests.

        urllib3 retries dropped idempotent requests (3 times by default), so
        make ``times`` larger than that to see the failure in the client.
        """
        self._add_fault(Fault(method.upper(), path_substring, None, times, "", None))

    def _add_fault(self, fault: Fault) -> None:
        if fault.remaining < 1:
            raise ValueError("times must be at least 1")
        with self._lock:
            self._faults.append(fault)

    # Used by the HTTP layer

    def _record(self, request: RecordedRequest, raw_path: str) -> Fault | None:
        """Log a request and return the fault it triggers, if any."""
        with self._lock:
            self._request_log.append(request)
            for fault in self._faults:
                if fault.method in ("*", request.method) and fault.path_substring in raw_path:
                    fault.remaining -= 1
                    if fault.remaining == 0:
                        self._faults.remove(fault)
                    return fault
        return None

    def _answered(self, answer: Answer) -> None:
        with self._lock:
            self._answer_log.append(answer)

    def _track_connection(self, conn: socket.socket, add: bool) -> None:
        with self._lock:
            if add:
                self._connections.add(conn)
            else:
                self._connections.discard(conn)

    def _namespace(self, kind: ResourceKind, namespace: str | None) -> str | None:
        if not kind.namespaced:
            return None
        return namespace or "default"

    def _namespace_of(self, kind: ResourceKind, obj: JsonObj) -> str | None:
        return self._namespace(kind, (obj.get("metadata") or {}).get("namespace"))
