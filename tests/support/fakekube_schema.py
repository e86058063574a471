"""Schema validation of the fake API server's writes: the official OpenAPI schemas.

Every write that arrives over HTTP (what the code under test sends) is checked
against the release's schema from ``kubernetes-validate`` (a test dependency),
after the release's gated fields are dropped, the way a real API server
refuses a body of the wrong shape with 422 ``Invalid``. The strict variant is
used: a field the schema does not know is refused too. A real server drops such
a field with a warning, but for our own writes an unknown field is always a bug
that would otherwise go unseen. Objects seeded from Python (the test-side API)
are not validated: tests may store partial objects.

Validators are built once per (kind, release) and cached; kinds without a
published schema are not checked. As a real server compiles its schemas once, the
fake remembers which fragments it has found valid: a ``$ref`` (a named type) whose
instance, as JSON, was valid against that same reference before is not walked
again (validity of an instance against a schema depends on nothing else). A claim's
spec is the same in each of its writes, and often the same as other claims'; without
this the check was a quarter of the fake's CPU in ``hack/bench/controller.py``.
Only valid outcomes are remembered, so a refusal is always worked out (and worded)
in full.

Before any of that, the kind's schema compiled once into a yes/no check
(:mod:`tests.support.fakekube_schema_compiled`) reads the object: when it says
valid, that is the answer (the memo could not help a ``/status`` PATCH, whose
allocation is new each time: the check was still a quarter of the fake's CPU);
when it says invalid, is unsure of a value, or cannot compile the kind's schema,
``jsonschema`` decides and words the refusal as before.
``tests/unit/test_fakekube_schema_compiled.py`` pins that the two agree.
"""

from __future__ import annotations

import functools
import importlib
import json
import os
import re
from collections.abc import Iterator
from typing import Any

from tests.support.fakekube_schema_compiled import Check, Unsure, compile_schema, plain
from tests.support.fakekube_types import FakeApiError, JsonObj, ResourceKind

_VALID_LIMIT = 20_000
"""Fragments remembered as valid; the memo starts again when full."""
_valid: set[tuple[int, str]] = set()


def _remembered_ref(validator: Any, ref: str, instance: Any, schema: Any) -> Iterator[Any]:
    """``$ref``, skipping an instance already found valid against this same reference
    (``schema``: the dict that holds it, one object per place in the loaded schemas)."""
    key = (id(schema), json.dumps(instance))
    if key in _valid:
        return
    errors = list(validator._validate_reference(ref=ref, instance=instance))
    if not errors:
        if len(_valid) >= _VALID_LIMIT:
            _valid.clear()
        _valid.add(key)
    yield from errors


@functools.cache
def kind_schema(api_version: str, kind: str, minor: int) -> tuple[Any, Any] | None:
    """The kind's 1.<minor> strict schema and the ``referencing`` registry its ``$ref``s
    resolve in; None without the test extra or a published schema."""
    try:
        utils = importlib.import_module("kubernetes_validate.utils")
        referencing = importlib.import_module("referencing")
    except ImportError:  # the test extra is not installed: nothing to check against
        return None
    Registry, Resource = referencing.Registry, referencing.Resource
    versions = [v for v in utils.all_versions() if int(v.split(".")[1]) <= minor]
    if not versions:
        return None
    folder = f"kubernetes-json-schema/v{versions[-1]}-local-strict"
    group_version = re.sub(r"^([^./]*)(?:\.[^/]*)?/", r"\1-", api_version)
    try:
        schema = utils.schema_contents(f"{folder}/{kind.lower()}-{group_version}.json", "")
        definitions = utils.schema_contents(f"{folder}/_definitions.json", "")
    except (FileNotFoundError, utils.VersionNotSupportedError):
        return None
    registry = Resource.from_contents(definitions) @ (Resource.from_contents(schema) @ Registry())
    return schema, registry


@functools.cache
def _validator(api_version: str, kind: str, minor: int) -> Any:
    found = kind_schema(api_version, kind, minor)
    if found is None:
        return None
    schema, registry = found
    jsonschema = importlib.import_module("jsonschema")
    remembering = jsonschema.validators.extend(
        jsonschema.validators.Draft202012Validator, validators={"$ref": _remembered_ref}
    )
    return remembering(schema, registry=registry)


@functools.cache
def compiled(api_version: str, kind: str, minor: int) -> Check | None:
    """The kind's compiled check; None when it has no schema or one that
    :func:`compile_schema` cannot compile (then ``jsonschema`` checks every write)."""
    found, validator = kind_schema(api_version, kind, minor), _validator(api_version, kind, minor)
    if found is None or validator is None or validator.format_checker is not None:
        return None  # (with a format checker, ``format`` would assert)
    schema, registry = found
    resource = importlib.import_module("referencing").Resource.from_contents(schema)
    return compile_schema(schema, registry.resolver_with_root(resource), validator.VALIDATORS)


CROSSCHECK = "FAKEKUBE_SCHEMA_CROSSCHECK"
"""Set (to anything) in the environment: every check runs both the compiled check and
``jsonschema`` and fails (an ``AssertionError``: a 500 from the fake) where they
disagree; set to a path (``/`` in it): each checked object is also appended there as
one JSON line (``kind``, ``apiVersion``, ``minor``, ``object``): the corpus of
``tests/unit/test_fakekube_schema_compiled.py`` was recorded so."""


def fast_verdict(kind: ResourceKind, obj: JsonObj, minor: int) -> bool | None:
    """The compiled check's answer: valid or not; None when it cannot tell (no
    compiled check for the kind, or a value JSON does not decode to)."""
    fast = compiled(kind.api_version, kind.kind, minor)
    if fast is None:
        return None
    try:
        plain(obj)
        return fast(obj)
    except Unsure:
        return None


def check_schema(kind: ResourceKind, obj: JsonObj, minor: int) -> None:
    """422 when ``obj`` does not match the 1.<minor> schema of its kind."""
    validator = _validator(kind.api_version, kind.kind, minor)
    if validator is None:
        return
    fast = fast_verdict(kind, obj, minor)
    crosscheck = os.environ.get(CROSSCHECK, "")
    if fast and not crosscheck:
        return
    # The schema describes JSON: validate what would be sent, not Python objects.
    doc = json.loads(json.dumps(obj))
    errors = sorted(validator.iter_errors(doc), key=lambda e: list(e.absolute_path))
    if crosscheck:
        _crosscheck(crosscheck, kind, doc, minor, fast=fast, valid=not errors)
    if errors:
        name = (obj.get("metadata") or {}).get("name", "")
        causes = "; ".join(
            f"{'.'.join(str(p) for p in e.absolute_path) or '<root>'}: {e.message}"
            for e in errors[:5]
        )
        raise FakeApiError(
            422,
            f'{kind.kind}.{kind.group or "core"} "{name}" is invalid: {causes}',
            kind=kind,
            name=str(name),
        )


def _crosscheck(
    setting: str, kind: ResourceKind, doc: JsonObj, minor: int, *, fast: bool | None, valid: bool
) -> None:
    if "/" in setting:
        line = {"kind": kind.kind, "apiVersion": kind.api_version, "minor": minor, "object": doc}
        with open(setting, "a", encoding="utf-8") as f:
            f.write(json.dumps(line) + "\n")
    if fast is not None and fast != valid:
        raise AssertionError(
            f"the compiled schema check says {'valid' if fast else 'invalid'}, jsonschema "
            f"{'valid' if valid else 'invalid'}: {kind.kind} {json.dumps(doc)[:2000]}"
        )
