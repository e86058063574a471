"""``cdi_spec_problems``: the CDI rules of dra-facts.md §9."""

from __future__ import annotations

import copy
import pathlib
from typing import Any

import pytest
import yaml

from dra_driver.base.ids import PoolName
from dra_driver.core.allocation import claim_from_dict
from dra_driver.core.cdi import (
    cdi_kind_for_driver,
    cdi_spec_problems,
    render_spec,
)
from dra_driver.core.prepare import NodeContext, plan_prepare
from dra_driver.fakes.gpu import build_inventory
from dra_driver.fakes.objects import Allocated, resource_claim

FIXTURE = pathlib.Path(__file__).parents[1] / "fixtures" / "toolkit-cdi" / "nvidia.yaml"


TMPFS = {"hostPath": "tmpfs", "containerPath": "/t", "type": "tmpfs"}


def good() -> dict[str, Any]:
    return {
        "cdiVersion": "0.3.0",
        "kind": "acme.com/gpu",
        "devices": [
            {"name": "gpu0", "containerEdits": {"deviceNodes": [{"path": "/dev/gpu0"}]}},
        ],
        "containerEdits": {
            "env": ["A=1"],
            "deviceNodes": [{"path": "/dev/ctl", "type": "c", "major": 1, "minor": 3}],
            "mounts": [
                {"hostPath": "/lib/a.so", "containerPath": "/lib/a.so", "options": ["ro", "bind"]}
            ],
            "hooks": [{"hookName": "createContainer", "path": "/bin/hook", "args": ["hook"]}],
        },
    }


def edit(path: str, value: Any) -> dict[str, Any]:
    """``good()`` with ``value`` set at a dotted path (``-`` deletes)."""
    doc = good()
    *parents, last = path.split(".")
    target: Any = doc
    for part in parents:
        target = target[int(part)] if part.isdigit() else target[part]
    key: Any = int(last) if last.isdigit() else last
    if value == "-":
        del target[key]
    else:
        target[key] = value
    return doc


# (doc, location the problem must name, words it must say)
INVALID = [
    pytest.param(
        edit("cdiVersion", "9.9.9"), "cdiVersion", "not a known version", id="version-unknown"
    ),
    pytest.param(edit("cdiVersion", 5), "cdiVersion", "not a known version", id="version-not-str"),
    pytest.param(
        edit("cdiVersion", "-"), "cdiVersion", "not a known version", id="version-missing"
    ),
    pytest.param(edit("cdiVersion", "0.2.0"), "cdiVersion", "below 0.3.0", id="version-before-030"),
    pytest.param(edit("kind", "acme.com"), "kind", "<vendor>/<class>", id="kind-no-class"),
    pytest.param(edit("kind", "acme-/gpu"), "kind", "<vendor>/<class>", id="kind-vendor-end"),
    pytest.param(edit("kind", "acme/1gpu"), "kind", "<vendor>/<class>", id="kind-class-digit"),
    pytest.param(edit("kind", "a/b/c"), "kind", "<vendor>/<class>", id="kind-two-slashes"),
    pytest.param(edit("extra", 1), "<spec>.extra", "unknown field", id="unknown-top"),
    pytest.param(edit("devices", []), "devices", "non-empty", id="no-devices"),
    pytest.param(
        edit("devices.0.name", "-a"), "devices[0].name", "not a device name", id="name-dash"
    ),
    pytest.param(
        edit("devices.0.name", "a b"), "devices[0].name", "not a device name", id="name-space"
    ),
    pytest.param(
        edit("devices.0.extra", 1), "devices[0].extra", "unknown field", id="unknown-device"
    ),
    pytest.param(
        edit("devices.0.containerEdits", {}),
        "devices[0].containerEdits",
        "non-empty",
        id="empty-device-edits",
    ),
    pytest.param(
        edit("devices.0.name", "0gpu"), "cdiVersion", "below 0.5.0", id="digit-name-needs-050"
    ),
    pytest.param(
        edit("kind", "acme/gpu.v2"), "cdiVersion", "below 0.6.0", id="dot-class-needs-060"
    ),
    pytest.param(
        edit("annotations", {"a": "b"}), "cdiVersion", "below 0.6.0", id="annotations-need-060"
    ),
    pytest.param(
        edit("devices.0.annotations", {"a": "b"}),
        "cdiVersion",
        "below 0.6.0",
        id="device-annotations-need-060",
    ),
    pytest.param(edit("annotations", {"a": 1}), "annotations", "strings", id="annotation-not-str"),
    pytest.param(
        edit("containerEdits.mounts.0.type", "bind"),
        "cdiVersion",
        "below 0.4.0",
        id="mount-type-needs-040",
    ),
    pytest.param(
        edit("containerEdits.deviceNodes.0.hostPath", "/dev/x"),
        "cdiVersion",
        "below 0.5.0",
        id="host-path-needs-050",
    ),
    pytest.param(
        edit("containerEdits.additionalGids", [44]), "cdiVersion", "below 0.7.0", id="gids-need-070"
    ),
    pytest.param(
        edit("containerEdits.netDevices", [{"hostInterfaceName": "a", "name": "b"}]),
        "cdiVersion",
        "below 1.1.0",
        id="net-devices-need-110",
    ),
    pytest.param(
        edit("containerEdits.extra", 1), "containerEdits.extra", "unknown field", id="unknown-edit"
    ),
    pytest.param(
        edit("containerEdits.env", ["A"]), "containerEdits.env[0]", "NAME=value", id="env-no-equals"
    ),
    pytest.param(
        edit("containerEdits.env", ["=1"]), "containerEdits.env[0]", "NAME=value", id="env-no-name"
    ),
    pytest.param(
        edit("containerEdits.deviceNodes.0.path", "dev/x"),
        "containerEdits.deviceNodes[0].path",
        "absolute",
        id="node-relative",
    ),
    pytest.param(
        edit("containerEdits.deviceNodes.0.type", "x"),
        "containerEdits.deviceNodes[0].type",
        "not one of",
        id="node-type",
    ),
    pytest.param(
        edit("containerEdits.deviceNodes.0.major", "1"),
        "containerEdits.deviceNodes[0].major",
        "integer",
        id="node-major-str",
    ),
    pytest.param(
        edit("containerEdits.deviceNodes.0.minor", True),
        "containerEdits.deviceNodes[0].minor",
        "integer",
        id="node-minor-bool",
    ),
    pytest.param(
        edit("containerEdits.deviceNodes.0.permissions", "rx"),
        "containerEdits.deviceNodes[0].permissions",
        "r, w and m",
        id="node-perms",
    ),
    pytest.param(
        edit("containerEdits.deviceNodes.0.colour", "red"),
        "containerEdits.deviceNodes[0].colour",
        "unknown field",
        id="node-unknown",
    ),
    pytest.param(
        edit("containerEdits.mounts.0.hostPath", "lib/a.so"),
        "containerEdits.mounts[0].hostPath",
        "absolute",
        id="mount-host-relative",
    ),
    pytest.param(
        edit("containerEdits.mounts.0.containerPath", "-"),
        "containerEdits.mounts[0].containerPath",
        "absolute",
        id="mount-no-container-path",
    ),
    pytest.param(
        edit("containerEdits.mounts.0.options", "ro"),
        "containerEdits.mounts[0].options",
        "list of strings",
        id="mount-options-str",
    ),
    pytest.param(
        edit("containerEdits.mounts.0.readOnly", True),
        "containerEdits.mounts[0].readOnly",
        "unknown field",
        id="mount-unknown",
    ),
    pytest.param(
        edit("containerEdits.hooks.0.hookName", "prestart"),
        "containerEdits.hooks[0].hookName",
        "not one of",
        id="hook-name",
    ),
    pytest.param(
        edit("containerEdits.hooks.0.path", "hook"),
        "containerEdits.hooks[0].path",
        "absolute",
        id="hook-relative",
    ),
    pytest.param(
        edit("containerEdits.hooks.0.env", ["X"]),
        "containerEdits.hooks[0].env[0]",
        "NAME=value",
        id="hook-env",
    ),
    pytest.param(
        edit("containerEdits.hooks.0.timeout", 0),
        "containerEdits.hooks[0].timeout",
        "positive",
        id="hook-timeout",
    ),
    pytest.param(
        edit("containerEdits.hooks.0.when", 1),
        "containerEdits.hooks[0].when",
        "unknown field",
        id="hook-unknown",
    ),
]


@pytest.mark.parametrize(("doc", "where", "words"), INVALID)
def test_invalid_spec_problem_is_located(doc: dict[str, Any], where: str, words: str) -> None:
    problems = cdi_spec_problems(doc)
    assert any(p.startswith(f"{where}:") and words in p for p in problems), problems


def test_every_problem_is_reported() -> None:
    doc = good()
    doc["kind"] = "bad"
    doc["devices"].append(copy.deepcopy(doc["devices"][0]))  # duplicate name
    doc["containerEdits"]["deviceNodes"][0]["path"] = "rel"
    doc["containerEdits"]["hooks"][0]["hookName"] = "nope"
    problems = cdi_spec_problems(doc)
    assert [p.partition(":")[0] for p in problems] == [
        "kind",
        "devices[1].name",
        "containerEdits.deviceNodes[0].path",
        "containerEdits.hooks[0].hookName",
    ]
    assert "repeats devices[0]" in problems[1]


@pytest.mark.parametrize(
    "doc",
    [
        pytest.param(good(), id="base"),
        pytest.param(edit("cdiVersion", "1.1.0"), id="newest"),
        pytest.param({**edit("devices.0.name", "0"), "cdiVersion": "0.5.0"}, id="digit-name"),
        pytest.param({**edit("kind", "k8s.acme.com/claim")}, id="dots-in-vendor"),
        pytest.param(
            {
                **edit(
                    "containerEdits.mounts.0",
                    {"hostPath": "tmpfs", "containerPath": "/t", "type": "tmpfs"},
                ),
                "cdiVersion": "0.4.0",
            },
            id="tmpfs-source",
        ),
        pytest.param(edit("containerEdits.deviceNodes.0.type", ""), id="type-empty"),
    ],
)
def test_valid_specs_pass(doc: dict[str, Any]) -> None:
    assert cdi_spec_problems(doc) == []


def test_not_a_mapping() -> None:
    assert cdi_spec_problems([]) == ["<spec>: must be a mapping, got list"]  # type: ignore[arg-type]


def test_toolkit_fixture_is_valid() -> None:
    assert cdi_spec_problems(yaml.safe_load(FIXTURE.read_text())) == []


@pytest.mark.parametrize("share_id", [None, "4d1e6a70-8b2c-4a57-9f00-000000000abc"])
def test_planned_spec_passes(share_id: str | None) -> None:
    ctx = NodeContext(
        driver_name="gpu.fractional.dev",
        node_name="node-a",
        pool_name=PoolName("node-a"),
        cdi_kind=cdi_kind_for_driver("gpu.fractional.dev"),
    )
    claim = claim_from_dict(
        resource_claim(
            "ns",
            "c",
            uid="0b6e2c1d-55aa-4f7e-9c3b-1d2e3f405060",
            devices=[Allocated("gpu-0", share_id=share_id), Allocated("gpu-1", request="b")],
        )
    )
    inventory = build_inventory([{"model": "l4"}, {"model": "h100-80gb"}], "node-a")
    doc = render_spec(plan_prepare(claim, inventory, ctx).cdi_spec)
    assert cdi_spec_problems(doc) == []
