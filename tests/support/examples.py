"""The examples under deploy/examples as objects, for the tests (unit and e2e): the
driver name substituted, the pods' images replaced (``E2E_IMAGE``)."""

from __future__ import annotations

import copy
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

PLACEHOLDER = "gpu.fractional.dev"
EXAMPLES_DIR = Path(__file__).resolve().parents[2] / "deploy" / "examples"

Obj = dict[str, Any]


# --- examples: load and substitute ----------------------------------------------------


def _strings(node: object, path: str = "") -> Iterator[tuple[str, str]]:
    """Every string in a YAML tree with its path (keys included)."""
    if isinstance(node, str):
        yield path, node
    elif isinstance(node, Mapping):
        for key, value in node.items():
            yield f"{path}.{key}[key]", str(key)
            yield from _strings(value, f"{path}.{key}")
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from _strings(value, f"{path}[{index}]")


def _claim_spec(obj: Obj) -> Obj | None:
    if obj.get("kind") == "ResourceClaimTemplate":
        spec: Obj = obj["spec"]["spec"]
        return spec
    if obj.get("kind") == "ResourceClaim":
        spec = obj["spec"]
        return spec
    return None


def _substitute_claim(spec: Obj, driver: str) -> None:
    devices = spec.get("devices", {})
    for request in devices.get("requests", []):
        for exact in [request.get("exactly") or {}, *request.get("firstAvailable", [])]:
            for selector in exact.get("selectors", []):
                cel = selector["cel"]
                for quote in ('"', "'"):
                    cel["expression"] = cel["expression"].replace(
                        f"{quote}{PLACEHOLDER}{quote}", f"{quote}{driver}{quote}"
                    )
    for constraint in devices.get("constraints", []):
        for key in ("matchAttribute", "distinctAttribute"):
            name = constraint.get(key)
            if isinstance(name, str) and name.startswith(f"{PLACEHOLDER}/"):
                constraint[key] = f"{driver}/{name.removeprefix(PLACEHOLDER + '/')}"
    for config in devices.get("config", []):
        opaque = config.get("opaque") or {}
        if opaque.get("driver") == PLACEHOLDER:
            opaque["driver"] = driver
        params = opaque.get("parameters") or {}
        version = params.get("apiVersion")
        if isinstance(version, str) and version.startswith(f"{PLACEHOLDER}/"):
            params["apiVersion"] = f"{driver}/{version.removeprefix(PLACEHOLDER + '/')}"


def _substitute_annotations(obj: Obj, driver: str) -> None:
    """Annotation keys of ours (``<driver>/disruption-guard``) on a claim, or on the claims
    a template makes (``spec.metadata``)."""
    metas = [obj.get("metadata") or {}]
    if obj.get("kind") == "ResourceClaimTemplate":
        metas.append(obj["spec"].get("metadata") or {})
    for meta in metas:
        annotations = meta.get("annotations")
        if isinstance(annotations, dict):
            meta["annotations"] = {
                (
                    f"{driver}/{k.removeprefix(PLACEHOLDER + '/')}"
                    if k.startswith(f"{PLACEHOLDER}/")
                    else k
                ): v
                for k, v in annotations.items()
            }


def render_example(name: str, driver: str) -> list[Obj]:
    """The example's objects for ``driver``; fails if the placeholder survives."""
    path = EXAMPLES_DIR / name / f"{name}.yaml"
    docs: list[Obj] = [doc for doc in yaml.safe_load_all(path.read_text()) if doc]
    docs = copy.deepcopy(docs)
    for obj in docs:
        spec = _claim_spec(obj)
        if spec is not None:
            _substitute_claim(spec, driver)
            _substitute_annotations(obj, driver)
    if driver != PLACEHOLDER:
        left = [
            f"{obj['kind']}/{obj['metadata']['name']}{where}"
            for obj in docs
            for where, text in _strings(obj)
            if PLACEHOLDER in text.replace(driver, "")
            and not where.endswith(".deviceClassName")  # class names are fixed
        ]
        if left:
            pytest.fail(
                f"{path}: the placeholder {PLACEHOLDER!r} survives the substitution of"
                f" DRIVER_NAME={driver!r} at {', '.join(left)}; teach"
                " tests/support/examples.py:_substitute_claim that place"
            )
    return docs


def pod_image(obj: Obj) -> Obj:
    """A Pod with ``E2E_IMAGE`` (when set) as every container's image, never pulled:
    clusters without a registry get the image imported into their nodes instead.
    Other objects are returned as they are."""
    image = os.environ.get("E2E_IMAGE")
    if not image or obj.get("kind", "Pod") != "Pod":
        return obj
    spec = obj["spec"]
    for ctr in [*spec.get("initContainers", []), *spec["containers"]]:
        ctr["image"] = image
        ctr["imagePullPolicy"] = "Never"
    return obj


def claim_of_template(name: str, namespace: str, driver: str = PLACEHOLDER) -> Obj:
    """A ResourceClaim as the example ``name``'s one ResourceClaimTemplate would make
    it in ``namespace`` (name ``c``, uid ``u1``): what an allocator is handed."""
    (template,) = [o for o in render_example(name, driver) if o["kind"] == "ResourceClaimTemplate"]
    return {
        "metadata": {"namespace": namespace, "name": "c", "uid": "u1"},
        "spec": template["spec"]["spec"],
    }
