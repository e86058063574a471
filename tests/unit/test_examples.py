"""The user-facing examples under ``deploy/examples`` are valid and consistent.

Each example is ``deploy/examples/<name>/<name>.yaml`` (the e2e tests load the
same files). Checked here without a cluster: every document parses, passes the
official strict OpenAPI schema of 1.34 and 1.36, lives in its own namespace
``fgd-<name>``, uses only our three DeviceClasses, every opaque config decodes
strictly, CEL selectors address our attributes, references between pods,
claims, templates, requests and constraints resolve, and the examples README
has a line for it.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from dra_driver.api import DEFAULT_DRIVER_NAME, decode_config

EXAMPLES_DIR = Path(__file__).resolve().parents[2] / "deploy" / "examples"
DRIVER = DEFAULT_DRIVER_NAME
CLASSES = {DRIVER, f"mig.{DRIVER}", f"share.{DRIVER}"}
EXPECTED = {
    "whole-gpu",
    "vram-share",
    "two-pods-different-limits",
    "controller-path-share",
    "mig-1g-by-cel",
    "mig-mps-shares",
    "shared-claim-two-pods",
    "count-two-distinct",
    "device-plugin-pod",
    "disruption-guard",
}
EXTENDED_RESOURCE_EXAMPLES = {"device-plugin-pod": "nvidia.com/gpu"}
"""Examples written for a device plugin: no claims, an extended resource in the limits
(served by the chart's extendedResources classes, KEP-5004)."""
SCHEMA_VERSIONS = ("1.34.0", "1.36.0")
CLAIM_KINDS = ("ResourceClaim", "ResourceClaimTemplate")

Obj = dict[str, Any]


def example_names() -> list[str]:
    return sorted(p.name for p in EXAMPLES_DIR.iterdir() if p.is_dir())


def load(name: str) -> list[Obj]:
    text = (EXAMPLES_DIR / name / f"{name}.yaml").read_text()
    docs = list(yaml.safe_load_all(text))
    assert all(isinstance(doc, dict) for doc in docs), f"{name}: empty or non-object document"
    return docs


def claim_spec(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    """The ResourceClaimSpec of a ResourceClaim or ResourceClaimTemplate."""
    spec: Mapping[str, Any] = obj["spec"]
    return spec["spec"] if obj["kind"] == "ResourceClaimTemplate" else spec


def claim_specs(docs: list[Obj]) -> Iterator[tuple[str, Mapping[str, Any]]]:
    for obj in docs:
        if obj["kind"] in CLAIM_KINDS:
            yield obj["metadata"]["name"], claim_spec(obj)


def exact_requests(spec: Mapping[str, Any]) -> Iterator[Mapping[str, Any]]:
    """Every ``exactly`` request, including the sub-requests of ``firstAvailable``."""
    for request in spec.get("devices", {}).get("requests", []):
        if "exactly" in request:
            yield request["exactly"]
        yield from request.get("firstAvailable", [])


examples = pytest.mark.parametrize("name", sorted(EXPECTED))


def test_the_expected_examples_exist() -> None:
    assert set(example_names()) == EXPECTED


@examples
def test_example_is_one_namespace_with_claims_and_pods(name: str) -> None:
    docs = load(name)
    namespace = f"fgd-{name}"
    assert docs[0]["kind"] == "Namespace", "the namespace comes first, so it exists first"
    assert docs[0]["metadata"]["name"] == namespace
    for obj in docs[1:]:
        assert obj["metadata"].get("namespace") == namespace, obj["metadata"]
    kinds = {obj["kind"] for obj in docs}
    assert "Pod" in kinds
    if name not in EXTENDED_RESOURCE_EXAMPLES:
        assert kinds & set(CLAIM_KINDS)
        return
    # Unchanged device-plugin style: no DRA object or field, the extended resource asked.
    assert not kinds & set(CLAIM_KINDS), kinds
    for pod in (obj for obj in docs if obj["kind"] == "Pod"):
        assert "resourceClaims" not in pod["spec"]
        for ctr in pod["spec"]["containers"]:
            assert "claims" not in ctr["resources"]
            assert ctr["resources"]["limits"] == {EXTENDED_RESOURCE_EXAMPLES[name]: 1}


@examples
@pytest.mark.parametrize("version", SCHEMA_VERSIONS)
def test_example_passes_the_official_schema(name: str, version: str) -> None:
    kubernetes_validate = pytest.importorskip(
        "kubernetes_validate",
        reason="kubernetes-validate (test extra) is not installed: OpenAPI schema not checked",
    )
    for obj in load(name):
        kubernetes_validate.validate(obj, version, strict=True)


@examples
def test_device_classes_are_ours(name: str) -> None:
    for claim, spec in claim_specs(load(name)):
        for request in exact_requests(spec):
            assert request["deviceClassName"] in CLASSES, claim


@examples
def test_opaque_configs_decode_strictly(name: str) -> None:
    for claim, spec in claim_specs(load(name)):
        for config in spec.get("devices", {}).get("config", []):
            opaque = config["opaque"]
            assert opaque["driver"] == DRIVER, claim
            decode_config(opaque["parameters"], DRIVER)


@examples
def test_cel_selectors_address_our_attributes(name: str) -> None:
    for claim, spec in claim_specs(load(name)):
        for request in exact_requests(spec):
            for selector in request.get("selectors", []):
                expression = selector["cel"]["expression"]
                assert "device." in expression, claim
                assert f'device.attributes["{DRIVER}"]' in expression, claim
                assert expression.count("(") == expression.count(")"), claim
                assert expression.count('"') % 2 == 0, claim


@examples
def test_claim_references_resolve(name: str) -> None:
    docs = load(name)
    for claim, spec in claim_specs(docs):
        devices = spec.get("devices", {})
        requests = {r["name"] for r in devices.get("requests", [])}
        for entry in devices.get("constraints", []) + devices.get("config", []):
            assert set(entry.get("requests", [])) <= requests, claim
        for constraint in devices.get("constraints", []):
            for key in ("matchAttribute", "distinctAttribute"):
                if key in constraint:
                    assert constraint[key].startswith(f"{DRIVER}/"), "fully qualified"
    names = {(obj["kind"], obj["metadata"]["name"]) for obj in docs}
    for pod in (obj for obj in docs if obj["kind"] == "Pod"):
        spec = pod["spec"]
        declared = {c["name"] for c in spec.get("resourceClaims", [])}
        for entry in spec.get("resourceClaims", []):
            if "resourceClaimTemplateName" in entry:
                assert ("ResourceClaimTemplate", entry["resourceClaimTemplateName"]) in names
            else:
                assert ("ResourceClaim", entry["resourceClaimName"]) in names
        used = {c["name"] for ctr in spec["containers"] for c in ctr["resources"].get("claims", [])}
        assert used == declared, pod["metadata"]["name"]


@examples
def test_readme_has_a_line_for_the_example(name: str) -> None:
    readme = (EXAMPLES_DIR / "README.md").read_text()
    rows = [line for line in readme.splitlines() if line.startswith(f"| `{name}` |")]
    assert len(rows) == 1, f"one README table row for {name}"
    assert re.search(r"1\.3[4-9]\+", rows[0]), "the row names the Kubernetes versions"
    assert re.search(r"\| (native|controller)", rows[0]), "the row names the path"


@examples
def test_e2e_substitution_leaves_only_class_names(name: str) -> None:
    """The e2e tests' driver-name substitution covers every place an example names it."""
    from tests.support.examples import render_example

    docs = render_example(name, "gpu.example.org")
    left = yaml.safe_dump_all(docs).replace("gpu.example.org", "")
    class_names = sum(
        1 for _, spec in claim_specs(docs) for request in exact_requests(spec)
    )  # one deviceClassName per request: the only place the placeholder stays
    assert left.count(DRIVER) == class_names
    for _, spec in claim_specs(docs):
        for config in spec.get("devices", {}).get("config", []):
            decode_config(config["opaque"]["parameters"], "gpu.example.org")


def test_e2e_substitution_fails_when_the_placeholder_survives(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.support import examples

    (tmp_path / "odd").mkdir()
    (tmp_path / "odd" / "odd.yaml").write_text(
        "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: fgd-odd\n"
        f"  labels: {{{DRIVER}/owner: me}}\n"
    )
    monkeypatch.setattr(examples, "EXAMPLES_DIR", tmp_path)
    with pytest.raises(pytest.fail.Exception, match="survives"):
        examples.render_example("odd", "gpu.example.org")
    assert examples.render_example("odd", DRIVER)  # the default name needs no substitution


@examples
def test_e2e_image_replaces_every_container_image(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """E2E_IMAGE reaches every container of every example pod (chart mode too), pulled
    never; without it the examples are applied as written."""
    from tests.support.examples import pod_image, render_example

    monkeypatch.delenv("E2E_IMAGE", raising=False)
    as_written = render_example(name, DRIVER)
    assert [pod_image(o) for o in render_example(name, DRIVER)] == as_written
    monkeypatch.setenv("E2E_IMAGE", "localhost/e2e:1")
    docs = [pod_image(o) for o in render_example(name, DRIVER)]
    containers = [
        c
        for d in docs
        if d["kind"] == "Pod"
        for c in [*d["spec"].get("initContainers", []), *d["spec"]["containers"]]
    ]
    assert containers
    assert {(c["image"], c["imagePullPolicy"]) for c in containers} == {
        ("localhost/e2e:1", "Never")
    }
    others = [d for d in docs if d["kind"] != "Pod"]
    assert others == [d for d in as_written if d["kind"] != "Pod"]
