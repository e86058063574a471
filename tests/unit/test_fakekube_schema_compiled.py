"""The compiled schema check and ``jsonschema`` agree: on what the tests write, and on
systematic mutations of it.

The fake API server takes the compiled check's "valid" as the answer
(:mod:`tests.support.fakekube_schema`), so a mutation it accepts and ``jsonschema``
refuses would let the fake accept what a real server refuses: every comparison below
fails on a disagreement either way. The corpus (``tests/fixtures/fakekube-schema-corpus.jsonl.gz``)
is every object the fakekube unit tests and the integration tests that use the fake
wrote over HTTP, recorded with ``FAKEKUBE_SCHEMA_CROSSCHECK=<file>`` (one line per
checked write, refused ones included, duplicates dropped): rerecord it so after the
fake or the driver starts writing a new shape.
"""

from __future__ import annotations

import copy
import gzip
import json
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dra_driver.core.settings import Allocator, Capabilities, GpuSettings, NodeSettings
from dra_driver.core.slices import build_slices
from dra_driver.fakes.gpu import build_inventory, load_spec
from dra_driver.fakes.objects import Allocated, node_object, resource_claim, share
from dra_driver.k8s.events import InvolvedObject, event_object
from tests.support import fakekube_schema
from tests.support.controller_env import share_class
from tests.support.fakekube_raw import RawJson
from tests.support.fakekube_schema import CROSSCHECK, check_schema, fast_verdict, kind_schema
from tests.support.fakekube_types import DEFAULT_KINDS, FakeApiError, ResourceKind

jsonschema = pytest.importorskip("jsonschema")

CORPUS = Path(__file__).parents[1] / "fixtures" / "fakekube-schema-corpus.jsonl.gz"
KINDS = {k.kind: k for k in DEFAULT_KINDS}
MINORS = (34, 35, 36)


def refused_by_jsonschema(kind: ResourceKind, obj: Any, minor: int) -> bool:
    """A plain Draft 2020-12 validator over the same schema, no memo: the reference."""
    found = kind_schema(kind.api_version, kind.kind, minor)
    assert found is not None
    schema, registry = found
    validator = jsonschema.Draft202012Validator(schema, registry=registry)
    return not validator.is_valid(json.loads(json.dumps(obj)))


def assert_agree(kind: ResourceKind, obj: Any, minor: int, what: str) -> bool:
    """The compiled check's verdict equals jsonschema's; returns whether it is valid."""
    valid = not refused_by_jsonschema(kind, obj, minor)
    fast = fast_verdict(kind, obj, minor)
    assert fast is not None, f"{what}: the compiled check could not tell"
    if fast and not valid:
        pytest.fail(f"{what}: the compiled check ACCEPTS what jsonschema refuses: {obj!r}")
    assert fast == valid, f"{what}: the compiled check refuses what jsonschema accepts: {obj!r}"
    return valid


@pytest.mark.parametrize("minor", MINORS)
def test_every_served_kind_has_a_compiled_check(minor: int) -> None:
    for kind in DEFAULT_KINDS:
        assert fakekube_schema.compiled(kind.api_version, kind.kind, minor) is not None, kind


def test_the_recorded_corpus_gets_the_same_verdicts() -> None:
    outcomes: Counter[bool] = Counter()
    with gzip.open(CORPUS, "rt", encoding="utf-8") as f:
        lines = [json.loads(line) for line in f]
    for i, line in enumerate(lines):
        kind = KINDS[line["kind"]]
        outcomes[assert_agree(kind, line["object"], line["minor"], f"corpus line {i + 1}")] += 1
    assert outcomes[True] > 100, outcomes  # the corpus is what the tests write...
    assert outcomes[False], outcomes  # ...refused writes included


# --- systematic mutations of the objects the driver and the fixtures write --------------

_DRIVER = "gpu.fractional.dev"


def _slices(spec: str, minor: int) -> list[dict[str, Any]]:
    return [
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {"name": f"node-a-{_DRIVER}-{d.key}"},
            "spec": dict(d.spec),
        }
        for d in build_slices(
            build_inventory(load_spec(spec), "node-a"),
            driver_name=_DRIVER,
            node_name="node-a",
            settings=NodeSettings(default=GpuSettings(allocator=Allocator.CONTROLLER)),
            capabilities=Capabilities.for_version(minor),
        )
    ]


def _pod() -> dict[str, Any]:
    probe = {"httpGet": {"path": "/healthz", "port": 8080}, "periodSeconds": 5}
    container = {
        "name": "main",
        "image": "x",
        "ports": [{"containerPort": 80, "protocol": "TCP"}],
        "resources": {"limits": {"cpu": "500m", "memory": 1024}, "claims": [{"name": "gpu"}]},
        "livenessProbe": probe,
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", "namespace": "bench", "labels": {"app": "x"}},
        "spec": {
            "containers": [container],
            "resourceClaims": [{"name": "gpu", "resourceClaimName": "c"}],
            "nodeName": "node-a",
        },
        "status": {"phase": "Pending"},
    }


def _objects() -> Iterator[tuple[str, dict[str, Any]]]:
    claim = resource_claim(
        "default",
        "c1",
        devices=(share("gpu-0", memory="10Gi"), Allocated("gpu-1", admin_access=True)),
        configs=({"apiVersion": f"{_DRIVER}/v1alpha1", "kind": "GpuShare", "memory": "4Gi"},),
    )
    claim["metadata"]["finalizers"] = [f"{_DRIVER}/allocation"]
    claim["status"]["devices"] = [
        {
            "driver": _DRIVER,
            "pool": "node-a",
            "device": "gpu-0",
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "Up",
                    "message": "",
                    "lastTransitionTime": "2026-01-01T00:00:00Z",
                }
            ],
            "data": {"a": 1},
        }
    ]
    yield "ResourceClaim", claim
    yield "Node", node_object("node-a", {"a": "b"})
    yield "ResourceSlice", _slices("h100-80gb:1,h100-80gb:1:mig", 36)[0]
    yield "DeviceClass", share_class([{"opaque": {"driver": _DRIVER, "parameters": {"x": 1}}}])
    yield "Pod", _pod()
    yield "Namespace", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "n"}}
    involved = InvolvedObject("resource.k8s.io/v1", "ResourceClaim", "c1", "default", "u", "7")
    event = event_object(
        involved, "Allocated", "m", "Normal", "2026-01-01T00:00:00Z", component="c"
    )
    yield "Event", event
    lease_spec = {
        "holderIdentity": "ctrl-1",
        "leaseDurationSeconds": 15,
        "acquireTime": "2026-01-01T00:00:00.000000Z",
        "renewTime": "2026-01-01T00:00:00.000000Z",
        "leaseTransitions": 0,
    }
    lease = {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": "l", "namespace": "default"},
        "spec": lease_spec,
    }
    yield "Lease", lease


_REPLACEMENTS: tuple[Any, ...] = (
    None,
    True,
    0,
    -3,
    2.0,
    1.5,
    "x",
    "",
    "10Gi",
    [],
    ["x"],
    [{"x": 1}],
    {},
    {"surprise": 1},
)
"""Wrong types, nulls, int-or-string and quantity values, empty and unknown shapes."""


def _paths(node: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    if isinstance(node, dict):
        for key, value in node.items():
            yield (*path, key)
            yield from _paths(value, (*path, key))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield (*path, i)
            yield from _paths(value, (*path, i))


def _holder(obj: Any, path: tuple[Any, ...]) -> Any:
    for step in path[:-1]:
        obj = obj[step]
    return obj


def mutations(obj: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """Each value replaced by each of :data:`_REPLACEMENTS`, each key removed (missing
    required fields), an unknown field added to each object, a bad item added to each
    list."""
    for path in _paths(obj):
        for value in _REPLACEMENTS:
            changed = copy.deepcopy(obj)
            _holder(changed, path)[path[-1]] = copy.deepcopy(value)
            yield f"{path} = {value!r}", changed
        holder = _holder(obj, path)
        if isinstance(holder, dict):
            changed = copy.deepcopy(obj)
            del _holder(changed, path)[path[-1]]
            yield f"del {path}", changed
    for path in [(), *_paths(obj)]:
        node = _holder({"": obj}, ("", *path))[path[-1]] if path else obj
        if isinstance(node, dict):
            changed = copy.deepcopy(obj)
            target = _holder({"": changed}, ("", *path))[path[-1]] if path else changed
            target["surpriseField"] = "x"
            yield f"{path} + unknown field", changed
        if isinstance(node, list):
            changed = copy.deepcopy(obj)
            _holder({"": changed}, ("", *path))[path[-1]].append(7)
            yield f"{path} + a bad item", changed


@pytest.mark.parametrize(("kind_name", "obj"), list(_objects()), ids=lambda v: str(v)[:14])
def test_mutations_get_the_same_verdicts(kind_name: str, obj: dict[str, Any]) -> None:
    kind = KINDS[kind_name]
    assert assert_agree(kind, obj, 36, "the object itself"), "the fixture itself is valid"
    outcomes: Counter[bool] = Counter()
    for what, changed in mutations(obj):
        outcomes[assert_agree(kind, changed, 36, what)] += 1
    # Not a test that cannot fail: the mutations are refused and accepted both.
    assert outcomes[False] > 10, outcomes
    assert outcomes[True] > 3, outcomes


def test_the_slices_of_each_release_get_the_same_verdicts() -> None:
    for minor in MINORS:
        for spec in ("h100-80gb:8", "h100-80gb:7,h100-80gb:1:mig"):
            for obj in _slices(spec, minor):
                assert assert_agree(KINDS["ResourceSlice"], obj, minor, f"1.{minor} {spec}")


def test_null_for_a_quantity_or_an_int_or_string_is_refused_by_both() -> None:
    # Both oneOf branches take null, so oneOf refuses it: the compiled check must too.
    pod = _pod()
    pod["spec"]["containers"][0]["resources"]["limits"]["cpu"] = None
    assert not assert_agree(KINDS["Pod"], pod, 36, "quantity null")
    pod = _pod()
    pod["spec"]["containers"][0]["livenessProbe"]["httpGet"]["port"] = None
    assert not assert_agree(KINDS["Pod"], pod, 36, "int-or-string null")


def test_a_value_json_does_not_decode_to_is_left_to_jsonschema() -> None:
    claims = KINDS["ResourceClaim"]
    claim = resource_claim("default", "c1")
    claim["metadata"]["finalizers"] = ("a/b",)  # a tuple: JSON makes it a list
    assert fast_verdict(claims, claim, 36) is None
    check_schema(claims, claim, 36)  # valid once sent as JSON
    claim["metadata"]["finalizers"] = (1,)
    with pytest.raises(FakeApiError) as refused:
        check_schema(claims, claim, 36)
    assert "metadata.finalizers.0" in refused.value.message
    raw = resource_claim("default", "c2", configs=({"kind": "GpuShare"},))
    params = raw["spec"]["devices"]["config"][0]["opaque"]
    params["parameters"] = RawJson(params["parameters"], '{"kind": "GpuShare"}')
    assert fast_verdict(claims, raw, 36) is True  # the store's RawJson is a dict


def test_a_refusal_is_worded_by_jsonschema() -> None:
    claim = resource_claim("default", "c1")
    claim["spec"]["devices"]["requests"][0]["exactly"]["surprise"] = 1
    with pytest.raises(FakeApiError) as refused:
        check_schema(KINDS["ResourceClaim"], claim, 36)
    assert refused.value.code == 422
    assert "spec.devices.requests.0.exactly: Additional properties are not allowed" in str(
        refused.value.message
    )


def test_the_crosscheck_fails_on_a_disagreement(monkeypatch: pytest.MonkeyPatch) -> None:
    claims = KINDS["ResourceClaim"]
    claim = resource_claim("default", "c1")
    claim["spec"]["surprise"] = 1
    monkeypatch.setattr(fakekube_schema, "compiled", lambda *_: lambda _: True)
    check_schema(claims, claim, 36)  # a wrong compiled check would be the answer...
    monkeypatch.setenv(CROSSCHECK, "1")
    with pytest.raises(AssertionError, match="compiled schema check says valid"):
        check_schema(claims, claim, 36)  # ...which the crosscheck catches


def test_an_unknown_keyword_leaves_the_kind_to_jsonschema() -> None:
    from tests.support.fakekube_schema_compiled import compile_schema

    validators = jsonschema.Draft202012Validator.VALIDATORS
    schema = {"type": "object", "properties": {"a": {"type": "string", "pattern": "^x"}}}
    assert compile_schema(schema, None, validators) is None
    loose = {"type": "object", "properties": {"a": {"type": "string", "x-kubernetes-y": 1}}}
    check = compile_schema(loose, None, validators)
    assert check is not None
    assert check({"a": "y"})
    assert not check({"a": 1})
