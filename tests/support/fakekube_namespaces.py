"""Namespace lifecycle of the fake API server, as kube-apiserver and the namespace
controller of kube-controller-manager run it.

Observed on a real 1.36 API server (fact sheet 5.3.2): a deleted Namespace stays
``Terminating`` until its contents and its ``kubernetes`` finalizer are gone. What
the fake does, from upstream's namespace strategy and storage
(``pkg/registry/core/namespace``), the NamespaceLifecycle admission plugin
(``plugin/pkg/admission/namespace/lifecycle``) and the namespace controller
(``pkg/controller/namespace/deletion``):

* create: ``spec.finalizers`` gets ``kubernetes`` (added to any given), the status
  is ``{phase: Active}`` whatever was sent;
* an update of the Namespace keeps its ``spec.finalizers`` (and its status); only
  ``PUT .../namespaces/NAME/finalize`` changes them (and only them here);
* DELETE: the first sets ``metadata.deletionTimestamp`` and ``status.phase:
  Terminating`` and answers the object (200); a later one answers it again (200);
  ``default``, ``kube-system`` and ``kube-public`` may not be deleted (403);
* while it is terminating: a create of a namespace of that name is ``409
  AlreadyExists`` "object is being deleted: ..." (as for any kind whose object is
  being deleted), a create of anything in it is ``403 Forbidden`` "unable to create
  new content in namespace NS because it is being terminated" with the cause
  ``NamespaceTerminating``; updates, patches and deletes of what is in it go on (that
  is how finalizers are removed);
* the fake's namespace controller (:class:`NamespaceController`), a moment later
  (``namespace_delay_s``): deletes every object in the namespace (one with
  finalizers only gets its ``deletionTimestamp``), writes the five deletion
  conditions on the namespace's status, and, once nothing is left, removes the
  ``kubernetes`` finalizer; with no finalizer left the namespace is gone (a watch
  sees MODIFIED, MODIFIED, DELETED). While something is left it looks again each
  time an object in the namespace changes.

NOT emulated: a create in a namespace that does not exist is accepted (the real
server answers ``404 namespaces "NS" not found``), the NamespaceLifecycle checks of
updates in a missing namespace, the orphan and foreground finalizers of
``propagationPolicy`` (there is no garbage collector), pods' graceful deletion, the
controller's back-off estimates, and the validation of finalizer names.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from tests.support.fakekube_raw import copy_json
from tests.support.fakekube_types import FakeApiError, JsonObj, ResourceKind

FINALIZER = "kubernetes"
"""The namespace controller's finalizer, in ``spec.finalizers``."""
IMMORTAL = frozenset({"default", "kube-system", "kube-public"})
"""kube-apiserver's immortal namespaces: NamespaceLifecycle refuses their deletion."""
SUBRESOURCES = frozenset({"status", "finalize"})
"""``/api/v1/namespaces/NAME/<these>`` name the Namespace's subresources, not a kind."""

DEFAULT_DELAY_S = 0.1
"""How long after a namespace is marked deleted (or something in it changes) the fake's
namespace controller looks at it: long enough for a client to see it ``Terminating``
and for a delete-then-create to be refused, short enough for tests that wait."""

_CONDITIONS = (
    (
        "NamespaceDeletionDiscoveryFailure",
        "ResourcesDiscovered",
        "All resources successfully discovered",
    ),
    (
        "NamespaceDeletionGroupVersionParsingFailure",
        "ParsedGroupVersions",
        "All legacy kube types successfully parsed",
    ),
    (
        "NamespaceDeletionContentFailure",
        "ContentDeleted",
        "All content successfully deleted, may be waiting on finalization",
    ),
    ("NamespaceContentRemaining", "ContentRemoved", "All content successfully removed"),
    ("NamespaceFinalizersRemaining", "ContentRemoved", "All content successfully removed"),
)
"""(type, reason, message) of each condition the controller keeps, as it writes them
when nothing failed (``status_condition_utils.go``)."""


def is_namespace(kind: ResourceKind) -> bool:
    return kind.group == "" and kind.plural == "namespaces"


def spec_finalizers(obj: JsonObj) -> list[str]:
    return list((obj.get("spec") or {}).get("finalizers") or ())


def held(kind: ResourceKind, obj: JsonObj) -> bool:
    """Whether a finalizer keeps ``obj`` stored once it is marked deleted: its
    ``metadata.finalizers``, and for a Namespace its ``spec.finalizers`` too."""
    if (obj.get("metadata") or {}).get("finalizers"):
        return True
    return is_namespace(kind) and bool(spec_finalizers(obj))


def terminating(obj: JsonObj | None) -> bool:
    return obj is not None and bool((obj.get("metadata") or {}).get("deletionTimestamp"))


def prepare_create(obj: JsonObj) -> None:
    """The namespace strategy's PrepareForCreate, in place."""
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        spec = obj["spec"] = {}
    finalizers = spec_finalizers(obj)
    if FINALIZER not in finalizers:
        finalizers.append(FINALIZER)
    spec["finalizers"] = finalizers
    obj["status"] = {"phase": "Active"}


def keep_finalizers(current: JsonObj, obj: JsonObj) -> None:
    """An update of the Namespace itself keeps its ``spec.finalizers`` (in place)."""
    kept = spec_finalizers(current)
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        spec = obj["spec"] = {}
    if kept:
        spec["finalizers"] = kept
    else:
        spec.pop("finalizers", None)
    if not spec and "spec" not in current:
        del obj["spec"]


def finalized(current: JsonObj, sent: JsonObj) -> JsonObj:
    """What ``PUT .../finalize`` stores: a copy of ``current`` with the sent
    ``spec.finalizers``."""
    obj = copy_json(current)
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        spec = obj["spec"] = {}
    wanted = spec_finalizers(sent)
    if wanted:
        spec["finalizers"] = wanted
    else:
        spec.pop("finalizers", None)
    return obj


def marked(current: JsonObj, now: str) -> JsonObj:
    """A copy of the namespace as its first DELETE leaves it."""
    obj = copy_json(current)
    obj["metadata"]["deletionTimestamp"] = now
    status = obj.get("status")
    if not isinstance(status, dict):
        status = obj["status"] = {}
    status["phase"] = "Terminating"
    return obj


def being_deleted(err: FakeApiError) -> FakeApiError:
    """A create's ``409 AlreadyExists`` when the existing object is being deleted."""
    err.message = f"object is being deleted: {err.message}"
    err.args = (f"{err.code}: {err.message}",)
    return err


def terminating_refusal(kind: ResourceKind, namespace: str, name: str) -> FakeApiError:
    """NamespaceLifecycle's refusal of a create inside a terminating namespace."""
    subject = f'{kind.qualified} "{name}"' if name else kind.qualified
    err = FakeApiError(
        403,
        f"{subject} is forbidden: unable to create new content in namespace {namespace} "
        "because it is being terminated",
        kind=kind,
        name=name,
    )
    err.details = {"name": name, "group": kind.group, "kind": kind.plural} | {
        "causes": [
            {
                "reason": "NamespaceTerminating",
                "message": f"namespace {namespace} is being terminated",
                "field": "metadata.namespace",
            }
        ]
    }
    return err


def immortal_refusal(kind: ResourceKind, name: str) -> FakeApiError:
    return FakeApiError(
        403,
        f'{kind.qualified} "{name}" is forbidden: this namespace may not be deleted',
        kind=kind,
        name=name,
    )


def conditions(
    remaining: Iterable[tuple[ResourceKind, JsonObj]], old: Iterable[JsonObj], now: str
) -> list[JsonObj]:
    """The controller's deletion conditions for what is ``remaining`` in the namespace,
    merged with the ``old`` ones as it merges them (a condition keeps its
    lastTransitionTime while its status stays)."""
    per_resource: dict[str, int] = {}
    per_finalizer: dict[str, int] = {}
    for kind, obj in remaining:
        resource = f"{kind.plural}.{kind.group}"  # "pods." for the core group, as upstream
        per_resource[resource] = per_resource.get(resource, 0) + 1
        for finalizer in (obj.get("metadata") or {}).get("finalizers") or ():
            per_finalizer[finalizer] = per_finalizer.get(finalizer, 0) + 1
    failing: dict[str, tuple[str, str]] = {}
    if per_resource:
        listed = sorted(f"{r} has {n} resource instances" for r, n in per_resource.items())
        failing["NamespaceContentRemaining"] = (
            "SomeResourcesRemain",
            f"Some resources are remaining: {', '.join(listed)}",
        )
    if per_finalizer:
        listed = sorted(f"{f} in {n} resource instances" for f, n in per_finalizer.items())
        failing["NamespaceFinalizersRemaining"] = (
            "SomeFinalizerRemain",
            f"Some finalizers are remaining: {', '.join(listed)}",
        )
    before = {c.get("type"): c for c in old}
    result = [c for c in old if c.get("type") not in {t for t, _, _ in _CONDITIONS}]
    for kind_name, ok_reason, ok_message in _CONDITIONS:
        status, (reason, message) = "False", (ok_reason, ok_message)
        if kind_name in failing:
            status, (reason, message) = "True", failing[kind_name]
        prior = before.get(kind_name)
        since = now
        if prior is not None and prior.get("status") == status:
            since = str(prior.get("lastTransitionTime") or now)
        result.append(
            {
                "type": kind_name,
                "status": status,
                "lastTransitionTime": since,
                "reason": reason,
                "message": message,
            }
        )
    return result


def same_conditions(one: Iterable[JsonObj], other: Iterable[JsonObj]) -> bool:
    """Equal but for lastTransitionTime (which only a change of status moves)."""

    def key(c: JsonObj) -> tuple[Any, ...]:
        return (c.get("type"), c.get("status"), c.get("reason"), c.get("message"))

    return sorted(map(key, one)) == sorted(map(key, other))


class NamespaceController:
    """Runs ``sync(name)`` for each terminating namespace :data:`DEFAULT_DELAY_S` (or
    ``delay_s``) after it was scheduled, on one daemon thread that lives while any
    namespace waits; ``delay_s`` None: never by itself (a test calls ``sync``).

    ``lock`` is the store's: :meth:`schedule` is called with it held, and ``sync``
    runs with it held, so a pass sees and writes the store atomically."""

    def __init__(
        self, lock: threading.RLock, sync: Callable[[str], None], delay_s: float | None
    ) -> None:
        self._cond = threading.Condition(lock)
        self._sync = sync
        self.delay_s = delay_s
        self._due: dict[str, float] = {}
        self._thread: threading.Thread | None = None
        self._stopped = False

    def schedule(self, name: str) -> None:
        """Look at ``name`` after the delay (sooner if already due sooner)."""
        if self.delay_s is None:
            return
        with self._cond:
            at = time.monotonic() + self.delay_s
            self._due[name] = min(self._due.get(name, at), at)
            self._cond.notify_all()
            self._ensure_thread()

    def stop(self) -> None:
        """The server closes: the thread ends soon; what was due stays due."""
        with self._cond:
            self._stopped = True
            self._cond.notify_all()

    def resume(self) -> None:
        with self._cond:
            self._stopped = False
            if self._due:
                self._ensure_thread()

    def _ensure_thread(self) -> None:
        if self._thread is None and not self._stopped:
            self._thread = threading.Thread(
                target=self._run, name="fake-kube-namespace-controller", daemon=True
            )
            self._thread.start()

    def _run(self) -> None:
        with self._cond:
            try:
                while not self._stopped and self._due:
                    name, at = min(self._due.items(), key=lambda item: item[1])
                    wait = at - time.monotonic()
                    if wait > 0:
                        self._cond.wait(wait)
                        continue
                    del self._due[name]
                    self._sync(name)
            finally:
                self._thread = None
