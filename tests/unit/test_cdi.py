"""CDI spec rendering (``dra_driver.core.cdi.spec``).

Rendered specs are also run through a small CDI checker written here from the
fact sheet (dra-facts.md §9) and the CDI validator (``pkg/parser``): the
module's own regexes are never reused, so a shared mistake cannot hide.
"""

from __future__ import annotations

import json
import string
from typing import Any

import pytest

from dra_driver.base.errors import ConfigError
from dra_driver.base.ids import PoolName
from dra_driver.core.allocation import claim_from_dict
from dra_driver.core.cdi import (
    CdiDevice,
    CdiSpec,
    ContainerEdits,
    DeviceNode,
    Hook,
    Mount,
    cdi_kind_for_driver,
    merge_edits,
    minimum_version,
    qualified_device_name,
    render_spec,
    transient_spec_filename,
    transient_spec_prefix,
    validate_kind,
)
from dra_driver.core.prepare import NodeContext, plan_prepare
from dra_driver.fakes.gpu import build_inventory
from dra_driver.fakes.objects import Allocated, resource_claim

KIND = "k8s.gpu.fractional.dev/claim"
UID = "0b6e2c1d-55aa-4f7e-9c3b-1d2e3f405060"

# --- a CDI checker written from the spec ------------------------------------------------

LETTERS = set(string.ascii_letters)
ALNUM = LETTERS | set(string.digits)
KNOWN_VERSIONS = [
    "0.1.0", "0.2.0", "0.3.0", "0.4.0", "0.5.0", "0.6.0", "0.7.0", "0.8.0", "1.0.0", "1.1.0",
]  # fmt: skip


def cdi_vendor_or_class_ok(part: str) -> bool:
    """Starts with a letter, ends with a letter or digit; ``_ - .`` inside."""
    if not part or part[0] not in LETTERS or part[-1] not in ALNUM:
        return False
    return all(c in ALNUM or c in "_-." for c in part)


def cdi_kind_ok(kind: str) -> bool:
    if kind.count("/") != 1:
        return False
    vendor, cls = kind.split("/")
    return cdi_vendor_or_class_ok(vendor) and cdi_vendor_or_class_ok(cls)


def cdi_device_name_ok(name: str) -> bool:
    """Starts and ends with a letter or digit; ``_ - . :`` inside."""
    if not name or name[0] not in ALNUM or name[-1] not in ALNUM:
        return False
    return all(c in ALNUM or c in "_-.:" for c in name)


def version_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in version.split("."))


def required_version(doc: dict[str, Any]) -> str:
    """The version rules of §9, applied to the rendered document."""
    need = "0.3.0"
    nodes = [
        *doc.get("containerEdits", {}).get("deviceNodes", []),
        *(n for d in doc["devices"] for n in d["containerEdits"].get("deviceNodes", [])),
    ]
    if any(d["name"][0] in string.digits for d in doc["devices"]):
        need = "0.5.0"
    if any("hostPath" in n for n in nodes):
        need = "0.5.0"
    if "annotations" in doc or "." in doc["kind"].split("/")[1]:
        need = "0.6.0"
    return need


TOP_KEYS = {"cdiVersion", "kind", "annotations", "devices", "containerEdits"}
DEVICE_KEYS = {"name", "annotations", "containerEdits"}
EDIT_KEYS = {"env", "deviceNodes", "mounts", "hooks", "additionalGids", "intelRdt", "netDevices"}
NODE_KEYS = {"path", "hostPath", "type", "major", "minor", "fileMode", "permissions", "uid", "gid"}


def check_edits(edits: dict[str, Any], where: str) -> list[str]:
    problems = [f"{where}: unknown key {k}" for k in set(edits) - EDIT_KEYS]
    for env in edits.get("env", []):
        if not isinstance(env, str) or "=" not in env:
            problems.append(f"{where}: env {env!r} is not K=V")
    for node in edits.get("deviceNodes", []):
        problems += [f"{where}: unknown device node key {k}" for k in set(node) - NODE_KEYS]
        if not str(node.get("path", "")).startswith("/"):
            problems.append(f"{where}: device node path {node.get('path')!r} is not absolute")
        if node.get("type", "c") not in {"b", "c", "u", "p"}:
            problems.append(f"{where}: device node type {node['type']!r}")
        for number in ("major", "minor"):
            if number in node and not isinstance(node[number], int):
                problems.append(f"{where}: device node {number} is not an integer")
        if set(node.get("permissions", "")) - set("rwm"):
            problems.append(f"{where}: permissions {node['permissions']!r}")
    return problems


def cdi_problems(doc: dict[str, Any]) -> list[str]:
    """Everything a CDI runtime would refuse in ``doc`` (empty when valid)."""
    problems = [f"unknown top-level key {k}" for k in set(doc) - TOP_KEYS]
    version = doc.get("cdiVersion")
    if version not in KNOWN_VERSIONS:
        return [*problems, f"unknown cdiVersion {version!r}"]
    if not cdi_kind_ok(doc.get("kind", "")):
        problems.append(f"invalid kind {doc.get('kind')!r}")
        return problems
    devices = doc.get("devices")
    if not devices:
        problems.append("a spec needs at least one device")
        return problems
    names = [d.get("name", "") for d in devices]
    if len(set(names)) != len(names):
        problems.append(f"duplicate device names {names}")
    for device in devices:
        problems += [f"device: unknown key {k}" for k in set(device) - DEVICE_KEYS]
        if not cdi_device_name_ok(device.get("name", "")):
            problems.append(f"invalid device name {device.get('name')!r}")
        problems += check_edits(device.get("containerEdits", {}), f"device {device.get('name')}")
    problems += check_edits(doc.get("containerEdits", {}), "spec")
    if not problems and version_tuple(version) < version_tuple(required_version(doc)):
        problems.append(f"cdiVersion {version} is below {required_version(doc)}")
    return problems


def test_checker_catches_what_it_should() -> None:
    """The checker is only worth something if it rejects bad specs."""
    good = {
        "cdiVersion": "0.3.0",
        "kind": "acme.com/gpu",
        "devices": [{"name": "a0", "containerEdits": {"deviceNodes": [{"path": "/dev/x"}]}}],
    }
    assert cdi_problems(good) == []
    bad: list[dict[str, Any]] = [
        {**good, "cdiVersion": "9.9.9"},
        {**good, "kind": "acme.com"},
        {**good, "kind": "acme-/gpu"},
        {**good, "devices": []},
        {**good, "devices": [{"name": "-a", "containerEdits": {}}]},
        {**good, "devices": [{"name": "0a", "containerEdits": {}}]},  # needs 0.5.0
        {**good, "kind": "acme/gpu.v2"},  # needs 0.6.0
        {**good, "extra": 1},
        {**good, "containerEdits": {"deviceNodes": [{"path": "dev/x"}]}},
    ]
    for doc in bad:
        assert cdi_problems(doc), doc


# --- minimum_version ---------------------------------------------------------------------


def node(path: str = "/dev/nvidia0", host_path: str | None = None) -> DeviceNode:
    return DeviceNode(path, major=195, minor=0, host_path=host_path)


def spec(
    *,
    kind: str = "acme.com/gpu",
    name: str = "gpu0",
    device_node: DeviceNode | None = None,
    common: tuple[DeviceNode, ...] = (),
    annotations: dict[str, str] | None = None,
) -> CdiSpec:
    return CdiSpec(
        kind=kind,
        devices=(CdiDevice(name, ContainerEdits(device_nodes=(device_node or node(),))),),
        common_edits=ContainerEdits(device_nodes=common),
        annotations=annotations or {},
    )


VERSION_CASES = [
    pytest.param(spec(), "0.3.0", id="plain"),
    pytest.param(spec(name="0gpu"), "0.5.0", id="name-starts-with-digit"),
    pytest.param(spec(device_node=node(host_path="/dev/nvidia3")), "0.5.0", id="host-path"),
    pytest.param(spec(common=(node(host_path="/dev/x"),)), "0.5.0", id="host-path-spec-level"),
    pytest.param(spec(annotations={"a": "b"}), "0.6.0", id="annotations"),
    pytest.param(spec(kind="acme.com/gpu.v2"), "0.6.0", id="dot-in-class"),
    pytest.param(spec(kind="k8s.acme.com/claim"), "0.3.0", id="dots-in-vendor-are-fine"),
    pytest.param(spec(name="0gpu", annotations={"a": "b"}), "0.6.0", id="highest-wins"),
]


@pytest.mark.parametrize(("cdi_spec", "version"), VERSION_CASES)
def test_minimum_version(cdi_spec: CdiSpec, version: str) -> None:
    assert minimum_version(cdi_spec) == version
    doc = render_spec(cdi_spec)
    assert doc["cdiVersion"] == version
    assert cdi_problems(doc) == []


# --- render_spec -------------------------------------------------------------------------


def test_render_spec_shape() -> None:
    cdi_spec = CdiSpec(
        kind=KIND,
        devices=(
            CdiDevice(
                f"{UID}-gpu-0",
                ContainerEdits(
                    device_nodes=(DeviceNode("/dev/nvidia3", major=195, minor=3),),
                    env=("A=1",),
                ),
            ),
        ),
        common_edits=ContainerEdits(
            device_nodes=(DeviceNode("/dev/nvidiactl", major=195, minor=255, permissions="rw"),)
        ),
    )
    assert render_spec(cdi_spec) == {
        "cdiVersion": "0.5.0",  # the UID starts with a digit
        "kind": KIND,
        "devices": [
            {
                "name": f"{UID}-gpu-0",
                "containerEdits": {
                    "env": ["A=1"],
                    "deviceNodes": [
                        {"path": "/dev/nvidia3", "type": "c", "major": 195, "minor": 3}
                    ],
                },
            }
        ],
        "containerEdits": {
            "deviceNodes": [
                {
                    "path": "/dev/nvidiactl",
                    "type": "c",
                    "major": 195,
                    "minor": 255,
                    "permissions": "rw",
                }
            ]
        },
    }


def test_render_spec_omits_empty_spec_level_edits() -> None:
    doc = render_spec(spec())
    assert "containerEdits" not in doc
    assert "annotations" not in doc
    assert set(doc) == {"cdiVersion", "kind", "devices"}


def test_render_spec_host_path_and_annotations() -> None:
    doc = render_spec(spec(device_node=node(host_path="/dev/nvidia7"), annotations={"k": "v"}))
    assert doc["annotations"] == {"k": "v"}
    assert doc["devices"][0]["containerEdits"]["deviceNodes"][0]["hostPath"] == "/dev/nvidia7"
    # JSON is what the store writes; the document must survive it unchanged.
    assert json.loads(json.dumps(doc)) == doc


@pytest.mark.parametrize(
    ("uid", "share_id"),
    [
        pytest.param(UID, None, id="uid-starts-with-digit"),
        pytest.param("f" + UID[1:], None, id="uid-starts-with-letter"),
        pytest.param(UID, "4d1e6a70-8b2c-4a57-9f00-000000000abc", id="with-share"),
    ],
)
def test_planned_spec_is_valid_cdi(uid: str, share_id: str | None) -> None:
    """A spec as the driver really makes it passes the independent checker."""
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
            uid=uid,
            devices=[Allocated("gpu-0", share_id=share_id), Allocated("gpu-1", request="b")],
        )
    )
    inventory = build_inventory([{"model": "l4"}, {"model": "l4"}], "node-a")
    plan = plan_prepare(claim, inventory, ctx)
    doc = render_spec(plan.cdi_spec)
    assert cdi_problems(doc) == []
    for device in plan.devices:
        (qualified,) = device.cdi_device_ids
        kind, _, name = qualified.partition("=")
        assert cdi_kind_ok(kind) and kind == doc["kind"]
        assert name in [d["name"] for d in doc["devices"]]


# --- names -------------------------------------------------------------------------------


def test_kind_for_driver() -> None:
    assert cdi_kind_for_driver("gpu.fractional.dev") == KIND
    assert cdi_kind_ok(KIND)


def test_transient_spec_filename() -> None:
    assert transient_spec_filename(KIND, UID) == f"k8s.gpu.fractional.dev-claim_{UID}.json"
    assert transient_spec_filename(KIND, "a/b") == "k8s.gpu.fractional.dev-claim_a_b.json"
    assert transient_spec_filename(KIND, UID).startswith(transient_spec_prefix(KIND))


@pytest.mark.parametrize("name", ["gpu-0", "0gpu", f"{UID}-gpu-0", "a", "a:b.c_d-e", "Z9"], ids=str)
def test_qualified_name(name: str) -> None:
    assert qualified_device_name(KIND, name) == f"{KIND}={name}"
    assert cdi_device_name_ok(name)


@pytest.mark.parametrize(
    "name",
    ["", "-gpu", "gpu-", "gpu 0", "gpu/0", "gpu=0", "gpu:", ".gpu", "gpü"],
    ids=["empty", "leading-dash", "trailing-dash", "space", "slash", "equals", "trailing-colon",
         "leading-dot", "non-ascii"],
)  # fmt: skip
def test_invalid_device_name(name: str) -> None:
    assert not cdi_device_name_ok(name)
    with pytest.raises(ValueError, match="invalid CDI device name"):
        qualified_device_name(KIND, name)


@pytest.mark.parametrize(
    "kind",
    ["acme.com", "acme.com/", "/claim", "1acme/claim", "acme/1claim", "ac me/claim",
     "acme/cl/aim", "acme/cla=im", "äcme/claim"],
    ids=["no-slash", "no-class", "no-vendor", "vendor-digit-first", "class-digit-first",
         "space", "two-slashes", "equals", "non-ascii"],
)  # fmt: skip
def test_invalid_kind(kind: str) -> None:
    assert not cdi_kind_ok(kind)
    with pytest.raises(ConfigError, match="invalid CDI kind"):
        validate_kind(kind)


def test_invalid_driver_name_is_config_error() -> None:
    with pytest.raises(ConfigError, match="invalid CDI kind"):
        cdi_kind_for_driver("gpu fractional")


@pytest.mark.parametrize("kind", ["k8s.gpu-/claim", "acme/claim."], ids=["vendor", "class"])
def test_kind_must_end_alphanumeric(kind: str) -> None:
    assert not cdi_kind_ok(kind)
    with pytest.raises(ConfigError):
        validate_kind(kind)


# --- mounts, hooks, additional gids ------------------------------------------------------

LIBCUDA = "/usr/lib/x86_64-linux-gnu/libcuda.so.580.65.06"
RO = ("ro", "nosuid", "nodev", "bind")
LDCACHE = Hook(
    "createContainer",
    "/usr/bin/nvidia-cdi-hook",
    ("nvidia-cdi-hook", "update-ldcache", "--folder", "/usr/lib/x86_64-linux-gnu"),
)


def edits_spec(edits: ContainerEdits) -> CdiSpec:
    return CdiSpec(kind="acme.com/gpu", devices=(CdiDevice("gpu0", edits),))


def test_mount_and_hook_render() -> None:
    assert Mount(LIBCUDA, LIBCUDA, RO).render() == {
        "hostPath": LIBCUDA,
        "containerPath": LIBCUDA,
        "options": ["ro", "nosuid", "nodev", "bind"],
    }
    assert Mount("tmpfs", "/scratch", type="tmpfs").render() == {
        "hostPath": "tmpfs",
        "containerPath": "/scratch",
        "type": "tmpfs",
    }
    assert LDCACHE.render() == {
        "hookName": "createContainer",
        "path": "/usr/bin/nvidia-cdi-hook",
        "args": ["nvidia-cdi-hook", "update-ldcache", "--folder", "/usr/lib/x86_64-linux-gnu"],
    }
    assert Hook("poststop", "/bin/x", env=("A=1",), timeout=5).render() == {
        "hookName": "poststop",
        "path": "/bin/x",
        "env": ["A=1"],
        "timeout": 5,
    }


def test_hook_name_is_checked() -> None:
    with pytest.raises(ValueError, match="invalid CDI hook name 'prestart'"):
        Hook("prestart", "/bin/x")


def test_device_node_optional_fields_render() -> None:
    node = DeviceNode("/dev/x", type="", file_mode=0o666, uid=0, gid=44)
    assert node.render() == {"path": "/dev/x", "fileMode": 0o666, "uid": 0, "gid": 44}


def test_edits_render_all_parts() -> None:
    edits = ContainerEdits(
        device_nodes=(node(),),
        env=("A=1",),
        mounts=(Mount(LIBCUDA, LIBCUDA, RO),),
        hooks=(LDCACHE,),
        additional_gids=(44,),
    )
    doc = render_spec(edits_spec(edits))
    assert doc["devices"][0]["containerEdits"] == {
        "env": ["A=1"],
        "deviceNodes": [{"path": "/dev/nvidia0", "type": "c", "major": 195, "minor": 0}],
        "mounts": [Mount(LIBCUDA, LIBCUDA, RO).render()],
        "hooks": [LDCACHE.render()],
        "additionalGids": [44],
    }
    assert doc["cdiVersion"] == "0.7.0"
    assert cdi_problems(doc) == []
    assert not edits.is_empty() and ContainerEdits().is_empty()


@pytest.mark.parametrize(
    ("edits", "version"),
    [
        pytest.param(ContainerEdits((node(),), mounts=(Mount(LIBCUDA, LIBCUDA, RO),)), "0.3.0",
                     id="mount-without-type"),
        pytest.param(ContainerEdits((node(),), hooks=(LDCACHE,)), "0.3.0", id="hook"),
        pytest.param(ContainerEdits((node(),), mounts=(Mount(LIBCUDA, LIBCUDA, RO, "bind"),)),
                     "0.4.0", id="mount-type"),
        pytest.param(ContainerEdits((node(host_path="/dev/x"),),
                                    mounts=(Mount(LIBCUDA, LIBCUDA, RO, "bind"),)),
                     "0.5.0", id="host-path-beats-mount-type"),
        pytest.param(ContainerEdits((node(),), additional_gids=(44,)), "0.7.0", id="gids"),
    ],
)  # fmt: skip
def test_minimum_version_for_mounts_hooks_gids(edits: ContainerEdits, version: str) -> None:
    assert minimum_version(edits_spec(edits)) == version
    common = CdiSpec("acme.com/gpu", (CdiDevice("gpu0", ContainerEdits((node(),))),), edits)
    assert minimum_version(common) == version  # spec-level edits count the same


def test_merge_edits_once_each_first_wins_order_kept() -> None:
    ctl_plan = DeviceNode("/dev/nvidiactl", major=195, minor=255)
    ctl_toolkit = DeviceNode("/dev/nvidiactl", type="")
    uvm = DeviceNode("/dev/nvidia-uvm", type="")
    lib = Mount(LIBCUDA, LIBCUDA, RO)
    lib_other_host = Mount("/run/nvidia/driver" + LIBCUDA, LIBCUDA, RO)
    smi = Mount("/usr/bin/nvidia-smi", "/usr/bin/nvidia-smi", RO)
    other_hook = Hook("createContainer", "/bin/other")
    a = ContainerEdits((ctl_plan,), ("A=1", "B=2"), (lib,), (LDCACHE,), (44,))
    b = ContainerEdits((ctl_toolkit, uvm), ("A=9", "C=3"), (lib_other_host, smi),
                       (other_hook, LDCACHE), (44, 45))  # fmt: skip
    assert merge_edits(a, b) == ContainerEdits(
        device_nodes=(ctl_plan, uvm),
        env=("A=1", "B=2", "C=3"),
        mounts=(lib, smi),
        hooks=(LDCACHE, other_hook),
        additional_gids=(44, 45),
    )
    assert merge_edits() == ContainerEdits()
    assert merge_edits(a) == a
    assert merge_edits(a, a) == a
