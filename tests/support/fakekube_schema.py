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
"""

from __future__ import annotations

import functools
import importlib
import json
import re
from collections.abc import Iterator
from typing import Any

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
def _validator(api_version: str, kind: str, minor: int) -> Any:
    try:
        jsonschema = importlib.import_module("jsonschema")
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
    remembering = jsonschema.validators.extend(
        jsonschema.validators.Draft202012Validator, validators={"$ref": _remembered_ref}
    )
    return remembering(schema, registry=registry)


def check_schema(kind: ResourceKind, obj: JsonObj, minor: int) -> None:
    """422 when ``obj`` does not match the 1.<minor> schema of its kind."""
    validator = _validator(kind.api_version, kind.kind, minor)
    if validator is None:
        return
    # The schema describes JSON: validate what would be sent, not Python objects.
    doc = json.loads(json.dumps(obj))
    errors = sorted(validator.iter_errors(doc), key=lambda e: list(e.absolute_path))
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
